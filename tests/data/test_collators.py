"""Tests of the pretraining collators (`hfzoo.data.collators`): BERT masked LM and T5 span corruption.

Everything runs on real Project Gutenberg text: small byte-level BPE tokenizers are trained once per
module on the 4 fixture books, and held-out books of the same shard (books 5-19, ~5M characters) are
tokenized for the statistics: over 1,000,000 MLM candidate tokens and several hundred span-corruption
blocks. Tolerances are many standard errors wide (see each test), and every check is also run against
a deliberately wrong variant (the stock transformers collator, masking without whole words, ...)
where that is needed to show that it can fail.
"""

from __future__ import annotations

import copy
import itertools
import json
import lzma
import math

import numpy as np
import pytest
import torch
from transformers import DataCollatorForLanguageModeling

from hfzoo.data.collators import (
    DataCollatorForMaskedLM,
    DataCollatorForSpanCorruption,
    compute_input_and_target_lengths,
    noise_span_counts,
    pad_examples,
    random_spans_noise_mask,
    reconstruct_from_spans,
    sentinel_token_ids,
)
from hfzoo.data.loading import clean_text
from hfzoo.data.packing import group_texts
from hfzoo.tokenization import train_bpe_tokenizer

MLM_CANDIDATES_WANTED = 1_000_000


# --------------------------------------------------------------------------------------------------
# Shared real-text fixtures
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_texts(gutenberg_books: list[dict]) -> list[str]:
    """The 4 fixture books, cleaned (~860K characters): tokenizer training text."""
    return [clean_text(row["text"]) for row in gutenberg_books]


@pytest.fixture(scope="module")
def heldout_texts(gutenberg_shard) -> list[str]:
    """Books 5, 6, ... of the shard (not used for tokenizer training), cleaned, >= 3.3M characters."""
    texts, total = [], 0
    with lzma.open(gutenberg_shard, "rt", encoding="utf-8") as f:
        for line in itertools.islice(f, 4, None):
            texts.append(clean_text(json.loads(line)["text"]))
            total += len(texts[-1])
            if total >= 3_300_000:
                break
    return texts


@pytest.fixture(scope="module")
def enc_tok(train_texts):
    """Encoder-family tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK] = ids 0-4), 2000 tokens."""
    return train_bpe_tokenizer([train_texts], vocab_size=2000, model_family="encoder")


@pytest.fixture(scope="module")
def t5_tok(train_texts):
    """Encoder-decoder tokenizer (<pad>=0 </s>=1 <unk>=2, <extra_id_0..99> = 3..102), 1500 tokens."""
    return train_bpe_tokenizer([train_texts], vocab_size=1500, model_family="encoder-decoder")


