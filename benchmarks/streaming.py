#!/usr/bin/env python
"""How soon pretraining data gives its first block, streamed (`--streaming`) and map-style, and at what memory.

    python benchmarks/streaming.py                       # Gutenberg shard 00, blocks of 1024 tokens
    python benchmarks/streaming.py --blocks 2000 --repeats 3

A byte-level BPE tokenizer (vocabulary 4,096, as README command 1's) is trained on the first 2M characters of
Gutenberg shard 01; then each case runs in a fresh process on shard 00 (184 books, 62M characters), with 1%
of its documents held out as `--streaming` does:

- `map-style`: `load_raw_datasets` + `tokenize_and_pack` (no `datasets` cache: a first run), the whole shard
  tokenized and packed before the first block exists;
- `streamed`: `load_raw_datasets(streaming=True)` + `stream_blocks`, as a `--streaming` run reads its data.

The table gives the median (and range) over `--repeats` of the seconds from the start of loading to the first
training block and to `--blocks` blocks, and the peak resident memory the case added after its imports
(`ru_maxrss`). Data: `--data_dir` (default `$HFZOO_DATA_DIR`, else `../shared/data` beside the checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("map-style", "streamed")


def run_case(case: str, shard: str, tokenizer: str, block_size: int, blocks: int) -> dict:
    """Load `shard` the `case` way in this process; the seconds to the first and `blocks`-th block, the peak MiB."""
    import resource
    import time

    from transformers import AutoTokenizer

    from hfzoo.data.loading import load_raw_datasets
    from hfzoo.data.packing import tokenize_and_pack
    from hfzoo.training.streaming import stream_blocks

    tok = AutoTokenizer.from_pretrained(tokenizer)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        streaming = case == "streamed"
        raw = load_raw_datasets([shard], validation_split_percentage=1, streaming=streaming, cache_dir=cache)
        if streaming:
            train = iter(stream_blocks(raw, tok, "text", block_size, True)[0])
        else:
            packed = tokenize_and_pack(raw, tok, "text", block_size, load_from_cache_file=False)["train"]
            train = iter(packed)
        next(train)
        first = time.perf_counter() - start
        for _ in range(blocks - 1):
            next(train)
        last = time.perf_counter() - start
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"case": case, "first_block_s": first, "blocks_s": last, "peak_mib": peak}


def main(argv: list[str] | None = None) -> list[dict]:
    """Train the tokenizer, run every case `--repeats` times (interleaved, fresh processes), print the table.

    Raises:
        SystemExit: no Gutenberg data under `--data_dir`, or a case that failed.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = os.environ.get("HFZOO_DATA_DIR", str(REPO.parent / "shared" / "data"))
    parser.add_argument("--data_dir", default=default_data, help="the real data (gutenberg/)")
    parser.add_argument("--block_size", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=800, help="blocks read in each case (16 x 50 by default)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child process
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gutenberg = Path(args.data_dir) / "gutenberg"
    shard = gutenberg / "pg_top100_en.00.jsonl.xz"
    if args.case:
        print(json.dumps(run_case(args.case, str(shard), args.tokenizer, args.block_size, args.blocks)))
        return []
    if not shard.exists():
        raise SystemExit(f"error: --data_dir {args.data_dir}: no {shard.name} in gutenberg/ (set HFZOO_DATA_DIR)")
    from hfzoo.data.loading import iter_texts, load_local_files
    from hfzoo.tokenization import train_bpe_tokenizer

    rows: dict[str, list[dict]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        texts, total = [], 0
        books = load_local_files([str(gutenberg / "pg_top100_en.01.jsonl.xz")], streaming=True)
        for batch in iter_texts(books, batch_size=4):  # cleaned texts
            texts += [t[:200_000] for t in batch]
            total = sum(map(len, texts))
            if total >= 2_000_000:
                break
        train_bpe_tokenizer([texts], vocab_size=4096).save_pretrained(tmp)
        for _ in range(args.repeats):
            for case in CASES:
                command = [sys.executable, __file__, "--case", case, "--tokenizer", tmp, "--data_dir", args.data_dir,
                           "--block_size", str(args.block_size), "--blocks", str(args.blocks)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
                if done.returncode:
                    raise SystemExit(f"error: case {case} failed:\n{done.stderr[-2000:]}")
                rows[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[case][-1], file=sys.stderr, flush=True)
    print(f"\nGutenberg shard 00, blocks of {args.block_size} tokens, {args.repeats} runs (median, min-max)\n")
    print(f"| data | s to the first block | s to {args.blocks} blocks | peak MiB |")
    print("|---|---:|---:|---:|")
    summary = []
    for case, results in rows.items():
        cells = []
        for key in ("first_block_s", "blocks_s", "peak_mib"):
            values = [r[key] for r in results]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"| {case} | " + " | ".join(cells) + " |")
        summary.append(
            {"case": case, **{k: statistics.median(r[k] for r in results) for k in results[0] if k != "case"}}
        )
    return summary


if __name__ == "__main__":
    main()
