"""`benchmarks/transfer_probe.py` on a tiny encoder-decoder and a synthetic SST-2 whose label is one word: the
probes and the text-to-text finetuning learn it, rank classification scores what the model's own loss scores, and
an unknown or regression task and a folder that is no encoder-decoder checkpoint are refused before any work."""

from __future__ import annotations

import importlib.util
import math
import random

import pytest
import torch
from helpers.glue_files import write_tsv
from helpers.paths import REPO_ROOT
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hfzoo.models.encoder_decoder import HfzooEncoderDecoderForConditionalGeneration
from hfzoo.models.presets import build_config

BENCHMARK = REPO_ROOT / "benchmarks" / "transfer_probe.py"
FILLER = "the a of and to in it was that he she with his her for on at by".split()


def load_benchmark():
    spec = importlib.util.spec_from_file_location("transfer_probe", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_rows(count: int, seed: int, pairs: bool = False):
    """SST-2 rows whose label is which of two words the sentence holds, among filler words; with `pairs`, RTE rows
    (a premise of filler words, a hypothesis holding the word)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = i % 2
        words = rng.choices(FILLER, k=rng.randint(4, 10))
        if pairs:
            hypothesis = " ".join([*rng.choices(FILLER, k=3), "never" if label else "surely"])
            rows.append(((" ".join(words), hypothesis), ("entailment", "not_entailment")[label], label))
        else:
            words.insert(rng.randrange(len(words) + 1), "wonderful" if label else "dreadful")
            rows.append(((" ".join(words),), str(label), label))
    return rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, family_tokenizers):
    tokenizer = AutoTokenizer.from_pretrained(family_tokenizers["encoder-decoder"])
    config = build_config(
        "encoder-decoder-tiny",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_encoder_decoder")
    HfzooEncoderDecoderForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    write_tsv(root / "SST-2" / "train.tsv", "sst2", rows=synthetic_rows(192, seed=0))
    write_tsv(root / "SST-2" / "dev.tsv", "sst2", rows=synthetic_rows(64, seed=1))
    return root


def test_probes_and_text_to_text_learn_a_one_word_label(checkpoint, glue_dir, capsys):
    benchmark = load_benchmark()
    (row,) = benchmark.main(["--models", str(checkpoint), "--data_dir", str(glue_dir), "--probe_c", "1.0",
                             "--num_train_epochs", "8", "--learning_rate", "1e-3", "--per_device_train_batch_size",
                             "16"])  # fmt: skip
    # a bag of words separates the two words; the contextual features carry them too
    assert row["embeddings mean"] >= 95.0 and row["encoder mean"] >= 90.0, row
    assert row["text-to-text"] >= 90.0, row
    table = capsys.readouterr().out
    assert "majority class 50.0" in table and f"| {checkpoint} |" in table


def test_sentence_pairs_reach_the_model_as_pairs(checkpoint, tmp_path):
    """A two-text task: both texts are encoded (the label word is in the second), and the probes learn it."""
    write_tsv(tmp_path / "RTE" / "train.tsv", "rte", rows=synthetic_rows(128, seed=0, pairs=True))
    write_tsv(tmp_path / "RTE" / "dev.tsv", "rte", rows=synthetic_rows(48, seed=1, pairs=True))
    benchmark = load_benchmark()
    (row,) = benchmark.main(["--models", str(checkpoint), "--task_name", "rte", "--data_dir", str(tmp_path),
                             "--probe_c", "1.0", "--num_train_epochs", "0"])  # fmt: skip
    assert row["embeddings mean"] >= 95.0, row
    assert math.isnan(row["text-to-text"])


def test_rank_classification_scores_the_models_own_loss(checkpoint):
    """Each row's summed log-likelihood of a label is minus the model's mean loss times the label's length."""
    benchmark = load_benchmark()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).eval()
    targets = benchmark.label_targets(tokenizer, ("negative", "positive"), model.device)
    assert (targets[:, 0] != -100).all() and all(
        row[row != -100][-1] == tokenizer.eos_token_id for row in targets
    )  # each label ends with eos
    texts = [("it was wonderful",), ("a dreadful one , and long",)]
    batch = benchmark.encode(tokenizer, texts, 32, model.device)
    with torch.no_grad():
        for label in range(2):
            labels = targets[label].expand(2, -1)
            scores = benchmark.sequence_log_likelihood(model, batch, labels)
            for i in range(2):
                one = {key: value[i : i + 1, : int(batch["attention_mask"][i].sum())] for key, value in batch.items()}
                loss = model(**one, labels=labels[i : i + 1]).loss
                torch.testing.assert_close(scores[i], -loss * int((labels[i] != -100).sum()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task_name", "stsb"], "--task_name stsb: a classification task is needed"),
        (["--task_name", "sts"], "--task_name: unknown GLUE task 'sts'"),
        (["--models", "/no/such/checkpoint"], "--models /no/such/checkpoint: no such checkpoint folder"),
        (["--models", "DECODER"], "an hfzoo encoder-decoder checkpoint is needed, not 'hfzoo_decoder'"),
        (["--models", "EMPTY"], "--models EMPTY: not a checkpoint folder"),
    ],
)
def test_refuses_bad_tasks_and_checkpoints_before_any_work(checkpoint, argv, message, tmp_path, capsys):
    build_config("decoder-tiny").save_pretrained(tmp_path / "decoder")  # a checkpoint of another family
    (tmp_path / "EMPTY").mkdir()  # no config.json
    folders = {"DECODER": str(tmp_path / "decoder"), "EMPTY": str(tmp_path / "EMPTY")}
    argv = [folders.get(value, value) for value in argv]
    message = message.replace("EMPTY", folders["EMPTY"])
    benchmark = load_benchmark()
    full = ["--models", str(checkpoint), *argv] if argv[0] != "--models" else argv
    with pytest.raises(SystemExit):
        benchmark.parse_args(full)
    assert message in capsys.readouterr().err
