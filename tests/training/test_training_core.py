"""The training core shared by the recipes: the objective registry and the optimizer's weight-decay rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.glue_files import write_glue_dir
from transformers import AutoModel

import hfzoo  # noqa: F401
from hfzoo.finetuning.glue import parse_glue_args, prepare_glue
from hfzoo.models.presets import build_config
from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import prepare
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training.objectives import OBJECTIVES, get_objective
from hfzoo.training.optimization import no_weight_decay, weight_decay_groups

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = "hidden_size=32,intermediate_size=64,num_attention_heads=4,num_hidden_layers=2,max_position_embeddings=64"
TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40


def test_no_objective_branch_outside_the_registry():
    """The loop asks the registry; no module of hfzoo compares an objective's name."""
    offenders = [
        f"{path.relative_to(REPO_ROOT)}:{n}"
        for path in (REPO_ROOT / "hfzoo").rglob("*.py")
        if path.name != "objectives.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"objective\s*[!=]=", line)
    ]
    assert offenders == []


def test_objective_registry_counts_the_predicted_tokens():
    labels = torch.tensor([[5, 6, -100, 7], [-100, 8, 9, 10]])
    batch = {"labels": labels}
    assert int(OBJECTIVES["clm"].count_predicted_tokens(batch)) == 5  # the first label of a row is never predicted
    assert int(OBJECTIVES["mlm"].count_predicted_tokens(batch)) == 6
    assert int(OBJECTIVES["span"].count_predicted_tokens(batch)) == 6
    assert [name for name, o in OBJECTIVES.items() if o.can_generate] == ["clm", "span"]
    assert [name for name, o in OBJECTIVES.items() if o.labels_in_blocks] == ["clm"]
    with pytest.raises(ValueError, match=r"unknown objective 'xlm'; choose one of \['clm', 'mlm', 'span'\]"):
        get_objective("xlm")


@pytest.mark.parametrize("family", ["decoder-tiny", "encoder-tiny", "encoder-decoder-tiny"])
def test_each_family_takes_exactly_its_objective(family):
    config = build_config(family, TINY)
    expected = {"decoder-tiny": "clm", "encoder-tiny": "mlm", "encoder-decoder-tiny": "span"}[family]
    assert [name for name, o in OBJECTIVES.items() if o.supports(config)] == [expected]


def _groups_by_id(param_groups) -> dict[int, float]:
    return {id(p): group["weight_decay"] for group in param_groups for p in group["params"]}


@pytest.mark.parametrize(
    "scheme", [{"rezero": True}, {"fixup_init": True, "norm_type": "none"}], ids=["rezero", "fixup"]
)
def test_weight_decay_groups_exempt_vectors_scalars_and_norms(scheme):
    config = build_config("decoder-tiny", TINY, **scheme)
    model = AutoModel.from_config(config)
    decay = _groups_by_id(weight_decay_groups(model, 0.1))
    named = dict(model.named_parameters())
    assert set(decay) == {id(p) for p in named.values()}  # every trainable parameter, shared ones once
    for name, param in named.items():
        expected = 0.0 if param.ndim < 2 else 0.1
        assert decay[id(param)] == expected, name
    scalars = [n for n in named if re.search(r"rezero_alpha|fixup_", n)]
    assert scalars and all(decay[id(named[n])] == 0.0 for n in scalars)
    # A norm module's parameters are exempt whatever their shape (a LayerNorm over a 2-D feature shape).
    norm = torch.nn.LayerNorm([4, 8])
    assert norm.weight.ndim == 2 and no_weight_decay(norm.weight, norm)
    linear = torch.nn.Linear(8, 4)
    assert not no_weight_decay(linear.weight, linear) and no_weight_decay(linear.bias, linear)


