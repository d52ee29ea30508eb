"""sentence-transformers models through hfzoo: conversion keeps the modules, and the embeddings stay the same.

all-MiniLM-L6-v2 (the real checkpoint: BERT, mean pooling, normalisation, 256 tokens at most) converted to an hfzoo
encoder and back must give `SentenceTransformer` the embeddings of the original; an hfzoo encoder saved by
sentence-transformers with its own pooling converts to BERT with that pooling, and a Qwen3 one with last-token pooling
(Qwen3-Embedding's shape) to an hfzoo decoder; a converted model trains with `SentenceTransformerTrainer`; a hub id's modules are fetched
through `huggingface_hub` (here from a local cache, offline); the remote-code export of the converted model gives
the same embeddings in a clean environment without hfzoo.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from helpers import clean_env
from helpers.paths import minilm_dir
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Config, Qwen3ForCausalLM

from hfzoo import HfzooEncoderModel
from hfzoo.convert import convert_checkpoint, hfzoo_config_from_bert
from hfzoo.export import export_for_remote_code
from hfzoo.hub import copy_sentence_transformers_files
from hfzoo.tokenization import train_bpe_tokenizer

SENTENCES = [
    "A man is eating food.",
    "The new movie is awesome, and I loved every minute of it!",
    "hello",
    "It was the best of times, it was the worst of times, " * 40,  # past the model's 256 tokens
]


def embed(folder: Path) -> tuple[torch.Tensor, SentenceTransformer]:
    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(SENTENCES, convert_to_tensor=True, batch_size=2), model


def module_types(model: SentenceTransformer) -> list[str]:
    return [type(module).__name__ for module in model]


@pytest.mark.compat
def test_a_converted_sentence_transformers_model_computes_the_same_embeddings(tmp_path):
    source = minilm_dir()
    expected, original = embed(source)
    assert original.max_seq_length == 256 and len(original.tokenizer(SENTENCES[-1])["input_ids"]) > 256
    hfzoo_folder = convert_checkpoint(source, tmp_path / "hfzoo")
    actual, converted = embed(hfzoo_folder)
    assert isinstance(converted[0].model, HfzooEncoderModel)
    assert module_types(converted) == module_types(original) == ["Transformer", "Pooling", "Normalize"]
    assert converted.max_seq_length == 256
    assert (actual - expected).abs().max() <= 1e-5
    # and back to BERT, from the hfzoo folder
    bert_folder = convert_checkpoint(hfzoo_folder, tmp_path / "bert")
    again, back = embed(bert_folder)
    assert isinstance(back[0].model, BertModel)
    assert module_types(back) == module_types(original) and back.max_seq_length == 256
    assert (again - expected).abs().max() <= 1e-5


def test_a_converted_model_finetunes_with_the_sentence_transformers_trainer_and_reloads(tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(str(convert_checkpoint(minilm_dir(), tmp_path / "hfzoo")), device="cpu")
    pairs = {
        "anchor": ["A man eats.", "A dog runs.", "It rains.", "The sun shines."] * 4,
        "positive": ["Someone has a meal.", "An animal is running.", "Water falls.", "It is sunny."] * 4,
    }
    before = model.encode(SENTENCES, convert_to_tensor=True)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-4,
        report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
    )  # fmt: skip
    loss = MultipleNegativesRankingLoss(model)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_dict(pairs), loss=loss)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    after = model.encode(SENTENCES, convert_to_tensor=True)
    assert (after - before).abs().max() > 1e-3  # the hfzoo encoder's weights were trained
    model.save(str(tmp_path / "saved"))
    reloaded = SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert isinstance(reloaded[0].model, HfzooEncoderModel)
    assert (reloaded.encode(SENTENCES, convert_to_tensor=True) - after).abs().max() <= 1e-6


def test_a_decoder_sentence_transformers_model_converts_from_qwen3_with_its_last_token_pooling(tmp_path):
    """A Qwen3-Embedding-shaped model (a Qwen3 decoder, last-token pooling, normalisation) converted to hfzoo."""
    text = "The quick brown fox jumps over the lazy dog. " * 20 + "It was a dark and stormy night; the rain fell. " * 20
    tokenizer = train_bpe_tokenizer([text], vocab_size=300, min_frequency=1, model_family="decoder")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "qwen3")
    tokenizer.save_pretrained(tmp_path / "qwen3")
    transformer = Transformer(str(tmp_path / "qwen3"), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="lasttoken"), Normalize()], device="cpu")
    sentences = ["The quick brown fox.", "It was a dark and stormy night; the rain fell on the lazy dog.", "rain"]
    expected = model.encode(sentences, convert_to_tensor=True)
    model.save(str(tmp_path / "saved"))
    converted = SentenceTransformer(str(convert_checkpoint(tmp_path / "saved", tmp_path / "hfzoo")), device="cpu")
    assert type(converted[0].model).__name__ == "HfzooDecoderModel"
    assert converted[1].get_config_dict()["pooling_mode"] == "lasttoken" and converted.max_seq_length == 64
    assert (converted.encode(sentences, convert_to_tensor=True) - expected).abs().max() <= 1e-5


CLEAN_ENV_SCRIPT = """
import json, sys
job = json.load(open(sys.argv[1]))
try:
    import hfzoo  # noqa: F401
    hfzoo_import = "importable"
except ModuleNotFoundError:
    hfzoo_import = "ModuleNotFoundError"
