"""`hfzoo.study.arguments`: the recipes' arguments of a run.

A study file's `pretrain_args: {optim: muon}` reaches its pretraining runs: they build Muon + AdamW; the study's
`eval_seed` fixes the held-out blocks' corruption.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from transformers import AutoModelForSeq2SeqLM

from hfzoo.pretraining import parse_pretrain_args
from hfzoo.study.arguments import pretrain_argv
from hfzoo.study.configs import build_variant_config
from hfzoo.study.settings import load_settings
from hfzoo.training.arguments import muon_settings
from hfzoo.training.optimization import MuonWithAdamW, create_optimizer

DEFAULT_STUDY = Path(__file__).resolve().parents[2] / "recipes" / "studies" / "narang_small.yaml"
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16,
        "num_hidden_layers": 2, "num_decoder_layers": 2}  # fmt: skip


def test_pretrain_args_optim_muon_builds_muon_in_every_run(tmp_path):
    values = yaml.safe_load(DEFAULT_STUDY.read_text())
    values.update(config_overrides=TINY, pretrain_args={"optim": "muon", "muon_momentum": 0.9})
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(values))
    settings = load_settings(study)
    argv = pretrain_argv(settings, "tokenizer", tmp_path / "config.json", 0, tmp_path / "run", num_processes=1)
    args = parse_pretrain_args(argv)
    assert (args.optim, args.muon_momentum) == ("muon", 0.9)
    tokens = {"vocab_size": 64, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None}
    model = AutoModelForSeq2SeqLM.from_config(build_variant_config(settings, settings.variants[0], tokens))
    optimizer = create_optimizer(
        model, learning_rate=args.learning_rate, weight_decay=args.weight_decay, muon=muon_settings(args)
    )
    assert isinstance(optimizer, MuonWithAdamW)
    (group,) = optimizer.muon.param_groups
    assert group["momentum"] == 0.9 and group["lr"] == 0.02
    # encoder: q, k, v, o + feed-forward; decoder: also cross-attention's q, k, v, o (2 layers each)
    layers_linear = sum(1 for n, _ in model.named_parameters() if ".layers." in n and n.endswith("proj.weight"))
    assert len(group["params"]) == layers_linear > 0


def test_eval_seed_fixes_the_validation_corruption(inputs, tmp_path):
    """`--eval_seed` (the study's `eval_seed`) decides the held-out blocks' span corruption, not `--seed`."""
    from hfzoo.pretraining.loop import main as pretrain

    def init_loss(*extra: str) -> float:
        out = tmp_path / "-".join(extra)
        pretrain(["--objective", "span", "--train_file", inputs["train"], "--tokenizer_name", inputs["tokenizer"],
                  "--config_name", "encoder-decoder-tiny", "--config_overrides", "hidden_size=32,intermediate_size=64",
                  "--block_size", "32", "--max_train_steps", "1", "--max_eval_samples", "8",
                  "--validation_split_percentage", "25", "--output_dir", str(out), *extra])  # fmt: skip
        return json.loads((out / "all_results.json").read_text())["init_eval_loss"]

    default = init_loss("--seed", "3")
    assert init_loss("--seed", "3", "--eval_seed", "3") == default  # default: --seed
    assert init_loss("--seed", "3", "--eval_seed", "4") != default  # other corruption of the same blocks
