"""Language-model evaluation: validation loss, perplexity, the unigram baseline, and the `hfzoo-evaluate-lm` CLI.

`hfzoo-evaluate-lm` (also `python -m hfzoo.pretraining.evaluation` or `python recipes/evaluate_lm.py`)
evaluates a saved causal LM on text files and prints a generated sample, in a fresh process:

    hfzoo-evaluate-lm --model_name_or_path outputs/model \
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens --prompt "The history of"

It loads the checkpoint with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
(the hfzoo package, imported with this module, registers its model types), packs each file into blocks exactly as
pretraining does, reports loss, perplexity and bits per byte per file, and greedily continues `--prompt`.
An encoder-decoder checkpoint (`AutoModelForSeq2SeqLM`) is evaluated as a language model of its decoder:
each block is the decoder's target, the encoder's input the one token before the block (the tokenizer's
bos token, else its eos token, before the first), as the harness's seq2seq rolling log-likelihood does.
`--lm_eval_tasks` also runs hfzoo's tasks of EleutherAI's lm-evaluation-harness (`hfzoo.pretraining.harness`)
on the loaded model, with the block size as the harness's window length.

The sample checks the model's incremental decoding: the greedy continuation is generated with the KV cache
and again without it (every step recomputing the whole sequence), and a difference is an error (exit
status 1, both continuations named). A prompt plus `--max_new_tokens` longer than a model with a hard
position limit allows (`generation_position_limit`) is refused before any evaluation, as are token ids of the
prompt or of any file beyond the model's vocabulary (`check_token_ids_fit`). The metrics are
written to `--output_file` before the sample is generated, and again with the sample.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, default_data_collator

from ..data.loading import check_distinct_files, check_input_files, check_text_column, clean_text, load_local_files
from ..data.packing import tokenize_and_pack
from ..hub import check_model_path, load_checkpoint_config
from ..integrity import check_weight_files
from ..modules.positions import ABSOLUTE_POSITION_EMBEDDINGS
from ..outputs import check_output_file, removed_if_refused, write_json_atomic
from ..training.arguments import OneLineErrorParser, positive_int, refuse_flags_without
from ..training.compilation import no_cache_kwargs
from .harness import (
    available_tasks,
    bits_per_byte,
    check_task_data,
    default_data_dir,
    harness_backend,
    import_lm_eval,
    parse_task_names,
    run_lm_eval,
)


@torch.no_grad()
def evaluate_lm(model, dataloader, accelerator=None, seed: int | None = None) -> dict[str, float]:
    """Mean loss and perplexity of `model` over `dataloader` (all processes gathered), for any objective.

    The loss of each batch is the model's mean over predicted tokens (next tokens, masked tokens or
    span targets); the mean of batch losses weighted by batch size is reported (exactly the per-token
    mean for packed causal-LM blocks, which all predict the same number of tokens).

    Args:
        model: a model returning `.loss` for the batches (causal LM, masked LM, seq2seq LM).
        dataloader: batches of model inputs with `labels` (collated on the fly for mlm / span).
        accelerator: an `accelerate.Accelerator` to gather losses across processes, or None.
        seed: when given, the random masking/corruption of the collator is drawn from torch's RNG
            seeded with it, so every evaluation sees the same masks; the caller's RNG state is restored.

    Returns:
        `{"eval_loss": nats per token, "perplexity": exp(eval_loss)}` (perplexity is `inf` on overflow).
    """
    was_training = model.training
    model.eval()
    losses = []
    no_cache = no_cache_kwargs(model)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for batch in dataloader:
            loss = model(**batch, **no_cache).loss.detach().float()
            losses_batch = loss.repeat(batch["input_ids"].shape[0])
            if accelerator is not None:
                losses_batch = accelerator.gather_for_metrics(losses_batch)
            losses.append(losses_batch.cpu())
    model.train(was_training)
    eval_loss = torch.cat(losses).mean().item()
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    return {"eval_loss": eval_loss, "perplexity": perplexity}


def unigram_perplexity(train_counts: np.ndarray, eval_tokens: np.ndarray) -> float:
    """Perplexity of an add-one-smoothed unigram model (Laplace smoothing) on `eval_tokens`.

    `p(w) = (count(w) + 1) / (N + V)` with N training tokens and V = `len(train_counts)`;
    perplexity = `exp(-mean(log p(w)))` over the evaluated tokens.

    Args:
        train_counts: int array `(vocab_size,)` of training-token counts.
        eval_tokens: int array of the evaluated token ids (any shape).

    Returns:
        The perplexity (float, per token).

    Raises:
        ValueError: an evaluated id outside `[0, vocab_size)`, or no evaluated token.
    """
    eval_tokens = np.asarray(eval_tokens).ravel()
    if eval_tokens.size == 0:
        raise ValueError("no tokens to evaluate")
    if eval_tokens.min() < 0 or eval_tokens.max() >= len(train_counts):
        raise ValueError(f"token ids must be in [0, {len(train_counts)})")
    log_probs = np.log(train_counts.astype(np.float64) + 1.0) - math.log(train_counts.sum() + len(train_counts))
    return float(math.exp(-log_probs[eval_tokens].mean()))


def generation_position_limit(config) -> tuple[int, str] | None:
    """The most tokens (prompt plus generated ones) a causal LM can process, for models with a hard limit.

    An hfzoo model refuses a sequence longer than `max_position_embeddings` when its stack adds absolute
    position embeddings (`position_embedding_type` `learned` or `sinusoidal`, the schemes for which the
    stack builds `embed_positions`) or its causal stack mixes tokens with a synthesizer (matrices of
    `max_position_embeddings` rows); GPT-2 has a learned table of `n_positions`. The other hfzoo schemes
    (`rotary`, `alibi`, `relative_attention_bias`, `shaw`, `none`) have no such limit, and other model
    types are not checked (None for both).

    Args:
        config: the model's config (`PreTrainedConfig`).

    Returns:
        `(max_position_embeddings, what sets it)` (e.g. `(64, "position_embedding_type='learned'")`), or None.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None:
        return None
    if config.model_type == "gpt2":
        return limit, "GPT-2's learned position embeddings"
    if not hasattr(config, "stack_layouts"):  # not an hfzoo config
        return None
    if config.position_embedding_type in ABSOLUTE_POSITION_EMBEDDINGS:
        return limit, f"position_embedding_type={config.position_embedding_type!r}"
    if any(layout.is_causal and layout.token_mixer == "synthesizer" for layout in config.stack_layouts()):
        return limit, "token_mixer='synthesizer'"
    return None


