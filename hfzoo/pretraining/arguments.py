"""Command-line arguments of the pretraining recipe: transformers' `run_clm_no_trainer.py` names, plus YAML.

`parse_pretrain_args(argv)` reads an optional `--config FILE.yaml` whose keys are argument names,
then lets command-line flags override it. Every value is checked here, before any data is loaded,
so that bad input fails in a second with a message naming the flag.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ..data.loading import check_distinct_files
from ..outputs import check_output_is_not_source
from ..training.arguments import (
    SCHEDULERS,
    OneLineErrorParser,
    adam_beta,
    add_ddp_timeout_argument,
    add_muon_arguments,
    add_speed_arguments,
    check_dependent_flags,
    check_muon_arguments,
    checkpointing_steps,
    float_in,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    random_seed,
    resolve_choice_flags,
    scheduler_kwargs,
)
from ..training.objectives import OBJECTIVES
from ..training.precision import MIXED_PRECISION_CHOICES
from ..yaml_input import load_yaml


class _ExtendAction(argparse.Action):
    """`--train_file a b --train_file c` -> `[a, b, c]` (repeatable and multi-valued)."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        # A list that came from a YAML default is replaced, not extended, by the command line.
        if current is None or getattr(namespace, f"_{self.dest}_from_cli", False) is False:
            current = []
        setattr(namespace, f"_{self.dest}_from_cli", True)
        setattr(namespace, self.dest, [*current, *values])


