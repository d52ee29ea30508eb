r"""Train a byte-level BPE tokenizer on local files or a hub dataset, read as a stream.

The console script `hfzoo-train-tokenizer` (also `python -m hfzoo.pretraining.tokenizer`, or
`python tokenizer_training/train_tokenizer.py` from a checkout). Examples:
    hfzoo-train-tokenizer \
        --train_file shared/data/gutenberg/pg_top100_en.0[0-5].jsonl.xz \
        --vocab_size 32000 --model_family decoder --output_dir tokenizers/gutenberg-bpe-32k

    hfzoo-train-tokenizer --dataset_name wikitext \
        --dataset_config_name wikitext-103-raw-v1 --model_family encoder --output_dir tok-enc

Local files may be plain text (one row per line, line breaks kept), JSON lines or parquet, optionally
compressed (`.xz`, `.gz`, `.bz2`, `.zst`). Texts are cleaned (CRLF -> LF, Project Gutenberg licence
boilerplate removed) unless `--no_clean_text` is given. The tokenizer is saved with
`save_pretrained(output_dir)` and loads with `transformers.AutoTokenizer.from_pretrained(output_dir)`.
See `hfzoo.tokenization.train_bpe_tokenizer` for the model and each family's special tokens.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import datasets

from ..data.loading import check_distinct_files, check_text_column, iter_texts, load_local_files
from ..outputs import check_output_folder, removed_if_refused
from ..tokenization import FAMILY_SPECIAL_TOKENS, TextBatches, train_bpe_tokenizer
from .arguments import check_data_source

logger = logging.getLogger(__name__)

#: Encoded and printed after training, to show what the tokenizer does.
EXAMPLE_TEXT = "“It was the best of times,” he said—\nit was the worst of times. Café 1848!"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the arguments of `hfzoo-train-tokenizer` (see `--help`).

    Raises:
        SystemExit: an argparse error, among them `--num_extra_ids` with a family other than encoder-decoder
            (only span corruption uses sentinel tokens), a `--train_file` given twice (`check_distinct_files`), and
            both `--train_file` and `--dataset_name` or `--dataset_config_name` alone (`check_data_source`).
    """
    parser = argparse.ArgumentParser(prog="hfzoo-train-tokenizer", description=__doc__.split("\n\n")[0])
    data = parser.add_argument_group("data")
    data.add_argument(
        "--train_file",
        action="extend",
        nargs="+",
        default=None,
        help="local training file(s): text / JSON lines / parquet, optionally compressed. Repeatable, "
        "and several paths may follow one flag.",
    )
    data.add_argument("--dataset_name", default=None, help="a hub dataset (used when --train_file is not given)")
    data.add_argument("--dataset_config_name", default=None, help="the hub dataset's configuration")
    data.add_argument("--dataset_split", default="train", help="the hub dataset's split (default: train)")
    data.add_argument("--text_column_name", default="text", help="column holding the text (default: text)")
    data.add_argument("--max_documents", type=int, default=None, help="read at most this many documents")
    data.add_argument("--max_characters", type=int, default=None, help="read at most this many characters")
    data.add_argument(
        "--no_clean_text",
        action="store_true",
        help="train on the raw text (no CRLF normalisation, no Project Gutenberg boilerplate removal)",
    )

    model = parser.add_argument_group("tokenizer")
    model.add_argument("--vocab_size", type=int, default=32000, help="vocabulary size incl. special tokens")
    model.add_argument("--min_frequency", type=int, default=2, help="minimum count of a pair to be merged")
    model.add_argument(
        "--model_family",
        choices=sorted(FAMILY_SPECIAL_TOKENS),
        default="decoder",
        help="which family's special tokens and post-processor to use (default: decoder)",
    )
    model.add_argument(
        "--num_extra_ids",
        type=int,
        default=None,
        help="sentinel tokens <extra_id_N> of span corruption (encoder-decoder only; default 100)",
    )
    for role in ("bos", "eos", "pad", "unk", "cls", "sep", "mask"):
        model.add_argument(f"--{role}_token", default=None, help=f"override the family's {role} token")
    model.add_argument(
        "--additional_special_tokens", nargs="*", default=None, help="further special tokens (never split)"
    )
    parser.add_argument("--output_dir", required=True, help="where save_pretrained writes the tokenizer")
    args = parser.parse_args(argv)
    if args.num_extra_ids is None:
        args.num_extra_ids = 100 if args.model_family == "encoder-decoder" else 0
    elif args.model_family != "encoder-decoder":
        parser.error(
            f"--num_extra_ids {args.num_extra_ids}: sentinel tokens are for --model_family encoder-decoder "
            f"(span corruption), not {args.model_family}"
        )
    try:
        check_distinct_files(args.train_file)  # a file twice would count its pairs twice
    except ValueError as err:
        parser.error(str(err))
    check_data_source(parser, args)
    return args


