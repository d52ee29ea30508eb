"""`hfzoo-evaluate-lm --lm_eval_tasks`: hfzoo's lm-evaluation-harness tasks on local files, offline.

Tiny models, briefly trained on a short public-domain passage (so their losses are far from uniform), with
their tokenizers; a data folder in the layout of ../shared/data holding that passage as WikiText-2 and
a few SST-2 rows. The harness's bits per byte must agree with hfzoo-evaluate-lm's own within 1%.
"""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from hfzoo.models.presets import build_config
from hfzoo.pretraining import harness
from hfzoo.pretraining.evaluation import main
from hfzoo.tokenization import train_bpe_tokenizer

pytest.importorskip("lm_eval")

# Dickens, A Tale of Two Cities (1859), public domain.
PASSAGE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way - in short, the period was so far like the present period, that some of its noisiest "
    "authorities insisted on its being received, for good or for evil, in the superlative degree of "
    "comparison only.\n"
)
TEXT = PASSAGE * 6
SST2_ROWS = [
    ("a gorgeous , witty , seductive movie . ", 1),
    ("the film is strictly routine . ", 0),
    ("a masterpiece four years in the making . ", 1),
    ("unflinchingly bleak and desperate ", 0),
    ("it 's slow -- very , very slow . ", 0),
    ("a sometimes tedious film . ", 0),
    ("the acting , costumes , music , cinematography and sound are all astounding ", 1),
    ("one of the greatest family-oriented , fantasy-adventure movies ever . ", 1),
]
BLOCK = 32
TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Nothing may reach the Hugging Face Hub."""
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A data folder laid out as ../shared/data: the passage as WikiText-2 validation and as one book, SST-2 dev."""
    root = tmp_path_factory.mktemp("data")
    (root / "wikitext-2").mkdir()
    (root / "wikitext-2" / "wiki.valid.tokens").write_text(TEXT)
    (root / "glue" / "SST-2").mkdir(parents=True)
    rows = "".join(f"{sentence}\t{label}\n" for sentence, label in SST2_ROWS)
    (root / "glue" / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n" + rows)
    (root / "gutenberg").mkdir()
    with lzma.open(root / "gutenberg" / "pg_top100_en.00.jsonl.xz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": TEXT.replace("\n", "\r\n")}) + "\n")
    return root


