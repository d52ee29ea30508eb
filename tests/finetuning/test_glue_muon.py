"""`--optim muon` in GLUE finetuning: full finetuning only; the classifier head and embeddings stay with AdamW."""

from __future__ import annotations

import re

import pytest
from helpers.glue_files import write_glue_dir
from transformers import AutoModel

from hfzoo.finetuning.glue import parse_glue_args, prepare_glue
from hfzoo.models.presets import build_config
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training.optimization import MuonWithAdamW

TINY = "hidden_size=32,intermediate_size=64,num_attention_heads=4,num_hidden_layers=2,max_position_embeddings=64"
TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue_muon")
    tokenizer = train_bpe_tokenizer([[TEXT]], vocab_size=280, model_family="encoder")
    config = build_config("encoder-tiny", TINY, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    AutoModel.from_config(config).save_pretrained(root / "ckpt")
    tokenizer.save_pretrained(root / "ckpt")
    return root


def _argv(root, *extra):
    return ["--task_name", "mrpc", "--model_name_or_path", str(root / "ckpt"),
            "--data_dir", str(write_glue_dir(root / "glue", "mrpc")), "--max_length", "32",
            "--output_dir", str(root / "out"), *extra]  # fmt: skip


def test_full_finetuning_with_muon_keeps_the_head_and_embeddings_on_adamw(checkpoint):
    args = parse_glue_args(_argv(checkpoint, "--peft", "none", "--optim", "muon", "--muon_momentum", "0.9"))
    run = prepare_glue(args)
    optimizer = run.optimizer.optimizer
    assert isinstance(optimizer, MuonWithAdamW)
    model = run.accelerator.unwrap_model(run.model)
    named = dict(model.named_parameters())
    muon = {id(p) for p in optimizer.muon.param_groups[0]["params"]}
    assert optimizer.muon.param_groups[0]["momentum"] == 0.9
    hidden = re.compile(r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.\w+_proj)\.weight$")
    assert {n for n, p in named.items() if id(p) in muon} == {n for n in named if hidden.search(n)}
    adamw = {id(p) for g in optimizer.adamw.param_groups for p in g["params"]}
    assert adamw == {id(p) for p in named.values()} - muon  # the classifier and embeddings included
    assert any("classifier" in n or "score" in n for n, p in named.items() if id(p) in adamw)


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--optim", "muon"], "--optim muon needs --peft none (full finetuning), got --peft lora"),
        (
            ["--optim", "muon", "--peft", "prefix"],
            "--optim muon needs --peft none (full finetuning), got --peft prefix",
        ),
        (["--peft", "none", "--muon_learning_rate", "0.01"], "--muon_learning_rate 0.01 needs --optim muon"),
        (["--peft", "none", "--optim", "muon", "--muon_momentum", "1.2"], "--muon_momentum must be in [0, 1), got 1.2"),
    ],
    ids=["lora", "prefix", "no-muon", "momentum"],
)
def test_muon_refusals(extra, expected, checkpoint, capsys):
    with pytest.raises(SystemExit):
        parse_glue_args(_argv(checkpoint, *extra))
    message = capsys.readouterr().err.strip()
    assert expected in message and "\n" not in message