import torch
from sentence_transformers import SentenceTransformer

torch.set_num_threads(job["threads"])
model = SentenceTransformer(job["dir"], trust_remote_code=True, device="cpu")
embeddings = model.encode(job["sentences"], convert_to_tensor=True, batch_size=2)
print("RESULT " + json.dumps({
    "hfzoo": hfzoo_import,
    "hfzoo_modules_loaded": sorted(name for name in sys.modules if name.split(".")[0] == "hfzoo"),
    "model_module": type(model[0].model).__module__,
    "modules": [type(module).__name__ for module in model],
    "embeddings": embeddings.tolist(),
}))
"""


@pytest.mark.compat
def test_the_remote_code_export_of_a_converted_model_embeds_the_same_without_hfzoo(tmp_path, clean_python):
    source = minilm_dir()
    expected, _ = embed(source)
    exported = export_for_remote_code(str(convert_checkpoint(source, tmp_path / "hfzoo")), tmp_path / "remote")
    assert (exported / "modules.json").is_file() and (exported / "1_Pooling" / "config.json").is_file()
    workdir = tmp_path / "clean"
    workdir.mkdir()
    job = {"dir": str(exported), "sentences": SENTENCES, "threads": torch.get_num_threads()}
    result = clean_env.run_clean(clean_python, CLEAN_ENV_SCRIPT, job, workdir)
    assert result["hfzoo"] == "ModuleNotFoundError" and result["hfzoo_modules_loaded"] == []
    assert result["model_module"].startswith("transformers_modules.")
    assert result["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert (torch.tensor(result["embeddings"]) - expected).abs().max() <= 1e-5


def test_an_hfzoo_encoder_saved_by_sentence_transformers_converts_with_its_pooling(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    torch.manual_seed(0)
    bert_config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    config = hfzoo_config_from_bert(bert_config)  # an hfzoo encoder that BERT can express
    HfzooEncoderModel(config).save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    transformer = Transformer(str(tmp_path / "encoder"), max_seq_length=64)
    model = SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="cls"), Normalize()], device="cpu")
    expected = model.encode(SENTENCES, convert_to_tensor=True)
    model.save(str(tmp_path / "saved"))
    reloaded, again = embed(tmp_path / "saved")
    assert (reloaded - expected).abs().max() <= 1e-6

    bert_folder = convert_checkpoint(tmp_path / "saved", tmp_path / "bert")
    actual, converted = embed(bert_folder)
    assert isinstance(converted[0].model, BertModel)
    assert converted[1].get_config_dict()["pooling_mode"] == "cls" and converted.max_seq_length == 64
    assert module_types(converted) == ["Transformer", "Pooling", "Normalize"]
    assert (actual - expected).abs().max() <= 1e-5


def hub_cache_holding(cache: Path, repo_id: str, folder: Path) -> None:
    """Lay out the files of `folder` as the cached current revision of `repo_id` (huggingface_hub's cache)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit, copy_function=os.symlink)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_the_modules_of_a_hub_id_are_fetched_from_the_hub_cache(tmp_path, monkeypatch):
    folder, cache = tmp_path / "files", tmp_path / "hub"
    (folder / "1_Pooling").mkdir(parents=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (folder / "config.json").write_text("{}")  # the checkpoint's own files are not copied
    hub_cache_holding(cache, "someone/minilm", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "out"
    out.mkdir()
    copied = copy_sentence_transformers_files("someone/minilm", out)
    assert copied == ["modules.json", "sentence_bert_config.json", "1_Pooling"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "1_Pooling", "1_Pooling/config.json", "modules.json", "sentence_bert_config.json",
    ]  # fmt: skip
    assert json.loads((out / "modules.json").read_text()) == modules


@pytest.mark.slow
def test_hfzoo_convert_takes_the_hub_id_of_a_sentence_transformers_model(tmp_path):
    source, repo_id = minilm_dir(), "sentence-transformers/all-MiniLM-L6-v2"
    hub_cache_holding(tmp_path / "hub", repo_id, source)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "hfzoo.convert",
        "--model_name_or_path",
        repo_id,
        "--output_dir",
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected, _ = embed(source)
    actual, converted = embed(tmp_path / "out")
    assert isinstance(converted[0].model, HfzooEncoderModel) and converted.max_seq_length == 256
    assert module_types(converted) == ["Transformer", "Pooling", "Normalize"]
    assert (actual - expected).abs().max() <= 1e-5


def test_a_folder_without_modules_copies_nothing_and_a_bad_module_list_is_refused(tmp_path):
    source, out = tmp_path / "source", tmp_path / "out"
    source.mkdir(), out.mkdir()
    (source / "sentence_bert_config.json").write_text("{}")  # without modules.json: no sentence-transformers model
    assert copy_sentence_transformers_files(source, out) == [] and not any(out.iterdir())
    (source / "modules.json").write_text(json.dumps([{"path": "../elsewhere"}]))
    with pytest.raises(ValueError, match=r"module path '../elsewhere' is outside the model folder"):
        copy_sentence_transformers_files(source, out)
    (source / "modules.json").write_text(json.dumps({"path": ""}))
    with pytest.raises(ValueError, match=r"modules.json: expected a list of modules, each with a 'path'"):
        copy_sentence_transformers_files(source, out)
    with pytest.raises(OSError, match=r"missing: neither a local folder nor a valid hub id"):
        copy_sentence_transformers_files(tmp_path / "missing", out)