# --------------------------------------------------------------------------------------------------
# Masked LM
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlm_examples(enc_tok, heldout_texts) -> list[dict]:
    """BERT-style rows of real text, of random lengths 8..510, ~1.2M non-special tokens.

    Two rows in three are `[CLS] a [SEP]`, one in three a pair `[CLS] a [SEP] b [SEP]` with token type
    ids 0/1; every 10th row also carries a `[MASK]` or `[UNK]` token in the middle (as text containing
    them would be tokenized), which must never be selected.
    """
    # The backend's encode_batch_fast gives the same ids as enc_tok(texts, add_special_tokens=False), faster.
    encoded = enc_tok.backend_tokenizer.encode_batch_fast(heldout_texts, add_special_tokens=False)
    ids = np.concatenate([np.asarray(e.ids) for e in encoded])
    cls, sep, mask, unk = enc_tok.cls_token_id, enc_tok.sep_token_id, enc_tok.mask_token_id, enc_tok.unk_token_id
    rng = np.random.default_rng(0)
    examples, at, n, total = [], 0, 0, 0
    while total < 1.15 * MLM_CANDIDATES_WANTED:
        length = int(rng.integers(8, 511))
        chunk = ids[at : at + length].tolist()
        assert len(chunk) == length, "not enough held-out text"
        at += length
        total += length
        if n % 10 == 5:
            chunk[len(chunk) // 2] = mask if n % 20 == 5 else unk
        if n % 3 == 2:
            cut = len(chunk) // 2
            row = [cls, *chunk[:cut], sep, *chunk[cut:], sep]
            types = [0] * (cut + 2) + [1] * (len(chunk) - cut + 1)
        else:
            row, types = [cls, *chunk, sep], [0] * (len(chunk) + 2)
        examples.append({"input_ids": row, "token_type_ids": types, "attention_mask": [1] * len(row)})
        n += 1
    return examples


def padded_originals(examples: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples' ids right-padded with `pad_id` (computed here, independently of the collator), and lengths."""
    rows = [torch.tensor(e["input_ids"]) for e in examples]
    lengths = torch.tensor([len(r) for r in rows])
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id), lengths


def run_collator(collator, examples: list[dict], pad_id: int, batch_size: int = 256) -> dict[str, torch.Tensor]:
    """Collate every example in batches; return flat (over all positions) originals, outputs and masks."""
    parts = {"orig": [], "input_ids": [], "labels": [], "real": [], "row_ok": []}
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        orig, lengths = padded_originals(chunk, pad_id)
        out = collator(chunk)
        assert out["input_ids"].shape == orig.shape
        real = torch.arange(orig.shape[1]) < lengths[:, None]
        parts["orig"].append(orig.flatten())
        parts["input_ids"].append(out["input_ids"].flatten())
        parts["labels"].append(out["labels"].flatten())
        parts["real"].append(real.flatten())
        # whole-row consistency: the attention mask is exactly the padding pattern
        parts["row_ok"].append(torch.tensor([bool((out["attention_mask"].bool() == real).all())]))
    return {k: torch.cat(v) for k, v in parts.items()}


@pytest.fixture(scope="module")
def mlm_run(enc_tok, mlm_examples):
    """The collator's output over all rows (fixed seed), flattened, with the candidate mask."""
    torch.manual_seed(0)
    run = run_collator(DataCollatorForMaskedLM(enc_tok, seed=1234), mlm_examples, enc_tok.pad_token_id)
    special = torch.tensor(enc_tok.all_special_ids)
    run["candidate"] = run["real"] & ~torch.isin(run["orig"], special)
    run["selected"] = run["labels"] != -100
    return run


def test_mlm_output_format(enc_tok, mlm_examples):
    collator = DataCollatorForMaskedLM(enc_tok, seed=0)
    batch = mlm_examples[:7]
    out = collator(batch)
    assert set(out) == {"input_ids", "labels", "attention_mask", "token_type_ids"}
    orig, lengths = padded_originals(batch, enc_tok.pad_token_id)
    for key, value in out.items():
        assert isinstance(value, torch.Tensor) and value.dtype == torch.long, key
        assert value.shape == orig.shape == (7, int(lengths.max())), key
    real = torch.arange(orig.shape[1]) < lengths[:, None]
    assert torch.equal(out["attention_mask"], real.long())
    types, _ = padded_originals([{"input_ids": e["token_type_ids"]} for e in batch], 0)
    assert torch.equal(out["token_type_ids"], types)  # kept, padded with 0
    assert (out["input_ids"][~real] == enc_tok.pad_token_id).all()
    assert (out["labels"][~real] == -100).all()
    assert (out["input_ids"][:, 0] == enc_tok.cls_token_id).all()  # [CLS] never touched
    # Plain id lists (no attention mask given) also get an attention mask; a packed `labels` column is ignored.
    plain = collator([e["input_ids"] for e in batch])
    assert set(plain) == {"input_ids", "labels", "attention_mask"} and torch.equal(plain["attention_mask"], real.long())
    packed = collator([{"input_ids": e["input_ids"], "labels": e["input_ids"]} for e in batch])
    assert (packed["labels"] == -100).float().mean() > 0.6
    # Padding to a multiple.
    assert DataCollatorForMaskedLM(enc_tok, pad_to_multiple_of=64)(batch)["input_ids"].shape[1] % 64 == 0


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_examples_matches_tokenizer_pad(enc_tok, mlm_examples, padding_side):
    """The vectorised padding gives exactly what the stock collator's `tokenizer.pad` gives."""
    tok = copy.deepcopy(enc_tok)
    tok.padding_side = padding_side
    batch = [{**e, "special_tokens_mask": [int(i < 5) for i in e["input_ids"]]} for e in mlm_examples[:9]]
    for multiple in (None, 64):
        ours = pad_examples(tok, batch, pad_to_multiple_of=multiple)
        stock = tok.pad(batch, return_tensors="pt", return_attention_mask=True, pad_to_multiple_of=multiple)
        assert set(ours) == set(stock) and all(torch.equal(ours[k], stock[k]) for k in ours)
    plain = pad_examples(tok, [torch.tensor(e["input_ids"]) for e in batch])
    stock = tok.pad([{"input_ids": e["input_ids"]} for e in batch], return_tensors="pt", return_attention_mask=True)
    assert set(plain) == {"input_ids", "attention_mask"} and all(torch.equal(plain[k], stock[k]) for k in plain)


def test_mlm_seed_is_reproducible(enc_tok, mlm_examples):
    a = DataCollatorForMaskedLM(enc_tok, seed=7)(mlm_examples[:32])
    b = DataCollatorForMaskedLM(enc_tok, seed=7)(mlm_examples[:32])
    c = DataCollatorForMaskedLM(enc_tok, seed=8)(mlm_examples[:32])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["labels"], c["labels"])