def check_token_ids_fit(input_ids: np.ndarray | list[int], vocab_size: int, tokenizer_size: int, where: str) -> None:
    """Refuse token ids that the model has no embedding row for (a tokenizer larger than its vocabulary).

    Args:
        input_ids: int token ids of any shape (a packed file's blocks, a tokenized prompt).
        vocab_size: the model's `config.vocab_size`.
        tokenizer_size: `len(tokenizer)`, for the message.
        where: what the ids come from (`--validation_file PATH`, `--prompt`), for the message.

    Raises:
        ValueError: an id `>= vocab_size`; the one-line message names `where`, the id and both sizes.
    """
    ids = np.asarray(input_ids)
    largest = int(ids.max()) if ids.size else -1
    if largest >= vocab_size:
        raise ValueError(
            f"{where}: token id {largest} is outside [0, vocab_size={vocab_size}): the checkpoint's tokenizer has "
            f"{tokenizer_size} tokens, more than its model's vocabulary"
        )


def check_generation_fits(config, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a generation longer than the model's hard position limit (see `generation_position_limit`).

    Args:
        config: the model's config.
        prompt_tokens: length of the tokenized prompt (special tokens the tokenizer adds included).
        max_new_tokens: the most tokens to generate.

    Raises:
        ValueError: `prompt_tokens + max_new_tokens` exceeds the limit; the one-line message names the
            prompt length, `--max_new_tokens`, the limit and what sets it.
    """
    found = generation_position_limit(config)
    if found is None:
        return
    limit, reason = found
    total = prompt_tokens + max_new_tokens
    if total > limit:
        advice = (
            f"use --max_new_tokens <= {limit - prompt_tokens}"
            if prompt_tokens < limit
            else f"shorten --prompt to fewer than {limit} tokens"
        )
        raise ValueError(
            f"--prompt is {prompt_tokens} tokens and --max_new_tokens is {max_new_tokens}: {total} positions, more "
            f"than the model's max_position_embeddings={limit} ({reason}); {advice}"
        )


@torch.no_grad()
def greedy_sample(model, tokenizer, prompt: str, max_new_tokens: int) -> dict:
    """Greedily continue `prompt`, with the KV cache and again without it, and compare the two.

    Without the cache every step recomputes the whole sequence, so the two agree exactly unless the
    model's incremental decoding (cache, positions of cached steps, masks) is wrong.

    Args:
        model: a causal LM (on its device, in eval mode).
        tokenizer: its tokenizer.
        prompt: the text to continue.
        max_new_tokens: the most tokens to generate (fewer when the model generates its end token).

    Returns:
        `{"prompt", "text", "continuation", "text_without_cache", "continuation_without_cache", "new_tokens",
        "cache_equal", "first_difference"}`: `text` is the decoded prompt plus continuation generated
        with the cache (special tokens skipped), `continuation` its new tokens alone, the `_without_cache`
        ones the same without the cache; `new_tokens` the number generated with the cache; `cache_equal`
        whether the two generated token sequences are identical, else `first_difference` is the index
        (among the new tokens) where they first differ (None when equal).
    """
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    prompt_length = inputs["input_ids"].shape[1]
    outputs = {
        use_cache: model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=use_cache)[0]
        for use_cache in (True, False)
    }
    cached, uncached = (outputs[flag][prompt_length:].tolist() for flag in (True, False))
    first_difference = next(
        (i for i, (a, b) in enumerate(zip(cached, uncached)) if a != b),
        None if len(cached) == len(uncached) else min(len(cached), len(uncached)),
    )
    return {
        "prompt": prompt,
        "text": tokenizer.decode(outputs[True], skip_special_tokens=True),
        "continuation": tokenizer.decode(cached, skip_special_tokens=True),
        "text_without_cache": tokenizer.decode(outputs[False], skip_special_tokens=True),
        "continuation_without_cache": tokenizer.decode(uncached, skip_special_tokens=True),
        "new_tokens": len(cached),
        "cache_equal": first_difference is None,
        "first_difference": first_difference,
    }


#: Tokens `--prompt` is continued by when `--max_new_tokens` is not given.
DEFAULT_MAX_NEW_TOKENS = 32


def parse_evaluate_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the arguments of `hfzoo-evaluate-lm` (see `--help`).

    Raises:
        SystemExit: an argparse error (one line), among them nothing to evaluate (no `--validation_file`,
            `--lm_eval_tasks` or `--prompt`), `--max_new_tokens` without `--prompt`, and `--lm_eval_limit` or
            `--data_dir` without `--lm_eval_tasks`.
    """
    p = OneLineErrorParser(
        prog="hfzoo-evaluate-lm",
        description="Evaluate a saved causal LM (or encoder-decoder) on text files and harness tasks; print a sample.",
    )
    p.add_argument("--model_name_or_path", required=True, help="Checkpoint folder (or hub id).")
    p.add_argument("--validation_file", nargs="+", action="extend", default=[], help="Text/JSONL/parquet files.")
    p.add_argument("--text_column_name", default="text")
    p.add_argument("--block_size", type=positive_int, default=None, help="Default: the block size of pretraining.")
    p.add_argument("--per_device_eval_batch_size", type=positive_int, default=16)
    p.add_argument("--max_eval_samples", type=positive_int, default=None, help="At most this many blocks per file.")
    p.add_argument(
        "--prompt",
        default=None,
        help="Text to continue greedily, with the KV cache and without it (the two must agree, else exit status 1).",
    )
    p.add_argument(
        "--max_new_tokens", type=positive_int, default=None, help="Tokens to generate after --prompt (default 32)."
    )
    p.add_argument("--output_file", default=None, help="Write the metrics as JSON here.")
    p.add_argument(
        "--lm_eval_tasks",
        default=None,
        metavar="TASK[,TASK]",
        help=f"Also run these lm-evaluation-harness tasks on local data (needs hfzoo[lm-eval]): {available_tasks()}.",
    )
    p.add_argument("--lm_eval_limit", type=positive_int, default=None, help="At most this many documents per task.")
    p.add_argument(
        "--data_dir",
        default=None,
        help="The data folder of --lm_eval_tasks, laid out as ../shared/data (default: $HFZOO_DATA_DIR, else that).",
    )
    args = p.parse_args(argv)
    if not (args.validation_file or args.lm_eval_tasks or args.prompt is not None):
        p.error("nothing to evaluate: give --validation_file, --lm_eval_tasks or --prompt")
    refuse_flags_without(
        p, args, {"max_new_tokens": "prompt", "lm_eval_limit": "lm_eval_tasks", "data_dir": "lm_eval_tasks"}
    )
    args.max_new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    return args


def main(argv: list[str] | None = None) -> dict:
    """Entry point of `hfzoo-evaluate-lm` and `recipes/evaluate_lm.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        `{file key: {"eval_loss", "perplexity", "blocks", "block_size", "tokens", "bytes", "bits_per_byte"}}`
        (see `text_size` and `bits_per_byte`; the key is the file's name, or its path where two files share a
        name: `validation_file_names`), plus `lm_eval` (`{task: {metric: value}}`, `run_lm_eval`) with
        `--lm_eval_tasks` and `sample` (`greedy_sample`'s record) with `--prompt`; also written to
        `--output_file` (the metrics before the sample is generated, then everything).

    Raises:
        SystemExit: bad input (one-line `error: ...`), among it a prompt plus `--max_new_tokens` beyond the
            model's position limit (before any evaluation), an unknown `--lm_eval_tasks` name or a missing task
            file, a `--validation_file` given twice, a `--text_column_name` that a `--validation_file` lacks or
            an empty `--prompt` (before the model is loaded), a masked LM (neither a causal LM nor an
            encoder-decoder); greedy generation with the KV cache differing from generation without it (after
            the record with both is written).
    """
    args = parse_evaluate_args(argv)
    with removed_if_refused(None if args.output_file is None else Path(args.output_file).expanduser().parent):
        return _evaluate(args)


def _check_eval_block_size(args: argparse.Namespace, config) -> int:
    """The block size to evaluate with: `--block_size`, else pretraining's (`all_results.json`), else the limit.

    Raises:
        ValueError: the block size exceeds the model's hard position limit (`generation_position_limit`).
    """
    block_size = args.block_size
    results_file = Path(args.model_name_or_path) / "all_results.json"
    if block_size is None and results_file.is_file():
        block_size = json.loads(results_file.read_text()).get("block_size")
    block_size = block_size or min(1024, getattr(config, "max_position_embeddings", None) or 1024)
    hard = generation_position_limit(config)
    if hard is not None and block_size > hard[0]:
        raise ValueError(
            f"--block_size {block_size} is larger than the model's max_position_embeddings={hard[0]} "
            f"(set by {hard[1]}); give --block_size {hard[0]} or less"
        )
    return block_size


def text_size(dataset: datasets.Dataset, tokenizer, text_column_name: str = "text") -> tuple[int, int]:
    """Tokens and UTF-8 bytes of the cleaned documents of `dataset`, as `tokenize_and_pack` tokenizes them.

    The tokens are those a language model predicts to produce each document: its tokens with the special
    tokens the tokenizer adds, less a leading bos token, which is context (hfzoo's decoder tokenizer starts
    every document with `<|endoftext|>`; the encoder-decoder tokenizer ends it with `</s>`, which is counted).

    Args:
        dataset: rows with a `text_column_name` column (one document per row).
        tokenizer: the model's tokenizer.
        text_column_name: the text column.

    Returns:
        `(tokens, bytes)`.
    """
    tokens = size = 0
    bos = tokenizer.bos_token_id
    for batch in dataset.iter(batch_size=16):
        texts = [clean_text(t) for t in batch[text_column_name] if t]
        texts = [t for t in texts if t.strip()]
        if not texts:
            continue
        size += sum(len(t.encode("utf-8")) for t in texts)
        for ids in tokenizer(texts, return_attention_mask=False)["input_ids"]:
            tokens += len(ids) - (1 if bos is not None and ids and ids[0] == bos else 0)
    return tokens, size


def seq2seq_batches(dataloader, start_token_id: int):
    """Turn batches of consecutive packed blocks into encoder-decoder batches, a block the decoder's target.

    Each block is the `labels` of its row; the encoder's input is the one token before the block in the
    token stream (the last token of the previous block), `start_token_id` before the first block.

    Args:
        dataloader: batches with `input_ids` `(batch_size, block_size)`, in the order of the packed stream.
        start_token_id: the encoder's input before the first block.

    Yields:
        `{"input_ids": (batch_size, 1), "attention_mask": (batch_size, 1), "labels": (batch_size, block_size)}`.
    """
    previous = None
    for batch in dataloader:
        blocks = batch["input_ids"]
        first = blocks.new_full((1, 1), start_token_id) if previous is None else previous
        encoder = torch.cat([first, blocks[:-1, -1:]], dim=0)
        previous = blocks[-1:, -1:]
        yield {"input_ids": encoder, "attention_mask": torch.ones_like(encoder), "labels": blocks}


#: Keys of `main`'s results that are not a validation file's.
RESULT_KEYS = ("lm_eval", "sample")


def validation_file_names(files: list[str]) -> dict[str, str]:
    """The key of each `--validation_file` in the results: its file name, or the path as given where two share it.

    Args:
        files: the paths as given, each file once (`hfzoo.data.loading.check_distinct_files`).

    Returns:
        `{path as given: key}`, the keys distinct and none of `RESULT_KEYS` (e.g. `wikitext-2/wiki.valid.tokens`
        and `wikitext-103/wiki.valid.tokens` keep their paths, where one name would have held only the last).
    """
    names = [Path(file).name for file in files]
    return {
        file: name if names.count(name) == 1 and name not in RESULT_KEYS else file for file, name in zip(files, names)
    }


def _check_lm_eval(args: argparse.Namespace) -> list[str]:
    """The `--lm_eval_tasks` names, their data and lm-eval itself checked (before the model is loaded)."""
    if args.lm_eval_tasks is None:
        return []
    tasks = parse_task_names(args.lm_eval_tasks)
    args.data_dir = args.data_dir or default_data_dir()
    check_task_data(tasks, args.data_dir)
    import_lm_eval()
    return tasks


def _evaluate(args: argparse.Namespace) -> dict:
    """`main` after parsing: every check before the first file is tokenized, then the evaluation."""
    try:
        if args.output_file:
            check_output_file(args.output_file)  # before any work: a run never ends unable to save its metrics
        check_distinct_files(None, args.validation_file)
        check_input_files(None, args.validation_file)
        names = validation_file_names(args.validation_file)
        if args.prompt == "":
            raise ValueError("--prompt is empty: give the text to continue, or leave --prompt out")
        tasks = _check_lm_eval(args)
    except (ValueError, FileNotFoundError, ImportError) as err:
        raise SystemExit(f"error: {err}") from None
    try:
        check_model_path(args.model_name_or_path)
        config = load_checkpoint_config(args.model_name_or_path)  # the message names the argument
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        if Path(args.model_name_or_path).is_dir():
            check_weight_files(args.model_name_or_path)  # names a truncated or corrupt weight file
        backend = harness_backend(config)
        if backend == "seq2seq" and args.prompt:
            raise ValueError("--prompt continues a prompt with a causal LM; this checkpoint is an encoder-decoder")
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --model_name_or_path {args.model_name_or_path}: {str(err).splitlines()[0]}") from None
    try:
        texts = {}  # every file read and its text column checked before the model is loaded
        for file in args.validation_file:
            texts[file] = load_local_files([file], "--validation_file", sample_by="document", check=False)
            check_text_column(texts[file], args.text_column_name, f"--validation_file {file}")
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        auto_class = AutoModelForSeq2SeqLM if backend == "seq2seq" else AutoModelForCausalLM
        model = auto_class.from_pretrained(args.model_name_or_path).eval()
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --model_name_or_path {args.model_name_or_path}: {str(err).splitlines()[0]}") from None
    if args.prompt:
        try:
            prompt_ids = tokenizer(args.prompt)["input_ids"]
            check_token_ids_fit(prompt_ids, model.config.vocab_size, len(tokenizer), "--prompt")
            check_generation_fits(model.config, len(prompt_ids), args.max_new_tokens)
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
    try:
        block_size = _check_eval_block_size(args, model.config)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    print(
        f"loaded {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) "
        f"from {args.model_name_or_path}"
    )
    evaluated = {}  # every file tokenized and its ids checked before the first is evaluated
    for file in args.validation_file:
        try:
            raw = datasets.DatasetDict(validation=texts[file])
            packed = tokenize_and_pack(raw, tokenizer, args.text_column_name, block_size)["validation"]
            if args.max_eval_samples:
                packed = packed.select(range(min(args.max_eval_samples, len(packed))))
            check_token_ids_fit(
                packed.with_format("numpy")["input_ids"],
                model.config.vocab_size,
                len(tokenizer),
                f"--validation_file {file}",
            )
        except (ValueError, FileNotFoundError) as err:
            raise SystemExit(f"error: {err}") from None
        evaluated[file] = raw, packed
    results = {}
    for file, (raw, packed) in evaluated.items():
        loader = DataLoader(
            packed.with_format("torch", device=device),
            batch_size=args.per_device_eval_batch_size,
            collate_fn=default_data_collator,
        )
        if backend == "seq2seq":
            start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            loader = seq2seq_batches(loader, start)
        metrics = evaluate_lm(model, loader)
        tokens, size = text_size(raw["validation"], tokenizer, args.text_column_name)
        metrics.update(blocks=len(packed), block_size=block_size, tokens=tokens, bytes=size)
        metrics["bits_per_byte"] = bits_per_byte(metrics["eval_loss"] * tokens, size)
        results[names[file]] = metrics
        print(
            f"{names[file]}: {len(packed)} blocks of {block_size} tokens, eval_loss {metrics['eval_loss']:.4f}, "
            f"perplexity {metrics['perplexity']:.2f}, bits per byte {metrics['bits_per_byte']:.4f} "
            f"({tokens} tokens, {size} bytes)"
        )
    if tasks:
        results["lm_eval"] = run_lm_eval(
            model, tokenizer, tasks, args.data_dir, block_size, args.per_device_eval_batch_size, args.lm_eval_limit
        )
        for task, metrics in results["lm_eval"].items():
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "documents")
            print(f"lm-eval {task} ({metrics['documents']} documents, window {block_size} tokens): {shown}")
    if args.output_file:  # the metrics are kept even if generating the sample fails
        write_json_atomic(args.output_file, results)
    if args.prompt:
        sample = results["sample"] = greedy_sample(model, tokenizer, args.prompt, args.max_new_tokens)
        print(f"sample (greedy, {sample['new_tokens']} new tokens): {sample['text']!r}")
        if args.output_file:
            write_json_atomic(args.output_file, results)
        if not sample["cache_equal"]:
            raise SystemExit(
                f"error: greedy generation with the KV cache differs from generation without it from new token "
                f"{sample['first_difference']} on: with the cache {sample['continuation']!r}, without "
                f"{sample['continuation_without_cache']!r}; the model's cached decoding is wrong"
            )
        print(f"cache check passed: the same {sample['new_tokens']} new tokens with and without the KV cache")
    return results


def cli() -> None:
    """Console script `hfzoo-evaluate-lm` (returns None: setuptools exits with what its function returns)."""
    main()


if __name__ == "__main__":
    main()
