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

`--loop` times a training loop's view of the streamed data instead: `--steps` steps of `--batch_size` blocks,
each step taking its batch and then waiting `--step_ms` milliseconds (a device computing the step while the
host waits for it, as at the loop's per-step read of the gradient norm), in two cases:

- `read in the loop`: the stream's batches read on the loop's own thread (the documents tokenized when the
  loop asks for the next block);
- `read ahead`: `StreamingTrainLoader`, which reads, tokenizes and packs on a thread of its own.

It gives the loop's tokens/s after its first batch and the seconds the loop waited for data. A
`--step_ms` of 35 is the `gpt2` preset's 16 x 1024-token step at 40% of an H100's bf16 peak.

    python benchmarks/streaming.py --loop --steps 300 --step_ms 35
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
LOOP_CASES = ("read in the loop", "read ahead")


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


def run_loop_case(
    case: str, shard: str, tokenizer: str, block_size: int, batch_size: int, steps: int, step_ms: float
) -> dict:
    """`steps` steps of a loop over the streamed training split read the `case` way, each waiting `step_ms`."""
    import time
    from types import SimpleNamespace

    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    from hfzoo.data.loading import load_raw_datasets
    from hfzoo.training.streaming import StreamingTrainLoader, stream_blocks

    tok = AutoTokenizer.from_pretrained(tokenizer)
    raw = load_raw_datasets([shard], validation_split_percentage=1, streaming=True)
    train = stream_blocks(raw, tok, "text", block_size, True)[0]
    if case == "read ahead":
        loader = StreamingTrainLoader(train, batch_size, SimpleNamespace(process_index=0, num_processes=1))
    else:
        loader = DataLoader(train, batch_size=batch_size, collate_fn=list)
    batches = iter(loader)
    next(batches)
    waited, start = 0.0, time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        batch = next(batches)
        waited += time.perf_counter() - asked
        assert len(batch) == batch_size
        time.sleep(step_ms / 1000)
    seconds = time.perf_counter() - start
    return {"case": case, "tokens_per_s": steps * batch_size * block_size / seconds, "waited_s": waited,
            "loop_s": seconds}  # fmt: skip


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
    parser.add_argument("--loop", action="store_true", help="time a training loop's view instead (see above)")
    parser.add_argument("--steps", type=int, default=300, help="--loop: steps after the first batch")
    parser.add_argument("--step_ms", type=float, default=35.0, help="--loop: the device's milliseconds per step")
    parser.add_argument("--batch_size", type=int, default=16, help="--loop: blocks per step")
    parser.add_argument("--case", choices=CASES + LOOP_CASES, help=argparse.SUPPRESS)  # one case, in a child process
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gutenberg = Path(args.data_dir) / "gutenberg"
    shard = gutenberg / "pg_top100_en.00.jsonl.xz"
    if args.case in LOOP_CASES:
        result = run_loop_case(args.case, str(shard), args.tokenizer, args.block_size, args.batch_size, args.steps,
                               args.step_ms)  # fmt: skip
        print(json.dumps(result))
        return []
    if args.case:
        print(json.dumps(run_case(args.case, str(shard), args.tokenizer, args.block_size, args.blocks)))
        return []
    cases = LOOP_CASES if args.loop else CASES
    if not shard.exists():
        raise SystemExit(f"error: --data_dir {args.data_dir}: no {shard.name} in gutenberg/ (set HFZOO_DATA_DIR)")
    from hfzoo.data.loading import iter_texts, load_local_files
    from hfzoo.tokenization import train_bpe_tokenizer

    rows: dict[str, list[dict]] = {case: [] for case in cases}
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
            for case in cases:
                command = [sys.executable, __file__, "--case", case, "--tokenizer", tmp, "--data_dir", args.data_dir,
                           "--block_size", str(args.block_size), "--blocks", str(args.blocks), "--steps",
                           str(args.steps), "--step_ms", str(args.step_ms),
                           "--batch_size", str(args.batch_size)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
                if done.returncode:
                    raise SystemExit(f"error: case {case} failed:\n{done.stderr[-2000:]}")
                rows[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[case][-1], file=sys.stderr, flush=True)
    print(f"\nGutenberg shard 00, blocks of {args.block_size} tokens, {args.repeats} runs (median, min-max)\n")
    if args.loop:
        print(
            f"{args.steps} steps of {args.batch_size} blocks, each waiting {args.step_ms:g} ms for the device; "
            f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}\n"
        )
        print("| data | loop tokens/s | s waiting for data | loop s |")
        keys = ("tokens_per_s", "waited_s", "loop_s")
    else:
        print(f"| data | s to the first block | s to {args.blocks} blocks | peak MiB |")
        keys = ("first_block_s", "blocks_s", "peak_mib")
    print("|---|---:|---:|---:|")
    summary = []
    for case, results in rows.items():
        cells = []
        for key in keys:
            values = [r[key] for r in results]
            spec = ",.0f" if key == "tokens_per_s" else ".1f"
            cells.append(f"{statistics.median(values):{spec}} ({min(values):{spec}}-{max(values):{spec}})")
        print(f"| {case} | " + " | ".join(cells) + " |")
        summary.append(
            {"case": case, **{k: statistics.median(r[k] for r in results) for k in results[0] if k != "case"}}
        )
    return summary


if __name__ == "__main__":
    main()
