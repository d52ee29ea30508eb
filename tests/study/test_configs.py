"""`hfzoo.study.configs`: the rows in every family, and refusals a study user can act on."""

from __future__ import annotations

import json

import pytest
from helpers.study import expect_refusal, tiny_study

from hfzoo.study.protocol import NO_PRETRAINING
from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_the_rows_run_in_the_decoder_and_encoder_families(family, inputs, tmp_path):
    """`--family`: every row pretrains as one stack of the base's width with the layers of both its stacks (causal LM
    for the decoder, masked LM for the encoder) with the family's own tokenizer, then finetunes; the report says so."""
    from transformers import AutoConfig, AutoTokenizer

    from hfzoo.models.flops import count_training_flops
    from hfzoo.study.protocol import FAMILIES
    from hfzoo.tokenization import FAMILY_SPECIAL_TOKENS

    variants = ["Vanilla Transformer", "All together"]
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=variants, seeds=[0], tokenizer_name=None,
                       tokenizer_train_file=[inputs["train"]], tokenizer_vocab_size=384, glue_tasks=["sst2"])  # fmt: skip
    out = tmp_path / "out"
    records = main(["--study", str(study), "--output_dir", str(out), "--family", family])
    assert [r["variant"] for r in records] == [*variants, NO_PRETRAINING]
    assert json.loads((out / "study.json").read_text())["settings"]["family"] == family

    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")  # the study's own, with the family's tokens
    for role, token in FAMILY_SPECIAL_TOKENS[family]["special_tokens"].items():
        assert getattr(tokenizer, role) == token
    architecture = {"decoder": "HfzooDecoderForCausalLM", "encoder": "HfzooEncoderForMaskedLM"}[family]
    for record in records:
        folder = run_dir(out, record["variant"], 0)
        model_dir = folder / ("init" if record["variant"] == NO_PRETRAINING else "pretrain")
        config = AutoConfig.from_pretrained(model_dir)
        assert config.model_type == FAMILIES[family].model_type and config.num_hidden_layers == 4  # 2 + 2
        assert config.architectures == [architecture] and config.vocab_size == len(tokenizer)
        assert 0 <= record["glue"]["sst2"]["score"] <= 100
        if record["variant"] == NO_PRETRAINING:
            continue
        assert record["final_loss"] < record["init_loss"]
        assert record["flops_per_token"] == count_training_flops(config, 32).per_token  # one stack, 32 tokens
        if record["variant"] == "All together":
            assert config.qk_norm == "rms_norm" and config.unet_skips and config.value_residual
    assert f"Every run: {FAMILIES[family].loss} pretraining of the {family}" in (out / "results.md").read_text()


def test_unknown_rows_name_the_closest_and_row_refusals_advise_what_a_study_can_change(inputs, tmp_path, capsys):
    study = tiny_study(inputs, tmp_path / "s.yaml", tokenizer_name=None, variants=["+ Factorized & shared embedding"])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out")], capsys)
    assert "did you mean '+ Factorized & shared embeddings' or 'Factorized & shared embeddings'" in message, message
    assert "Vanilla Transformer" not in message and len(message) < 400, message
    study = tiny_study(inputs, tmp_path / "t.yaml", tokenizer_name=None, variants=["Transparent attention"])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--family", "encoder"],
                             capsys)  # fmt: skip
    assert "transparent_attention=False" not in message, message
    assert message.endswith("leave the row out of variants, or study it with family 'encoder-decoder'"), message
    assert not (tmp_path / "out").exists()