@pytest.mark.parametrize("kind", ["mlm", "span"])
def test_seeded_collators_draw_new_masks_in_each_dataloader_worker_and_pass(kind, enc_tok, mlm_examples, t5_tok,
                                                                             span_blocks):  # fmt: skip
    """With a seed and `DataLoader` workers: the two workers draw different masks for the same rows, the next pass
    (new worker processes) draws new ones, a collator already called in the main process still gives each worker
    its own generator, and a loader seeded the same way draws the same masks again."""
    if kind == "mlm":
        collator, example = DataCollatorForMaskedLM(enc_tok, seed=5), mlm_examples[0]
    else:
        collator, example = DataCollatorForSpanCorruption(t5_tok, inputs_length=512, seed=5), span_blocks[0]

    def passes(count: int) -> list[list[torch.Tensor]]:
        loader = torch.utils.data.DataLoader([example] * 8, batch_size=4, num_workers=2, collate_fn=collator,
                                             generator=torch.Generator().manual_seed(0))  # fmt: skip
        return [[batch["labels"] for batch in loader] for _ in range(count)]  # batch 0: worker 0, batch 1: worker 1

    first, second = passes(2)
    assert not torch.equal(first[0], first[1])  # the workers differ
    assert not any(torch.equal(a, b) for a, b in zip(first, second))  # the next pass (epoch) draws other masks
    collator([example])  # a generator made in the main process is not copied into the workers
    (again,) = passes(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # a loader seeded alike repeats its masks


def test_mlm_selection_rate(mlm_run):
    """15% of >= 1M candidates are selected: +-0.3 points is ~8 standard errors (0.036 points)."""
    n = int(mlm_run["candidate"].sum())
    assert n >= MLM_CANDIDATES_WANTED
    assert all(mlm_run["row_ok"])
    rate = mlm_run["selected"][mlm_run["candidate"]].float().mean().item()
    assert abs(rate - 0.15) < 0.003, rate


def test_mlm_never_selects_special_or_padding(mlm_run, enc_tok):
    non_candidate = ~mlm_run["candidate"]
    assert int(non_candidate.sum()) > 10_000  # [CLS]/[SEP]/[MASK]/[UNK] and padding are all in the data
    assert not mlm_run["selected"][non_candidate].any()
    # Non-candidates come out exactly as they went in ([CLS], [SEP], [MASK], [UNK] and [PAD] kept).
    assert torch.equal(mlm_run["input_ids"][non_candidate], mlm_run["orig"][non_candidate])
    for token in ("[MASK]", "[UNK]", "[SEP]"):
        token_id = enc_tok.convert_tokens_to_ids(token)
        assert int((mlm_run["orig"] == token_id).sum()) > 50, token


def test_mlm_labels_exactly_at_selected_positions(mlm_run):
    selected = mlm_run["selected"]
    assert torch.equal(mlm_run["labels"][selected], mlm_run["orig"][selected])
    assert (mlm_run["labels"][~selected] == -100).all()
    # Every corrupted position is labelled: unselected tokens are never changed.
    assert torch.equal(mlm_run["input_ids"][~selected], mlm_run["orig"][~selected])


def replacement_shares(run: dict, mask_id: int) -> tuple[float, float, float, int]:
    """Shares of selected tokens that became [MASK], another token, or stayed the same."""
    sel = run["selected"]
    new, orig = run["input_ids"][sel], run["orig"][sel]
    masked = new == mask_id
    other = ~masked & (new != orig)
    same = new == orig
    assert int(masked.sum() + other.sum() + same.sum()) == int(sel.sum())  # a partition
    n = int(sel.sum())
    return masked.float().mean().item(), other.float().mean().item(), same.float().mean().item(), n


def test_mlm_80_10_10(mlm_run, enc_tok):
    """Of ~180K selected tokens: 80% [MASK], 10% random, 10% unchanged (+-0.5 points, >= 5 standard errors).

    A random draw is uniform over the K non-special ids, so it equals the original with probability
    1/K: the expected share of tokens changed to *another* token is 0.1 (1 - 1/K), and the unchanged
    share is 0.1 + 0.1/K. (Here 1/K ~ 0.05%, far inside the tolerance, but the expectation is exact.)
    """
    masked, other, same, n = replacement_shares(mlm_run, enc_tok.mask_token_id)
    k = len(enc_tok) - len(set(enc_tok.all_special_ids))
    assert n > 150_000
    assert abs(masked - 0.8) < 0.005, masked
    assert abs(other - 0.1 * (1 - 1 / k)) < 0.005, other
    assert abs(same - (0.1 + 0.1 / k)) < 0.005, same


def random_replacements(run: dict, mask_id: int) -> torch.Tensor:
    """The ids written by random replacement (selected tokens that became something else than [MASK])."""
    sel = run["selected"]
    new, orig = run["input_ids"][sel], run["orig"][sel]
    return new[(new != mask_id) & (new != orig)]


def test_mlm_random_tokens_are_never_special_and_uniform(mlm_run, enc_tok, mlm_examples):
    special = torch.tensor(sorted(set(enc_tok.all_special_ids)))
    drawn = random_replacements(mlm_run, enc_tok.mask_token_id)
    assert len(drawn) > 15_000
    assert not torch.isin(drawn, special).any()
    # Uniform over the non-special ids: chi-square with K-1 degrees of freedom within 5 standard deviations.
    vocab = len(enc_tok)
    counts = np.bincount(drawn.numpy(), minlength=vocab)[np.setdiff1d(np.arange(vocab), special.numpy())]
    expected = counts.sum() / len(counts)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = len(counts) - 1
    assert abs(chi2 - dof) < 5 * math.sqrt(2 * dof), (chi2, dof)

    # The same check flags transformers' stock collator, which draws from the whole vocabulary
    # (5 special ids out of 2000: ~1 draw in 400 is a special token).
    stock = DataCollatorForLanguageModeling(enc_tok, mlm_probability=0.15, seed=0)
    stock_run = run_collator(stock, mlm_examples[:1000], enc_tok.pad_token_id)
    stock_run["selected"] = stock_run["labels"] != -100
    stock_drawn = random_replacements(stock_run, enc_tok.mask_token_id)
    assert torch.isin(stock_drawn, special).any()


# --- whole-word masking ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whitespace_edges(enc_tok) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token id, whether its *decoded* text starts / ends with whitespace (via the tokenizer's decoder)."""
    texts = [enc_tok.decode([i]) for i in range(len(enc_tok))]
    return (
        torch.tensor([t[:1].isspace() for t in texts]),
        torch.tensor([t[-1:].isspace() for t in texts]),
    )


def word_split_violations(run: dict, whitespace_edges) -> tuple[int, int]:
    """Count adjacent candidate pairs whose selection differs although no whitespace separates them.

    Such a pair is a word cut in two: one part selected, the other not. Also returns the number of
    adjacent selected pairs inside a word (multi-token words selected whole). Pairs across rows are
    excluded because a row ends with [SEP] or padding, never a candidate.
    """
    starts_ws, ends_ws = whitespace_edges
    cand, sel, orig = run["candidate"], run["selected"], run["orig"]
    both = cand[:-1] & cand[1:]
    inside_word = both & ~ends_ws[orig[:-1]] & ~starts_ws[orig[1:]]
    violations = int((inside_word & (sel[:-1] != sel[1:])).sum())
    whole = int((inside_word & sel[:-1] & sel[1:]).sum())
    return violations, whole


@pytest.fixture(scope="module")
def wwm_run(enc_tok, mlm_examples):
    run = run_collator(
        DataCollatorForMaskedLM(enc_tok, whole_word_mask=True, seed=99), mlm_examples[:2500], enc_tok.pad_token_id
    )
    run["candidate"] = run["real"] & ~torch.isin(run["orig"], torch.tensor(enc_tok.all_special_ids))
    run["selected"] = run["labels"] != -100
    return run


def test_whole_word_masking_selects_whole_words(wwm_run, mlm_run, whitespace_edges):
    violations, whole = word_split_violations(wwm_run, whitespace_edges)
    assert violations == 0
    assert whole > 10_000  # many multi-token words were selected entirely
    # The check has power: token-level masking cuts words all the time.
    token_level_violations, _ = word_split_violations(mlm_run, whitespace_edges)
    assert token_level_violations > 50_000


def test_whole_word_masking_rate_and_replacements(wwm_run, enc_tok):
    """~660K candidates in ~380K words: the token rate stays at 15% (+-0.5 points, ~7 standard errors of 0.07)."""
    cand = wwm_run["candidate"]
    assert int(cand.sum()) > 600_000
    rate = wwm_run["selected"][cand].float().mean().item()
    assert abs(rate - 0.15) < 0.005, rate
    assert not wwm_run["selected"][~cand].any()
    # Each token of a selected word still gets BERT's 80/10/10 (the stock collator forces 100% [MASK]).
    masked, other, same, _ = replacement_shares(wwm_run, enc_tok.mask_token_id)
    assert abs(masked - 0.8) < 0.01 and abs(other - 0.1) < 0.01 and abs(same - 0.1) < 0.01
    drawn = random_replacements(wwm_run, enc_tok.mask_token_id)
    assert not torch.isin(drawn, torch.tensor(enc_tok.all_special_ids)).any()


def test_word_starts_rule(enc_tok):
    collator = DataCollatorForMaskedLM(enc_tok, whole_word_mask=True)
    enc = enc_tok(["Hello world, it's\nnew-line text.  Two"], return_tensors="pt")
    ids = enc["input_ids"]
    starts = collator.word_starts(ids, collator.candidate_mask(ids, attention_mask=enc["attention_mask"]))[0]
    tokens = enc_tok.convert_ids_to_tokens(ids[0])
    words, current = [], []
    for token, start in zip(tokens[1:-1], starts[1:-1].tolist()):
        if start and current:
            words.append("".join(current))
            current = []
        current.append(token)
    words.append("".join(current))
    assert [w.replace("Ġ", " ").replace("Ċ", "\n") for w in words] == [
        "Hello",
        " world,",
        " it's",
        "\n",
        "new-line",
        " text.",
        " ",
        " Two",
    ]
    assert not starts[0] and not starts[-1]  # [CLS] / [SEP] are not words


def test_mlm_errors(enc_tok, t5_tok):
    with pytest.raises(ValueError, match="no mask token"):
        DataCollatorForMaskedLM(t5_tok)
    with pytest.raises(ValueError, match="torch tensors only"):
        DataCollatorForMaskedLM(enc_tok, return_tensors="np")
    with pytest.raises(ValueError, match="torch tensors only"):
        DataCollatorForMaskedLM(enc_tok)([[5, 6, 7]], return_tensors="np")
    with pytest.raises(ValueError, match="masked LM only"):
        DataCollatorForMaskedLM(enc_tok, mlm=False)
    with pytest.raises(ValueError, match="mlm_probability"):
        DataCollatorForMaskedLM(enc_tok, mlm_probability=1.5)
    with pytest.raises(ValueError, match="should not exceed 1"):
        DataCollatorForMaskedLM(enc_tok, mask_replace_prob=0.8, random_replace_prob=0.3)


# --------------------------------------------------------------------------------------------------
# Span corruption
# --------------------------------------------------------------------------------------------------


def t5_random_spans_helper(inputs_length, noise_density, mean_noise_span_length):
    """Transcription of T5's `t5.data.preprocessors.random_spans_helper` (1 sentinel per span, EOS appended)."""

    def lengths(tokens_length):
        num_noise_tokens = int(round(tokens_length * noise_density))
        num_nonnoise_tokens = tokens_length - num_noise_tokens
        num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
        return num_nonnoise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs_length, targets_length = lengths(tokens_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def test_compute_input_and_target_lengths():
    # T5's span-corruption setting (inputs 512): 568 raw tokens, 85 noise tokens in 28 spans, targets 114.
    assert compute_input_and_target_lengths(512, 0.15, 3.0) == (568, 114)
    assert compute_input_and_target_lengths(512) == (568, 114)
    for inputs_length in (2, 3, 10, 64, 100, 128, 256, 511, 512, 513, 1024):
        for density in (0.05, 0.15, 0.3, 0.5, 0.8):
            for mean in (1.0, 2.0, 3.0, 8.0):
                expected = t5_random_spans_helper(inputs_length, density, mean)
                assert compute_input_and_target_lengths(inputs_length, density, mean) == expected
    with pytest.raises(ValueError, match="inputs_length"):
        compute_input_and_target_lengths(1)


@pytest.fixture(scope="module")
def span_collator(t5_tok):
    return DataCollatorForSpanCorruption(t5_tok, inputs_length=512, seed=2020)


@pytest.fixture(scope="module")
def span_blocks(t5_tok, heldout_texts, span_collator) -> list[dict]:
    """400 raw blocks of 568 tokens of real text, packed by `hfzoo.data.packing.group_texts`.

    Documents are tokenized with the tokenizer's post-processor, so `</s>` separates them inside blocks.
    """
    ids = [e.ids for e in t5_tok.backend_tokenizer.encode_batch_fast(heldout_texts[:4])]  # with </s>
    packed = group_texts(span_collator.expanded_inputs_length)({"input_ids": ids})
    assert len(packed["input_ids"]) >= 400
    # A `labels` column (as causal-LM packing writes) is ignored by the collator.
    return [{"input_ids": x, "labels": list(x)} for x in packed["input_ids"][:400]]


@pytest.fixture(scope="module")
def span_run(span_collator, span_blocks) -> dict[str, torch.Tensor]:
    outs = [span_collator(span_blocks[i : i + 50]) for i in range(0, len(span_blocks), 50)]
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


def test_span_output_shapes_and_no_padding(span_run, span_collator, t5_tok):
    assert (span_collator.expanded_inputs_length, span_collator.target_length) == (568, 114)
    n = len(span_run["input_ids"])
    assert span_run["input_ids"].shape == span_run["attention_mask"].shape == (n, 512)
    assert span_run["labels"].shape == (n, 114)
    assert all(v.dtype == torch.long for v in span_run.values())
    # Under 2% padding (full blocks of expanded_inputs_length tokens give exactly none).
    assert (span_run["attention_mask"] == 0).float().mean() < 0.02
    assert (span_run["input_ids"] == t5_tok.pad_token_id).float().mean() < 0.02
    assert (span_run["labels"] == -100).float().mean() < 0.02
    assert (span_run["input_ids"][:, -1] == t5_tok.eos_token_id).all()
    assert (span_run["labels"][:, -1] == t5_tok.eos_token_id).all()


def test_span_reconstruction_is_exact(span_run, span_collator, span_blocks, t5_tok):
    rebuilt = reconstruct_from_spans(
        span_run["input_ids"], span_run["labels"], span_collator.sentinel_ids, t5_tok.eos_token_id, t5_tok.pad_token_id
    )
    assert len(rebuilt) == len(span_blocks) == 400
    mismatches = [i for i, (r, b) in enumerate(zip(rebuilt, span_blocks)) if r != b["input_ids"]]
    assert mismatches == []
    assert sum(b["input_ids"].count(t5_tok.eos_token_id) for b in span_blocks) > 0  # </s> inside blocks survives


def test_span_sentinels_distinct_and_in_order(span_run, span_collator, t5_tok):
    sentinels = torch.tensor(span_collator.sentinel_ids)
    assert span_collator.sentinel_ids == [t5_tok.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(100)]
    for inp, lab in zip(span_run["input_ids"], span_run["labels"]):
        in_sent = inp[torch.isin(inp, sentinels)]
        lab_sent = lab[torch.isin(lab, sentinels)]
        assert torch.equal(in_sent, sentinels[: len(in_sent)])  # <extra_id_0>, <extra_id_1>, ... once each
        assert torch.equal(lab_sent, in_sent)
        assert lab[0] == sentinels[0]  # targets start with the first sentinel
        assert inp[-2] == in_sent[-1]  # T5's mask ends with a noise span: sentinel then EOS
        assert not torch.isin(inp[0], sentinels)  # ... and starts with a non-noise span


def test_span_noise_statistics(span_run, span_collator):
    """Noise fraction 15% (+-0.5 pt) and mean span length 3 (+-0.2) over 227K real tokens, spans of varied lengths."""
    sentinels = torch.tensor(span_collator.sentinel_ids)
    labels = span_run["labels"]
    body = (labels != -100) & (labels != span_collator.eos_token_id)
    is_sentinel = torch.isin(labels, sentinels)
    noise_tokens = int((body & ~is_sentinel).sum())
    spans = int(is_sentinel.sum())
    raw_tokens = len(labels) * span_collator.expanded_inputs_length
    assert abs(noise_tokens / raw_tokens - 0.15) < 0.005
    assert abs(noise_tokens / spans - 3.0) < 0.2
    # Span lengths are drawn by random segmentation, not fixed: lengths 1, 2, ... all occur.
    span_id = is_sentinel.long().cumsum(1)
    lengths = torch.zeros(len(labels), int(span_id.max()) + 1, dtype=torch.long)
    lengths.scatter_add_(1, span_id, (body & ~is_sentinel).long())
    lengths = lengths[:, 1:][lengths[:, 1:] > 0].double()
    assert lengths.std() > 1.0 and (lengths == 1).float().mean() > 0.15 and lengths.max() >= 10


def test_random_spans_noise_mask_counts_match_t5():
    lengths = torch.tensor([1, 2, 3, 5, 10, 37, 100, 568, 1000])
    mask = random_spans_noise_mask(lengths, 0.15, 3.0, generator=torch.Generator().manual_seed(0))
    assert mask.shape == (len(lengths), 1000) and mask.dtype == torch.bool
    for row, length in zip(mask, lengths.tolist()):
        assert not row[length:].any()
        effective = max(length, 2)
        num_noise = min(max(int(round(effective * 0.15)), 1), effective - 1)
        num_spans = max(int(round(num_noise / 3.0)), 1)
        if length >= 2:
            assert int(row.sum()) == num_noise
            starts = row[:length] & ~torch.cat([torch.tensor([False]), row[: length - 1]])
            assert int(starts.sum()) == num_spans
            assert not row[0] and row[length - 1]
        else:  # T5 builds the mask for length 2 ([False, True]) and truncates it
            assert not row.any()
    num_noise, num_spans = noise_span_counts(torch.tensor([568]), 0.15, 3.0)
    assert (int(num_noise), int(num_spans)) == (85, 28)


def test_random_spans_noise_mask_is_uniform_over_masks():
    """T5: 'Subject to the above restrictions, all masks are equally likely'.

    Length 10, density 0.3, mean span 1.5: 3 noise tokens in 2 spans (2 splits) and 7 non-noise tokens in
    2 spans (6 splits), so 12 masks, each with probability 1/12; 24,000 rows give ~2,000 each (sd 43).
    """
    mask = random_spans_noise_mask([10] * 24_000, 0.3, 1.5, generator=torch.Generator().manual_seed(1))
    _, counts = torch.unique(mask.long(), dim=0, return_counts=True)
    assert len(counts) == 12
    assert (counts - 2000).abs().max() < 5 * 43


def test_span_vectorised_over_mixed_lengths(span_collator, span_blocks, t5_tok):
    """Rows shorter than expanded_inputs_length are padded (labels with -100) and still reconstruct."""
    rows = [b["input_ids"][: 568 - 40 * i] for i, b in enumerate(span_blocks[:12])]
    out = span_collator(rows)
    assert out["input_ids"].shape == (12, 512) and out["labels"].shape == (12, 114)
    for row, inp, att, lab in zip(rows, out["input_ids"], out["attention_mask"], out["labels"]):
        num_noise, num_spans = (int(x) for x in noise_span_counts(torch.tensor([len(row)]), 0.15, 3.0))
        n_in = len(row) - num_noise + num_spans + 1
        assert int(att.sum()) == n_in and (inp[n_in:] == t5_tok.pad_token_id).all() and (att[:n_in] == 1).all()
        assert int((lab != -100).sum()) == num_noise + num_spans + 1
    rebuilt = reconstruct_from_spans(
        out["input_ids"], out["labels"], span_collator.sentinel_ids, t5_tok.eos_token_id, t5_tok.pad_token_id
    )
    assert rebuilt == rows
    # Without inputs_length, outputs are padded to the longest row of the batch.
    dynamic = DataCollatorForSpanCorruption(t5_tok, seed=0)(rows[3:])
    assert dynamic["input_ids"].shape[1] == int(dynamic["attention_mask"].sum(1).max())


def test_span_seed_is_reproducible(t5_tok, span_blocks):
    a = DataCollatorForSpanCorruption(t5_tok, inputs_length=512, seed=3)(span_blocks[:20])
    b = DataCollatorForSpanCorruption(t5_tok, inputs_length=512, seed=3)(span_blocks[:20])
    c = DataCollatorForSpanCorruption(t5_tok, inputs_length=512, seed=4)(span_blocks[:20])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["labels"], c["labels"])


def test_span_errors(t5_tok, enc_tok, train_texts, span_blocks):
    with pytest.raises(ValueError, match="no sentinel tokens"):
        DataCollatorForSpanCorruption(enc_tok)
    no_sentinels = train_bpe_tokenizer([train_texts[2]], 400, model_family="encoder-decoder", num_extra_ids=0)
    with pytest.raises(ValueError, match="no sentinel tokens"):
        DataCollatorForSpanCorruption(no_sentinels)
    # Sentinels but no eos token (an encoder-family tokenizer given <extra_id_N> tokens).
    no_eos = train_bpe_tokenizer(
        [train_texts[2]], 400, model_family="encoder", additional_special_tokens=[f"<extra_id_{i}>" for i in range(5)]
    )
    assert sentinel_token_ids(no_eos) == no_eos.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(5)])
    with pytest.raises(ValueError, match="no eos token"):
        DataCollatorForSpanCorruption(no_eos)
    for density in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="noise_density"):
            DataCollatorForSpanCorruption(t5_tok, noise_density=density)
    for mean in (0.0, 0.5, -3.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="mean_noise_span_length"):
            DataCollatorForSpanCorruption(t5_tok, mean_noise_span_length=mean)

    # Two sentinels: a 568-token block needs 28 spans; the error names both numbers (at construction
    # when inputs_length fixes the block length, else per batch).
    two = train_bpe_tokenizer([train_texts[2]], 400, model_family="encoder-decoder", num_extra_ids=2)
    with pytest.raises(ValueError, match=r"needs 28 noise spans.*only 2 sentinel"):
        DataCollatorForSpanCorruption(two, inputs_length=512)
    block = two(train_texts[2][:20_000], add_special_tokens=False)["input_ids"][:568]
    with pytest.raises(ValueError, match=r"568 tokens needs 28 noise spans.*only 2 sentinel"):
        DataCollatorForSpanCorruption(two)([block])
    assert DataCollatorForSpanCorruption(two)([block[:20]])["labels"].shape == (1, 3 + 2)  # 3 noise, 1 span

    # Rows longer than expanded_inputs_length do not fit inputs_length.
    collator = DataCollatorForSpanCorruption(t5_tok, inputs_length=512)
    long_row = span_blocks[0]["input_ids"] + span_blocks[1]["input_ids"][:32]
    num_noise, num_spans = (int(x) for x in noise_span_counts(torch.tensor([600]), 0.15, 3.0))
    too_long = 600 - num_noise + num_spans + 1
    with pytest.raises(ValueError, match=rf"600 raw tokens gives inputs of {too_long} tokens, longer than 512"):
        collator([span_blocks[2]["input_ids"], long_row])
    # Raw rows must not contain sentinels or padding.
    with pytest.raises(ValueError, match="must not contain sentinel"):
        collator([span_blocks[0]["input_ids"][:100] + [collator.sentinel_ids[0]]])
    # Degenerate density / span combination that T5's segmentation cannot handle.
    with pytest.raises(ValueError, match="non-noise tokens"):
        random_spans_noise_mask([10], 0.9, 1.0)


def test_reconstruct_rejects_mismatched_sentinels(span_run, span_collator, t5_tok):
    labels = span_run["labels"][:2].clone()
    labels[0, 0] = span_collator.sentinel_ids[5]
    with pytest.raises(ValueError, match="sentinels"):
        reconstruct_from_spans(
            span_run["input_ids"][:2], labels, span_collator.sentinel_ids, t5_tok.eos_token_id, t5_tok.pad_token_id
        )