def build_pretrain_parser() -> argparse.ArgumentParser:
    """Return the parser of `recipes/pretrain.py` (see `--help` for each flag)."""
    p = OneLineErrorParser(
        prog="hfzoo-pretrain",
        description="Pretrain an hfzoo model (causal LM, masked LM or span corruption) with accelerate.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", type=str, default=None, help="YAML file of argument values (flags override it).")
    p.add_argument(
        "--objective",
        choices=list(OBJECTIVES),
        default="clm",
        help="clm: next-token prediction (decoder); mlm: BERT masked LM (encoder); span: T5 span corruption "
        "(encoder-decoder).",
    )
    objective = p.add_argument_group("objective")
    # None: not given (another objective's flags are refused; `parse_pretrain_args` fills in `Objective.flags`)
    objective.add_argument(
        "--mlm_probability",
        type=float_in(0, 1, low_open=True, high_open=True),
        default=None,
        help="mlm: fraction of tokens selected, in (0, 1) (default 0.15).",
    )
    objective.add_argument("--whole_word_mask", action="store_true", help="mlm: select whole words.")
    objective.add_argument(
        "--noise_density",
        type=float_in(0, 1, low_open=True, high_open=True),
        default=None,
        help="span: fraction of tokens corrupted, in (0, 1) (default 0.15).",
    )
    objective.add_argument(
        "--mean_noise_span_length",
        type=float_in(1, math.inf),
        default=None,
        help="span: mean span length, finite and >= 1 (default 3).",
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--train_file",
        nargs="+",
        action=_ExtendAction,
        default=None,
        help="Local training files (text, JSON lines, parquet; .xz/.gz/.bz2/.zst ok). Repeatable.",
    )
    data.add_argument(
        "--validation_file",
        nargs="+",
        action=_ExtendAction,
        default=None,
        help="Local validation files. Default: hold out --validation_split_percentage of train.",
    )
    data.add_argument("--dataset_name", type=str, default=None, help="Hub dataset name (instead of --train_file).")
    data.add_argument("--dataset_config_name", type=str, default=None, help="Hub dataset configuration.")
    data.add_argument("--text_column_name", type=str, default="text", help="Column holding the text.")
    data.add_argument(
        "--validation_split_percentage",
        type=_validation_percentage,
        default=5,
        help="Percent of training documents held out when no validation data is given (1 to 50).",
    )
    data.add_argument(
        "--block_size",
        type=positive_int,
        default=None,
        help="Tokens per training sequence. Default: min(1024, max_position_embeddings).",
    )
    data.add_argument(
        "--max_train_samples",
        type=positive_int,
        default=None,
        help="Keep at most this many training blocks (after packing).",
    )
    data.add_argument(
        "--max_eval_samples",
        type=positive_int,
        default=None,
        help="Keep at most this many validation blocks (after packing).",
    )
    data.add_argument(
        "--preprocessing_num_workers",
        type=positive_int,
        default=None,
        help="Processes for tokenization (datasets.map num_proc).",
    )
    data.add_argument("--overwrite_cache", action="store_true", help="Ignore datasets' cache of the tokenized data.")
    data.add_argument(
        "--streaming",
        action="store_true",
        help="Read, tokenize and pack the data on the fly (datasets streaming; for data larger than memory or "
        "disk); each process reads its own shard. Needs --max_train_steps.",
    )
    data.add_argument(
        "--no_clean_text",
        action="store_true",
        help="Do not normalise CRLF or strip Project Gutenberg boilerplate.",
    )
    model = p.add_argument_group("model")
    model.add_argument("--tokenizer_name", type=str, default=None, help="Tokenizer folder (or hub id).")
    model.add_argument(
        "--config_name",
        type=str,
        default=None,
        help="Model preset name (e.g. decoder-small) or config.json / checkpoint folder.",
    )
    model.add_argument(
        "--config_overrides",
        type=str,
        default=None,
        help='Config fields to change, e.g. "hidden_size=256,num_hidden_layers=4".',
    )
    model.add_argument(
        "--model_name_or_path",
        type=str,
        default=None,
        help="Start from these pretrained weights instead of a fresh model.",
    )
    model.add_argument("--attn_implementation", type=str, default="sdpa", help="eager, sdpa, flash_attention_2, ...")
    model.add_argument("--gradient_checkpointing", action="store_true", help="Recompute layers in backward.")
    add_speed_arguments(model)
    train = p.add_argument_group("training")
    train.add_argument("--per_device_train_batch_size", type=positive_int, default=8, help="Sequences per device.")
    train.add_argument("--per_device_eval_batch_size", type=positive_int, default=8, help="Sequences per device.")
    train.add_argument(
        "--gradient_accumulation_steps",
        type=positive_int,
        default=1,
        help="Micro-batches per optimizer step.",
    )
    train.add_argument("--learning_rate", type=positive_float, default=5e-4, help="Peak AdamW learning rate.")
    train.add_argument(
        "--weight_decay",
        type=non_negative_float,
        default=0.0,
        help="AdamW weight decay, >= 0 (not applied to biases, norms and embeddings' positions).",
    )
    train.add_argument("--adam_beta1", type=adam_beta, default=0.9, help="AdamW beta1, in [0, 1).")
    train.add_argument("--adam_beta2", type=adam_beta, default=0.999, help="AdamW beta2, in [0, 1).")
    train.add_argument(
        "--optim",
        choices=("adamw_torch_fused", "adamw_torch", "muon"),
        default="adamw_torch_fused",
        help="torch AdamW, fused (one kernel for all parameters; transformers' default) or foreach. "
        "Under DeepSpeed the foreach form is used: DeepSpeed steps the optimizer on its own partitions. "
        "muon: torch.optim.Muon (Jordan et al. 2024) for the nn.Linear weights of the hidden layers, AdamW "
        "(--learning_rate, --weight_decay, --adam_beta*) for embeddings, output layer, norms, biases and "
        "the rest; not with DeepSpeed or FSDP.",
    )
    add_muon_arguments(train)
    train.add_argument("--max_grad_norm", type=non_negative_float, default=1.0, help="Gradient clipping (0 disables).")
    train.add_argument(
        "--lr_scheduler_type",
        choices=SCHEDULERS,
        default="linear",
        help="transformers.get_scheduler name (warmup then decay).",
    )
    train.add_argument(
        "--lr_scheduler_kwargs",
        type=scheduler_kwargs,
        default={},
        help="The schedule's own arguments as JSON, e.g. '{\"min_lr_rate\": 0.1}' (cosine_with_min_lr) or "
        "'{\"num_decay_steps\": 100}' (warmup_stable_decay).",
    )
    train.add_argument("--num_warmup_steps", type=non_negative_int, default=0, help="Linear warmup steps.")
    train.add_argument(
        "--num_train_epochs",
        type=positive_int,
        default=1,
        help="Epochs (ignored when --max_train_steps is set).",
    )
    train.add_argument("--max_train_steps", type=positive_int, default=None, help="Optimizer steps in total.")
    train.add_argument("--eval_steps", type=positive_int, default=None, help="Evaluate every N steps (and at the end).")
    train.add_argument(
        "--mixed_precision",
        choices=MIXED_PRECISION_CHOICES,
        default="auto",
        help="auto (default): bf16 on a GPU or CPU that computes it natively (Ampere and later; AVX512-BF16 or AMX "
        "CPUs), else fp32, unless the accelerate config names bf16 or fp16 (hfzoo.training.precision); no: fp32.",
    )
    train.add_argument("--seed", type=random_seed, default=42, help="Random seed.")
    train.add_argument(
        "--max_nonfinite_steps",
        type=non_negative_int,
        default=0,
        help="Optimizer steps with a non-finite loss or gradient norm that may be skipped (not applied, logged) "
        "before the run stops; 0 stops at the first one.",
    )
    add_ddp_timeout_argument(train)
    train.add_argument(
        "--eval_seed",
        type=random_seed,
        default=None,
        help="Seed of the validation batches' random masking / span corruption (default: --seed). Fix it to "
        "compare runs of different seeds on the same held-out examples.",
    )
    out = p.add_argument_group("output")
    out.add_argument("--output_dir", type=str, required=False, default=None, help="Where to write the model.")
    out.add_argument(
        "--checkpointing_steps",
        type=checkpointing_steps,
        default=None,
        help="Save a resumable checkpoint every N steps, or 'epoch'.",
    )
    out.add_argument("--checkpoints_total_limit", type=positive_int, default=2, help="Keep the newest K checkpoints.")
    out.add_argument(
        "--resume_from_checkpoint",
        type=str,
        default=None,
        help="'latest' (the newest intact checkpoint in --output_dir) or a checkpoint folder. Resume with the "
        "arguments that wrote it: another model config, tokenizer, optimizer or data setting is refused; "
        "--max_train_steps and the evaluation, logging and checkpointing flags may change.",
    )
    out.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="Delete the checkpoints of an earlier run found in --output_dir and start over (without it, such a "
        "folder is refused unless --resume_from_checkpoint continues that run).",
    )
    out.add_argument("--with_tracking", action="store_true", help="Log metrics with accelerate's trackers.")
    out.add_argument(
        "--report_to",
        type=str,
        default=None,
        help="Tracker(s) of --with_tracking: tensorboard (default), wandb, all, ...",
    )
    out.add_argument("--logging_steps", type=positive_int, default=10, help="Log/progress-bar update interval.")
    out.add_argument("--push_to_hub", action="store_true", help="Upload the final model to the hub.")
    out.add_argument("--hub_model_id", type=str, default=None, help="Hub repo id (default: output_dir name).")
    out.add_argument("--hub_token", type=str, default=None, help="Hub token (default: the logged-in one).")
    out.add_argument(
        "--hub_private_repo",
        action="store_true",
        default=None,
        help="Create the hub repository private (default: the account's default visibility).",
    )
    out.add_argument(
        "--sample_prompt",
        type=str,
        default=None,
        help="After training, print a greedy continuation of this prompt.",
    )
    return p