def load_text_dataset(args: argparse.Namespace) -> tuple[datasets.IterableDataset, str]:
    """Open the training data as a stream; return it with a description for messages.

    Raises:
        ValueError: neither `--train_file` nor `--dataset_name`, or unreadable local files.
        FileNotFoundError: a missing local file.
    """
    if args.train_file:
        return load_local_files(args.train_file, "--train_file", streaming=True), f"--train_file {args.train_file}"
    if args.dataset_name:
        dataset = datasets.load_dataset(
            args.dataset_name, args.dataset_config_name, split=args.dataset_split, streaming=True
        )
        return dataset, f"--dataset_name {args.dataset_name} (split {args.dataset_split})"
    raise ValueError("give --train_file (local files) or --dataset_name (a hub dataset)")


def train(args: argparse.Namespace) -> None:
    """Train the tokenizer `args` describe, save it to `--output_dir` with its statistics, and show an example.

    Raises:
        ValueError, OSError: bad input (a missing text column, missing files, an unreachable hub, an `--output_dir`
            that holds a model).
    """
    check_output_folder(args.output_dir)  # before reading any text: a run never ends unable to save
    if (Path(args.output_dir) / "config.json").is_file():
        raise ValueError(
            f"--output_dir {args.output_dir}: holds a model (config.json); a tokenizer trained there would replace the "
            "one the model was trained with; give another --output_dir"
        )
    dataset, source = load_text_dataset(args)
    check_text_column(dataset, args.text_column_name, source)
    texts = TextBatches(
        iter_texts(dataset, args.text_column_name, batch_size=32, clean=not args.no_clean_text, source=source),
        max_documents=args.max_documents,
        max_characters=args.max_characters,
    )
    logger.info(
        "training a %s byte-level BPE tokenizer (vocab_size=%d, min_frequency=%d) on %s",
        args.model_family,
        args.vocab_size,
        args.min_frequency,
        source,
    )
    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        texts,
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        model_family=args.model_family,
        bos_token=args.bos_token,
        eos_token=args.eos_token,
        pad_token=args.pad_token,
        unk_token=args.unk_token,
        cls_token=args.cls_token,
        sep_token=args.sep_token,
        mask_token=args.mask_token,
        additional_special_tokens=args.additional_special_tokens,
        num_extra_ids=args.num_extra_ids,
    )
    seconds = time.perf_counter() - start
    logger.info(
        "read %d documents, %d characters (%s); trained in %.1f s",
        texts.documents,
        texts.characters,
        "raw" if args.no_clean_text else "cleaned",
        seconds,
    )

    output_dir = Path(args.output_dir)
    tokenizer.save_pretrained(output_dir)
    stats = {
        "documents": texts.documents,
        "characters": texts.characters,
        "training_seconds": round(seconds, 3),
    }
    with open(output_dir / "tokenizer_training_args.json", "w", encoding="utf-8") as f:
        json.dump({"args": vars(args), "data": stats, "vocab_size": len(tokenizer)}, f, indent=2)
    logger.info("saved the tokenizer to %s", output_dir)

    encoding = tokenizer(EXAMPLE_TEXT)
    print(f"vocabulary size: {len(tokenizer)}")
    print(f"example: {EXAMPLE_TEXT!r}")
    print(f"  tokens: {tokenizer.convert_ids_to_tokens(encoding['input_ids'])}")
    print(f"  input_ids: {encoding['input_ids']}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of `hfzoo-train-tokenizer` and `tokenizer_training/train_tokenizer.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Raises:
        SystemExit: bad input, with a one-line `error: ...` message.
    """
    args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logger.setLevel(logging.INFO)
    try:
        with removed_if_refused(args.output_dir):  # a refused run leaves no empty output folder behind
            train(args)
    except (ValueError, OSError) as e:  # bad input (OSError includes missing files and an unreachable hub)
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
