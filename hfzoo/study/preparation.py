"""What the study prepares once before its runs: the tokenizer, the tokenized data, the GLUE training subsets.

Each is made once per study folder (under the study lock) and reused by every run and every study process.
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import time
from pathlib import Path

from transformers import AutoTokenizer

from ..data.glue import get_glue_task
from ..outputs import write_text_atomic
from ..pretraining import pack_pretraining_data, parse_pretrain_args, train_tokenizer
from .arguments import pretrain_argv
from .settings import StudySettings, _glue_files
from .storage import PREPARATION_FILE, _read_json, _write_json


def ensure_tokenizer(settings: StudySettings, output_dir: Path) -> str:
    """The tokenizer folder of the study: `tokenizer_name`, or one trained once into `output_dir/tokenizer`.

    A trained tokenizer has the study family's special tokens (`hfzoo.tokenization.FAMILY_SPECIAL_TOKENS`).
    """
    if settings.tokenizer_name is not None:
        return settings.tokenizer_name
    folder = output_dir / "tokenizer"
    if (folder / "tokenizer_config.json").is_file():
        return str(folder)
    tmp = output_dir / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    files = settings.tokenizer_train_file or settings.train_file
    argv = [
        "--model_family",
        settings.family,
        "--vocab_size",
        str(settings.tokenizer_vocab_size),
        "--max_characters",
        str(settings.tokenizer_max_characters),
        "--output_dir",
        str(tmp),
    ]
    argv += ["--train_file", *files] if files else ["--dataset_name", settings.dataset_name]
    if not files and settings.dataset_config_name:
        argv += ["--dataset_config_name", settings.dataset_config_name]
    print(f"=== study tokenizer: hfzoo-train-tokenizer {shlex.join(argv)}", flush=True)
    start = time.perf_counter()
    train_tokenizer(argv)
    os.replace(tmp, folder)
    record = _read_json(output_dir / PREPARATION_FILE) or {}
    record["tokenizer_seconds"] = time.perf_counter() - start
    _write_json(output_dir / PREPARATION_FILE, record)
    return str(folder)


def ensure_pretraining_data(settings: StudySettings, output_dir: Path, tokenizer_dir: str, num_processes: int = 1):
    """Tokenize and pack the pretraining data once per study, before any run, into `datasets`' cache.

    The study's runs all read the same data with the same tokenizer and block size, so they all ask
    `datasets` for the same maps: this does them once (`hfzoo.pretraining.pack_pretraining_data`, the pretraining
    recipe's own call, with the study's arguments), and every run, every other study process on the folder and every
    rerun then loads the blocks from `datasets`' cache (its fingerprints are those of the data files, the
    tokenizer and the block size; the cache lives under `HF_DATASETS_CACHE`) instead of tokenizing again.
    Called under the study lock, so that parallel study processes do not tokenize the same data at once.
    With `pretrain_args: {streaming: true}` there is nothing to prepare (the stream is read by each run).

    Returns:
        `{"train_blocks", "validation_blocks", "seconds"}` (wall seconds of this call; a cache hit is fast),
        or None when streaming.
    """
    scratch = Path("/nonexistent-study-check")
    args = parse_pretrain_args(
        pretrain_argv(settings, tokenizer_dir, scratch / "config.json", 0, scratch, num_processes)
    )
    if args.streaming:
        return None
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    from ..training.objectives import get_objective

    objective = get_objective(args.objective)
    _, raw_block_size = objective.build_collator(args, tokenizer, args.block_size)
    print(f"=== study data: tokenized once into datasets' cache (blocks of {raw_block_size} tokens)", flush=True)
    packed = pack_pretraining_data(args, tokenizer, objective, raw_block_size)  # the recipe's own call
    seconds = time.perf_counter() - start
    prepared = {
        "train_blocks": len(packed["train"]),
        "validation_blocks": len(packed["validation"]),
        "seconds": seconds,
    }
    record = _read_json(output_dir / PREPARATION_FILE) or {}
    record.setdefault("data", prepared)  # the first preparation of the folder (later ones load the cache)
    _write_json(output_dir / PREPARATION_FILE, record)
    return prepared


def ensure_glue_subsets(settings: StudySettings, output_dir: Path) -> dict[str, Path | None]:
    """Write each task's fixed training subset (the same examples for every run) as a TSV in the task's layout.

    `glue_max_train_samples` rows drawn with `glue_subset_seed` from the task's `train.tsv` (all rows if
    fewer), in file order, header kept. Without `glue_data_dir` (hub data) there is no file to subset and
    the GLUE recipe draws `--max_train_samples` with the run's seed instead (value None).
    """
    if settings.glue_data_dir is None:
        return dict.fromkeys(settings.glue_tasks)
    folder = output_dir / "glue_train_subsets"
    folder.mkdir(parents=True, exist_ok=True)
    subsets = {}
    for task in settings.glue_tasks:
        path = folder / f"{task}.tsv"
        if not path.is_file():
            source = _glue_files(settings, task)[0]
            lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
            header, rows = ([], lines) if get_glue_task(task).header is not None else (lines[:1], lines[1:])
            rows = [r if r.endswith("\n") else r + "\n" for r in rows if r.strip()]
            keep = sorted(
                random.Random(settings.glue_subset_seed).sample(
                    range(len(rows)), min(len(rows), settings.glue_max_train_samples)
                )
            )
            write_text_atomic(path, "".join(header + [rows[i] for i in keep]))
        subsets[task] = path
    return subsets