def load_yaml_config(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Read a YAML file of argument values and check its keys.

    Args:
        path: the YAML file.
        parser: the parser whose destinations are the valid keys.

    Returns:
        `{dest: value}`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not valid YAML, not a mapping, or a key that is not an argument.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    values = load_yaml(file.read_text(), f"--config {path}") or {}
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of argument names to values")
    known = {a.dest for a in parser._actions}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"--config {path}: unknown keys {unknown}")
    for key in ("train_file", "validation_file"):
        if isinstance(values.get(key), str):
            values[key] = [values[key]]
    return values


def check_data_source(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse local files and a hub dataset together, and a hub configuration without its dataset.

    With both `--train_file` and `--dataset_name` the local files would be read and the hub dataset ignored;
    `--dataset_config_name` alone would be ignored.

    Raises:
        SystemExit: argparse's one-line error naming the flags.
    """
    if args.train_file and args.dataset_name:
        parser.error(
            f"--train_file and --dataset_name {args.dataset_name}: give one data source, local files or a hub dataset "
            "(the hub dataset would be ignored)"
        )
    if args.dataset_config_name and not args.dataset_name:
        parser.error(
            f"--dataset_config_name {args.dataset_config_name} is a configuration of --dataset_name: give both"
        )


def _validation_percentage(value: str) -> int:
    """Argparse type for `--validation_split_percentage`: an integer in [1, 50] (`load_raw_datasets`' range).

    Raises:
        argparse.ArgumentTypeError: not an integer, or outside [1, 50].
    """
    number = positive_int(value)
    if number > 50:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, 50], got {number}")
    return number


def parse_pretrain_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the recipe's arguments: YAML defaults (`--config`), then command-line flags.

    Values from YAML go through the same checks as flags (they are re-parsed as strings).

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The parsed namespace.

    Raises:
        SystemExit: (from argparse) an unknown flag or a bad value, with a message naming it; a data file given
            twice, or as both a training and a validation file (`check_distinct_files`); both `--train_file` and
            `--dataset_name`, or `--dataset_config_name` without `--dataset_name` (`check_data_source`); a flag
            given without the one it acts with (`check_dependent_flags`: `--hub_model_id` without `--push_to_hub`,
            ...); `--config_name` with `--model_name_or_path` on the command line (a `--config` file's
            `config_name` gives way to a `--model_name_or_path`); an `--output_dir` that is the `--model_name_or_path`
            folder (`check_output_is_not_source`).
        ValueError, FileNotFoundError: a bad YAML file.
    """
    parser = build_pretrain_parser()
    first, _ = parser.parse_known_args(argv)
    if first.config:
        values = load_yaml_config(first.config, parser)
        # Re-run each YAML value through its argparse type so YAML and flags are checked alike.
        actions = {a.dest: a for a in parser._actions}
        checked = {}
        for key, value in values.items():
            action = actions[key]
            if action.type is not None and value is not None and not isinstance(value, list):
                try:
                    value = action.type(str(value))
                except argparse.ArgumentTypeError as err:
                    parser.error(f"--config {first.config}: {key}: {err}")
            if action.choices is not None and value is not None and value not in action.choices:
                parser.error(f"--config {first.config}: {key}={value!r}; choose one of {list(action.choices)}")
            checked[key] = value
        parser.set_defaults(**checked)
    args = parser.parse_args(argv)
    for key in list(vars(args)):
        if key.startswith("_") and key.endswith("_from_cli"):
            delattr(args, key)
    resolve_choice_flags(parser, args, "objective", {o.name: o.flags for o in OBJECTIVES.values()})
    if args.output_dir is None:
        parser.error("--output_dir is required")
    if not args.train_file and not args.dataset_name:
        parser.error("give --train_file or --dataset_name")
    check_data_source(parser, args)
    if args.model_name_or_path is None and args.config_name is None:
        parser.error("give --config_name (a preset or config) or --model_name_or_path")
    if args.model_name_or_path is not None and args.config_name is not None:
        if first.config_name is not None:  # on the command line: it would be ignored
            parser.error(
                f"--config_name {args.config_name} and --model_name_or_path {args.model_name_or_path}: the model is "
                "built from its own config (its weights fit no other); give one of them"
            )
        args.config_name = None  # a --config file's model, replaced by the pretrained one given here
    if args.model_name_or_path is None and args.tokenizer_name is None:
        parser.error("give --tokenizer_name (train one with tokenizer_training/train_tokenizer.py)")
    if args.streaming and args.max_train_steps is None:
        parser.error("--streaming needs --max_train_steps (a stream's length is unknown)")
    try:
        check_distinct_files(args.train_file, args.validation_file)
        check_output_is_not_source(args.output_dir, args.model_name_or_path, "the trained model")
    except ValueError as err:
        parser.error(str(err))
    check_muon_arguments(args, parser)
    check_dependent_flags(parser, args)
    return args