def _assert_rezero_and_layer_norm_undecayed(model, optimizer, weight_decay: float) -> None:
    decay = _groups_by_id(optimizer.param_groups)
    named = dict(model.named_parameters())
    alphas = [p for n, p in named.items() if n.endswith("rezero_alpha")]
    norms = [m.weight for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    projections = [p for n, p in named.items() if n.endswith("q_proj.weight")]
    assert alphas and norms and projections
    assert all(decay[id(p)] == 0.0 for p in alphas + norms)
    assert all(decay[id(p)] == weight_decay for p in projections)


@pytest.fixture(scope="module")
def encoder_tokenizer():
    return train_bpe_tokenizer([[TEXT]], vocab_size=280, model_family="encoder")


def test_pretraining_recipe_does_not_decay_rezero_alpha_or_layer_norm(tmp_path, encoder_tokenizer):
    encoder_tokenizer.save_pretrained(tmp_path / "tok")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": f"{i}: {TEXT}"}) + "\n" for i in range(10)))
    args = parse_pretrain_args(
        ["--objective", "mlm", "--train_file", str(tmp_path / "train.jsonl"), "--tokenizer_name", str(tmp_path / "tok"),
         "--config_name", "encoder-tiny", "--config_overrides", f"{TINY},rezero=true,embedding_norm=true",
         "--block_size", "16", "--per_device_train_batch_size", "2", "--weight_decay", "0.01",
         "--validation_split_percentage", "20", "--output_dir", str(tmp_path / "out")]
    )  # fmt: skip
    run = prepare(args)
    _assert_rezero_and_layer_norm_undecayed(run.accelerator.unwrap_model(run.model), run.optimizer, 0.01)


def test_glue_recipe_does_not_decay_rezero_alpha_or_layer_norm(tmp_path, encoder_tokenizer):
    config = build_config(
        "encoder-tiny", f"{TINY},rezero=true,embedding_norm=true", vocab_size=len(encoder_tokenizer),
        pad_token_id=encoder_tokenizer.pad_token_id,
    )  # fmt: skip
    AutoModel.from_config(config).save_pretrained(tmp_path / "ckpt")
    encoder_tokenizer.save_pretrained(tmp_path / "ckpt")
    args = parse_glue_args(
        ["--task_name", "mrpc", "--model_name_or_path", str(tmp_path / "ckpt"),
         "--data_dir", str(write_glue_dir(tmp_path / "glue", "mrpc")), "--peft", "none", "--weight_decay", "0.01",
         "--max_length", "32", "--output_dir", str(tmp_path / "out")]
    )  # fmt: skip
    run = prepare_glue(args)
    _assert_rezero_and_layer_norm_undecayed(run.accelerator.unwrap_model(run.model), run.optimizer, 0.01)


@pytest.mark.parametrize(
    ("overrides", "field", "expected"),
    [
        ("position_embedding_type=none", "position_embedding_type", "none"),  # "none" is a choice of a str field
        ("norm_type=none", "norm_type", "none"),
        ("embedding_size=none", "embedding_size", None),  # an `int | None` field: None
        ("adaptive_input_cutoffs=null", "adaptive_input_cutoffs", None),
        ("adaptive_input_cutoffs=[100,200]", "adaptive_input_cutoffs", [100, 200]),
    ],
)
def test_config_overrides_take_none_only_where_a_field_may_be_none(overrides, field, expected):
    """`--config_overrides` strings become the field's type; "none" is None only for fields that may be None."""
    config = build_config("decoder-tiny", overrides + ",vocab_size=512")
    assert getattr(config, field) == expected


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--hub_token", "hf_x", "--push_to_hub"], ["--hub_token", "***", "--push_to_hub"]),
        (["--hub_token=hf_x", "--seed", "1"], ["--hub_token=***", "--seed", "1"]),
        (
            ["--hub_tok", "hf_x", "--hub_model_id", "me/x"],
            ["--hub_tok", "***", "--hub_model_id", "me/x"],
        ),  # abbreviated
        (
            ["--wandb_api_key", "k", "--output_dir", "hub_token"],
            ["--wandb_api_key", "***", "--output_dir", "hub_token"],
        ),
        (["--hub_model_id", "me/x", "--seed", "1"], ["--hub_model_id", "me/x", "--seed", "1"]),
        (["--tokenizer_name", "tok", "--max_new_tokens", "5"], ["--tokenizer_name", "tok", "--max_new_tokens", "5"]),
    ],
)
def test_a_printed_command_line_hides_secret_values_only(argv, shown):
    from hfzoo.training.arguments import secret_free_command

    assert secret_free_command(argv) == shown


def test_tracker_config_and_public_arguments_leave_secrets_out():
    import argparse

    from hfzoo.hub import public_arguments
    from hfzoo.training.arguments import tracker_config

    args = argparse.Namespace(hub_token="hf_x", HUB_TOKEN="hf_y", wandb_api_key="k", seed=1, lr=1e-3, output_dir="o",
                              push_to_hub=True, report_to=None, tasks=["rte"], tokenizer_name="tok",
                              max_new_tokens=5)  # fmt: skip
    assert public_arguments(args) == {"seed": 1, "lr": 1e-3, "output_dir": "o", "push_to_hub": True, "report_to": None,
                                      "tasks": ["rte"], "tokenizer_name": "tok", "max_new_tokens": 5}  # fmt: skip
    assert tracker_config(args) == {"seed": 1, "lr": 1e-3, "output_dir": "o", "push_to_hub": True,
                                    "tokenizer_name": "tok", "max_new_tokens": 5}  # fmt: skip
    assert public_arguments(None) == {} and public_arguments({"hub_token": "x"}) == {}


def test_secret_arguments_are_those_named_for_a_secret():
    from hfzoo.hub import is_secret_argument

    secret = ["hub_token", "HUB_TOKEN", "--hub_token", "token", "wandb_api_key", "password", "client_secret"]
    public = ["max_new_tokens", "tokenizer_name", "num_virtual_tokens", "train_tokens_seen", "token_type_ids",
              "mask_token", "secretary", "tokens_per_step"]  # fmt: skip
    assert [name for name in secret if not is_secret_argument(name)] == []
    assert [name for name in public if is_secret_argument(name)] == []