def _train(model, blocks: torch.Tensor, seq2seq: bool, start: int, steps: int = 40) -> None:
    """A few Adam steps on the passage's blocks (as hfzoo-evaluate-lm batches them), so the model is not uniform."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        if seq2seq:
            previous = torch.cat([torch.tensor([start]), blocks[:-1, -1]])[:, None]
            loss = model(input_ids=previous, labels=blocks).loss
        else:
            loss = model(input_ids=blocks, labels=blocks).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module", params=["decoder", "encoder-decoder"])
def checkpoint(request, tmp_path_factory) -> Path:
    """A tiny decoder or encoder-decoder trained for 40 steps on the passage, saved with its tokenizer."""
    family = request.param
    path = tmp_path_factory.mktemp(family)
    extra = {"num_extra_ids": 4} if family == "encoder-decoder" else {}
    tokenizer = train_bpe_tokenizer([[PASSAGE]], vocab_size=300, model_family=family, **extra)
    tokenizer.save_pretrained(path)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    if family == "encoder-decoder":
        ids["decoder_start_token_id"] = tokenizer.pad_token_id
    config = build_config(f"{family}-tiny", TINY, vocab_size=len(tokenizer), **ids)
    torch.manual_seed(0)
    auto = AutoModelForSeq2SeqLM if family == "encoder-decoder" else AutoModelForCausalLM
    model = auto.from_config(config)
    ids = tokenizer(TEXT)["input_ids"]
    blocks = torch.tensor(ids[: len(ids) // BLOCK * BLOCK]).view(-1, BLOCK)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    _train(model, blocks, family == "encoder-decoder", start)
    model.save_pretrained(path)
    (path / "text.txt").write_text(TEXT)
    return path


def evaluate(checkpoint: Path, data_dir: Path, *extra: str) -> dict:
    return main(["--model_name_or_path", str(checkpoint), "--block_size", str(BLOCK), "--data_dir", str(data_dir),
                 *extra])  # fmt: skip


def test_harness_bits_per_byte_agrees_with_hfzoo_evaluate_lm(checkpoint, data_dir):
    results = evaluate(checkpoint, data_dir, "--validation_file", str(checkpoint / "text.txt"),
                       "--lm_eval_tasks", "hfzoo_wikitext2")  # fmt: skip
    own, theirs = results["text.txt"], results["lm_eval"]["hfzoo_wikitext2"]
    assert own["bytes"] == len(TEXT.encode("utf-8"))
    assert theirs["documents"] == 1
    assert theirs["bits_per_byte"] == pytest.approx(own["bits_per_byte"], rel=0.01)
    # the models learned the passage: agreement is not that of two uniform predictions
    uniform = harness.bits_per_byte(
        math.log(len(AutoTokenizer.from_pretrained(checkpoint))) * own["tokens"], own["bytes"]
    )
    assert theirs["bits_per_byte"] < 0.7 * uniform
    assert theirs["byte_perplexity"] == pytest.approx(2 ** theirs["bits_per_byte"], rel=1e-6)


def test_gutenberg_task_reads_the_cleaned_held_out_books(checkpoint, data_dir):
    """The book (CRLF line ends) is cleaned as hfzoo-evaluate-lm cleans it: the same bits per byte."""
    results = evaluate(checkpoint, data_dir, "--validation_file", str(checkpoint / "text.txt"),
                       "--lm_eval_tasks", "hfzoo_gutenberg,hfzoo_wikitext2")  # fmt: skip
    gutenberg, wikitext = (results["lm_eval"][task] for task in ("hfzoo_gutenberg", "hfzoo_wikitext2"))
    assert gutenberg["bits_per_byte"] == pytest.approx(wikitext["bits_per_byte"], rel=1e-6)


def _choice_logprob(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) under a causal LM, the text encoded without special tokens."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([whole])).logits[0, :-1].log_softmax(-1)
    targets = torch.tensor(whole[len(context_ids) :])
    return logits[len(context_ids) - 1 :].gather(1, targets[:, None]).sum().item()


@pytest.mark.parametrize("checkpoint", ["decoder"], indirect=True)
def test_sst2_accuracy_is_that_of_the_likelier_choice(checkpoint, data_dir):
    limit = 6
    results = evaluate(checkpoint, data_dir, "--lm_eval_tasks", "hfzoo_sst2", "--lm_eval_limit", str(limit))
    sst2 = results["lm_eval"]["hfzoo_sst2"]
    assert sst2["documents"] == limit
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    correct = 0
    for sentence, label in SST2_ROWS[:limit]:
        context = f"Review: {sentence}\nSentiment:"
        scores = [_choice_logprob(model, tokenizer, context, f" {choice}") for choice in ("negative", "positive")]
        correct += int(scores.index(max(scores)) == label)
    assert sst2["acc"] == pytest.approx(correct / limit)


@pytest.mark.parametrize("checkpoint", ["encoder-decoder"], indirect=True)
def test_sst2_runs_on_an_encoder_decoder(checkpoint, data_dir):
    results = evaluate(checkpoint, data_dir, "--lm_eval_tasks", "hfzoo_sst2", "--lm_eval_limit", "3")
    sst2 = results["lm_eval"]["hfzoo_sst2"]
    assert sst2["documents"] == 3 and sst2["acc"] in (0, 1 / 3, 2 / 3, 1)


def test_unknown_task_is_refused_before_loading_the_model(data_dir, tmp_path):
    with pytest.raises(SystemExit, match=r"unknown task 'hfzoo_sst3'.*did you mean 'hfzoo_sst2'"):
        evaluate(tmp_path / "no-model", data_dir, "--lm_eval_tasks", "hfzoo_sst3")


def test_missing_task_data_is_refused_before_loading_the_model(tmp_path):
    with pytest.raises(SystemExit, match=r"hfzoo_wikitext2 reads .*wiki\.valid\.tokens, which does not exist"):
        evaluate(tmp_path / "no-model", tmp_path, "--lm_eval_tasks", "hfzoo_wikitext2")


def test_data_dir_defaults_to_hfzoo_data_dir(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HFZOO_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match=str(tmp_path)):
        main(["--model_name_or_path", str(tmp_path), "--lm_eval_tasks", "hfzoo_sst2"])


def test_a_masked_lm_is_refused_with_what_is_supported(data_dir, tmp_path):
    config = build_config("encoder-tiny", TINY, vocab_size=64)
    from transformers import AutoModelForMaskedLM

    AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match=r"'hfzoo_encoder' is a masked LM.*causal LMs .*encoder-decoders"):
        evaluate(tmp_path, data_dir, "--lm_eval_tasks", "hfzoo_sst2")


def test_every_task_file_names_its_task_and_loader():
    from hfzoo.pretraining.lm_eval_tasks import tasks

    assert harness.available_tasks() == sorted(tasks.TASK_FILES)
    for name in harness.available_tasks():
        text = (harness.TASKS_DIR / f"{name}.yaml").read_text()
        assert f"\ntask: {name}\n" in text
        loader = text.split("custom_dataset: !function tasks.")[1].split()[0]
        assert callable(getattr(tasks, loader))


def test_missing_lm_eval_is_refused_before_loading_the_model(data_dir, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    with pytest.raises(SystemExit, match=r"needs lm-eval: pip install 'hfzoo\[lm-eval\]'"):
        evaluate(tmp_path / "no-model", data_dir, "--lm_eval_tasks", "hfzoo_sst2")
