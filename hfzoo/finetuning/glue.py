"""GLUE finetuning (Wang et al. 2019) with LoRA, prefix tuning or full finetuning, behind `recipes/finetune_glue.py`.

Arguments follow transformers' `examples/pytorch/text-classification/run_glue_no_trainer.py`
(`--model_name_or_path`, `--task_name`, `--train_file`, `--validation_file`, `--max_length`,
`--pad_to_max_length`, `--per_device_train_batch_size`, `--learning_rate`, `--num_train_epochs`,
`--max_train_steps`, `--seed`, `--output_dir`, `--with_tracking`, `--push_to_hub`, ...) plus
`--group_by_length` (as transformers' `TrainingArguments`), `--data_dir` (a folder in the GLUE layout),
`--max_train_samples`, `--mixed_precision` and the PEFT options (`--peft lora|prefix|none`, `--lora_r`,
`--lora_alpha`, `--lora_dropout`, `--target_modules`, `--num_virtual_tokens`, `--prefix_projection`,
`--prefix_hidden_size`) and `--optim adamw_torch|muon` (Muon, with `--muon_*` settings, for full finetuning
only: `--peft none`). Every input is checked
before the model is loaded; errors are one line.

Training shows a tqdm progress bar, logs every `--logging_steps`, evaluates after every epoch and
keeps the weights of the best epoch by the task's main metric (`GlueTask.main_metric`; the last epoch's
with `--save_last_epoch`). `--checkpointing_steps N|epoch` writes resumable checkpoints under
`checkpoints/step_N`; `--resume_from_checkpoint PATH|latest` continues exactly where one left off
(model, optimizer, scheduler, RNG and data order restored, partly done epochs skipped batch by batch).

Outputs in `--output_dir`: the adapter (PEFT; classification head included) or the full model, the
tokenizer, `eval_results.json` (the saved epoch's dev metrics as `eval_<metric>`, MNLI's mismatched
dev set as `eval_<metric>_mm`), `all_results.json` (the same, the last epoch's as
`last_epoch_eval_<metric>`, the best epoch, trainable parameters and fraction, steps, wall time),
`train_history.json` (training records and dev metrics after every epoch), `training_curves.png`, and
a model card (`README.md`), also for stock transformers checkpoints; `--push_to_hub` uploads the folder.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import os
import time
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

from ..data.glue import GLUE_TASKS, GlueTask, get_glue_task, glue_files, load_glue
from ..data.loading import check_distinct_files
from ..data.sampling import EpochLengthGroupedSampler
from ..hub import check_model_path, load_checkpoint_config
from ..integrity import check_weight_files
from ..outputs import check_output_folder, check_output_is_not_source, removed_if_refused
from ..training import faults
from ..training.accelerator import choose_mixed_precision, create_accelerator
from ..training.arguments import (
    SCHEDULERS,
    OneLineErrorParser,
    add_ddp_timeout_argument,
    add_muon_arguments,
    add_speed_arguments,
    check_dependent_flags,
    check_hub_repository,
    check_muon_arguments,
    check_scheduler_arguments,
    checkpointing_steps,
    finite_float,
    missing_packages_refused,
    muon_settings,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    random_seed,
    resolve_choice_flags,
    scheduler_kwargs,
)
from ..training.checkpointing import (
    base_model_record,
    check_resume_base_model,
    check_resume_optimizer,
    complete_checkpoints,
    delete_earlier_checkpoints,
    newly_initialized_keys,
    refuse_earlier_checkpoints,
)
from ..training.compilation import compile_model
from ..training.optimization import create_optimizer, create_scheduler, warmup_outlasts_training
from ..training.precision import MIXED_PRECISION_CHOICES
from ..training.throughput import SequenceClassificationFlops, Throughput, resolve_peak_tflops
from .adapters import (
    PEFT_METHODS,
    build_peft_config,
    check_prefix_fits,
    count_parameters,
    wrap_with_peft,
)
from .loop import (
    GLUE_STATE,
    GlueRun,
    check_glue_resume_arguments,
    check_glue_resume_layout,
    resolve_glue_resume,
    train_glue,
)
from .outputs import glue_results, save_glue_outputs

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "build_glue_model",
    "build_glue_parser",
    "load_glue_data",
    "main",
    "parse_glue_args",
    "prepare_glue",
    "resolve_max_length",
    "run_glue",
]


#: `--max_length` when not given (run_glue's `max_seq_length`), lowered to a smaller model's position table.
DEFAULT_MAX_LENGTH = 128


def resolve_max_length(config, max_length: int | None) -> int:
    """The tokens per example: `--max_length`, or its default within the model's position table.

    Truncation to `max_length` keeps examples within the position table only when `max_length` itself fits
    there: a longer one would fail mid-training at the first example over `max_position_embeddings` tokens.

    Args:
        config: the model config; a config without `max_position_embeddings` (T5's relative positions) or with
            `position_embedding_type="none"` has no limit.
        max_length: `--max_length` (tokens), or None for `DEFAULT_MAX_LENGTH`.

    Returns:
        `max_length` when given; otherwise `min(DEFAULT_MAX_LENGTH, max_position_embeddings)`.

    Raises:
        ValueError: a given `max_length` longer than `max_position_embeddings`; the message gives both numbers.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None or getattr(config, "position_embedding_type", None) == "none":
        return max_length or DEFAULT_MAX_LENGTH
    if max_length is None:
        return min(DEFAULT_MAX_LENGTH, limit)
    if max_length > limit:
        raise ValueError(
            f"--max_length {max_length} is longer than the model's max_position_embeddings={limit}; "
            f"use --max_length <= {limit}"
        )
    return max_length


def build_glue_parser() -> argparse.ArgumentParser:
    """Return the argument parser of `recipes/finetune_glue.py` (run_glue_no_trainer names + PEFT options)."""
    p = OneLineErrorParser(prog="hfzoo-finetune-glue", description="Finetune a model on a GLUE task (PEFT or full).")
    p.add_argument("--task_name", required=True, help=f"one of {sorted(GLUE_TASKS)}")
    p.add_argument("--model_name_or_path", required=True, help="hfzoo or transformers checkpoint (folder or hub id)")
    p.add_argument("--data_dir", default=None, help="folder in the GLUE layout (<dir>/SST-2/train.tsv, ...)")
    p.add_argument("--train_file", default=None, help="training file: TSV in the task's GLUE layout, CSV or JSON")
    p.add_argument("--validation_file", default=None, help="dev file: TSV in the task's GLUE layout, CSV or JSON")
    p.add_argument(
        "--max_length",
        type=positive_int,
        default=None,
        help=f"tokens per example after truncation (default {DEFAULT_MAX_LENGTH}, or the model's "
        "max_position_embeddings when smaller; a larger value than that is refused)",
    )
    p.add_argument("--pad_to_max_length", action="store_true", help="pad every batch to --max_length")
    p.add_argument(
        "--group_by_length",
        action="store_true",
        help="batch training examples of similar length together (less padding; transformers' LengthGroupedSampler)",
    )
    p.add_argument("--per_device_train_batch_size", type=positive_int, default=32)
    p.add_argument("--per_device_eval_batch_size", type=positive_int, default=128)
    p.add_argument("--learning_rate", type=positive_float, default=5e-5)
    p.add_argument("--weight_decay", type=non_negative_float, default=0.0, help="AdamW weight decay, >= 0")
    p.add_argument(
        "--optim",
        choices=("adamw_torch", "muon"),
        default="adamw_torch",
        help="adamw_torch: AdamW for every parameter; muon (with --peft none only): torch.optim.Muon for the "
        "nn.Linear weights of an hfzoo model's hidden layers, AdamW for embeddings, head, norms and biases",
    )
    add_muon_arguments(p)
    p.add_argument("--max_grad_norm", type=finite_float, default=1.0, help="gradient clipping (0 or less: none)")
    p.add_argument("--num_train_epochs", type=positive_int, default=3)
    p.add_argument("--max_train_steps", type=positive_int, default=None, help="overrides --num_train_epochs")
    p.add_argument("--gradient_accumulation_steps", type=positive_int, default=1)
    p.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default="linear")
    p.add_argument(
        "--lr_scheduler_kwargs",
        type=scheduler_kwargs,
        default={},
        help="the schedule's own arguments as JSON, e.g. '{\"min_lr_rate\": 0.1}' for cosine_with_min_lr",
    )
    p.add_argument("--num_warmup_steps", type=non_negative_int, default=0)
    p.add_argument("--max_train_samples", type=positive_int, default=None, help="use a seeded random subset")
    p.add_argument("--max_eval_samples", type=positive_int, default=None)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--logging_steps", type=positive_int, default=50, help="log the training loss every N steps")
    p.add_argument(
        "--checkpointing_steps",
        type=checkpointing_steps,
        default=None,
        help="save a resumable checkpoint every N steps, or 'epoch' (after each epoch's evaluation)",
    )
    p.add_argument(
        "--checkpoints_total_limit", type=positive_int, default=2, help="keep the newest K checkpoints (default 2)"
    )
    p.add_argument(
        "--max_nonfinite_steps",
        type=non_negative_int,
        default=0,
        help="optimizer steps with a non-finite loss or gradient norm that may be skipped (not applied, logged) "
        "before the run stops (exit status 76); 0 stops at the first one",
    )
    add_ddp_timeout_argument(p)
    p.add_argument(
        "--resume_from_checkpoint",
        default=None,
        help="a checkpoint folder, or 'latest' in --output_dir; resume with the arguments that wrote it (other batch, "
        "optimizer, task, data or adapter settings are refused; --max_train_steps and --num_train_epochs may change)",
    )
    p.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="delete the checkpoints of an earlier run found in --output_dir and start over (without it, such a "
        "folder is refused unless --resume_from_checkpoint continues that run)",
    )
    p.add_argument(
        "--save_last_epoch",
        action="store_true",
        help="save the last epoch's weights (default: the best epoch's by the task's main metric)",
    )
    p.add_argument("--seed", type=random_seed, default=42)
    p.add_argument(
        "--mixed_precision",
        choices=MIXED_PRECISION_CHOICES,
        default="auto",
        help="auto (default): bf16 where the GPU or CPU computes it natively, else fp32 (hfzoo.training.precision)",
    )
    p.add_argument("--attn_implementation", default=None, help="eager | sdpa | ... (default: the model's)")
    p.add_argument("--ignore_mismatched_sizes", action="store_true", help="re-initialise a head of another size")
    p.add_argument("--trust_remote_code", action="store_true")
    add_speed_arguments(p)
    p.add_argument("--with_tracking", action="store_true", help="log to --report_to (tensorboard)")
    p.add_argument("--report_to", default=None, help="tracker(s) of --with_tracking: tensorboard (default), wandb, ...")
    p.add_argument("--push_to_hub", action="store_true")
    p.add_argument("--hub_model_id", default=None)
    p.add_argument("--hub_token", default=None)
    p.add_argument("--hub_private_repo", action="store_true", default=None, help="create the hub repository private")
    g = p.add_argument_group("PEFT")
    g.add_argument("--peft", choices=PEFT_METHODS, default="lora", help="lora | prefix | none (full finetuning)")
    # None: not given (each method's flags are refused with another --peft; `parse_glue_args` fills the defaults)
    g.add_argument("--lora_r", type=positive_int, default=None, help="--peft lora: the rank (default 8)")
    g.add_argument("--lora_alpha", type=positive_float, default=None, help="--peft lora: the scale (default 16)")
    g.add_argument("--lora_dropout", type=float, default=None, help="--peft lora: dropout in [0, 1) (default 0.1)")
    g.add_argument("--target_modules", nargs="+", default=None, help="--peft lora: modules (default: per family)")
    g.add_argument(
        "--num_virtual_tokens", type=positive_int, default=None, help="--peft prefix: prefix length (default 20)"
    )
    g.add_argument("--prefix_projection", action="store_true", help="--peft prefix: reparametrize it with an MLP")
    g.add_argument("--prefix_hidden_size", type=positive_int, default=None, help="hidden size of that MLP")
    return p


#: The flags of each PEFT method and their defaults (a flag of another method than `--peft` is refused).
PEFT_METHOD_FLAGS = {
    "lora": {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": None},
    "prefix": {"num_virtual_tokens": 20, "prefix_projection": False, "prefix_hidden_size": None},
}


def parse_glue_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the arguments (the task name, data sources, dropout ranges).

    Raises:
        SystemExit: an argparse error (one line), a bad `--muon_*` value, a `--muon_*` flag without
            `--optim muon`, `--optim muon` with PEFT (`--peft` other than `none`), a LoRA or prefix flag with
            another `--peft` (`PEFT_METHOD_FLAGS`), `--prefix_hidden_size` without `--prefix_projection`, or a
            `--validation_file` that is the `--train_file` (`check_distinct_files`), a flag given without the one it
            acts with (`check_dependent_flags`: `--hub_model_id` without `--push_to_hub`, ...), or an `--output_dir`
            that is the `--model_name_or_path` folder (`check_output_is_not_source`).
        ValueError: an unknown task; `--lora_dropout` outside [0, 1).
    """
    parser = build_glue_parser()
    args = parser.parse_args(argv)
    get_glue_task(args.task_name)
    check_muon_arguments(args, parser)
    if args.optim == "muon" and args.peft != "none":
        # LoRA's low-rank factors and prefix tuning's prefixes are not the hidden layers' weight matrices Muon is for.
        parser.error(f"--optim muon needs --peft none (full finetuning), got --peft {args.peft}")
    resolve_choice_flags(parser, args, "peft", PEFT_METHOD_FLAGS)
    check_dependent_flags(parser, args)
    if args.prefix_hidden_size is not None and not args.prefix_projection:
        parser.error("--prefix_hidden_size is the hidden size of --prefix_projection's MLP: give both or neither")
    if args.train_file is not None and args.validation_file is not None:
        try:
            check_distinct_files([args.train_file], [args.validation_file])
        except ValueError as err:
            parser.error(str(err))
    try:
        check_output_is_not_source(args.output_dir, args.model_name_or_path, "the finetuned model or adapter")
    except ValueError as err:
        parser.error(str(err))
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ValueError(f"--lora_dropout must be in [0, 1), got {args.lora_dropout}")
    return args


def _tokenize(dataset, task: GlueTask, tokenizer, args: argparse.Namespace):
    def encode(batch: dict[str, list]) -> dict[str, list]:
        texts = [batch[name] for name in task.text_names]
        encoded = tokenizer(
            *texts,
            padding="max_length" if args.pad_to_max_length else False,
            max_length=args.max_length,
            truncation=True,
        )
        encoded["labels"] = batch["label"]
        return encoded

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenize")


def load_glue_data(args: argparse.Namespace, task: GlueTask, tokenizer, accelerator: Accelerator) -> dict[str, Any]:
    """Read the task's train and dev splits, take the requested subsets, and tokenize them.

    Args:
        args: `data_dir` / `train_file` / `validation_file`, `max_train_samples` (a seeded random
            subset), `max_eval_samples` (the first rows), `max_length` (as `resolve_max_length` gives it; None
            is refused), `pad_to_max_length`, `seed`.
        task: the GLUE task.
        tokenizer: the model's tokenizer.
        accelerator: the main process tokenizes first (datasets' cache serves the others).

    Returns:
        `{split: tokenized datasets.Dataset}` with `train` and the dev splits (`validation`, or MNLI's
        `validation_matched` and `validation_mismatched`); columns are the tokenizer's plus `labels`.

    Raises:
        ValueError, FileNotFoundError: missing files or bad rows (see `hfzoo.data.glue.load_glue`); `max_length`
            None (`prepare_glue` resolves it).
    """
    if args.max_length is None:
        raise ValueError("load_glue_data needs args.max_length: resolve it with resolve_max_length(config, ...)")
    raw = load_glue(task, args.data_dir, args.train_file, args.validation_file)
    if args.max_train_samples is not None and args.max_train_samples < len(raw["train"]):
        raw["train"] = raw["train"].shuffle(seed=args.seed).select(range(args.max_train_samples))
    if args.max_eval_samples is not None:
        for split in _eval_splits(raw):
            raw[split] = raw[split].select(range(min(args.max_eval_samples, len(raw[split]))))
    with accelerator.main_process_first():
        return {split: _tokenize(ds, task, tokenizer, args) for split, ds in raw.items()}


def drop_unused_columns(encoded: dict[str, Any], model, accelerator: Accelerator) -> dict[str, Any]:
    """Drop the tokenizer outputs that the model's `forward` does not name, as `Trainer` does.

    A tokenizer may return inputs the model has no use for (a BERT tokenizer's `token_type_ids` for a decoder
    without segment embeddings); hfzoo models refuse keywords they do not use, so the columns are removed
    here, by the rule of transformers' `Trainer` (`remove_unused_columns`: the parameters `forward` names, and
    `labels`), and the removed ones are printed.

    Args:
        encoded: `{split: tokenized datasets.Dataset}` (`load_glue_data`).
        model: the model the batches are given to (the base model under PEFT).
        accelerator: prints the removed columns once.

    Returns:
        The same splits without the unused columns.
    """
    names = set(inspect.signature(model.forward).parameters) | {"labels"}
    unused = sorted({column for ds in encoded.values() for column in ds.column_names} - names)
    if unused:
        accelerator.print(f"not given to the model (its forward does not take them): {', '.join(unused)}")
    return {split: ds.remove_columns([c for c in unused if c in ds.column_names]) for split, ds in encoded.items()}


def check_encoded_inputs(encoded: dict[str, Any], config, pad_token_id: int | None) -> None:
    """Refuse, before training, token ids, token types or class labels the model cannot take.

    One pass over the train and dev splits (their Arrow columns, the rows a `select` or `shuffle` kept): every
    `input_ids` value and the collator's padding id in `[0, vocab_size)`, every `token_type_ids` value in
    `[0, type_vocab_size)` (models with token type embeddings), every integer label in `[0, num_labels)` (or -100),
    and for an encoder-decoder an `eos_token_id` in every row (its classifier pools the decoder's state at the
    last one). The loop then runs its forwards inside `caller_checked_ids()`, where the models skip their own
    checks of these values: each is a host-device synchronization per forward on a GPU.

    Args:
        encoded: `{split: tokenized datasets.Dataset}` (after `drop_unused_columns`).
        config: the model's config (`vocab_size`, `type_vocab_size`, `num_labels`, `is_encoder_decoder`,
            `eos_token_id`).
        pad_token_id: the id the collator pads `input_ids` with.

    Raises:
        ValueError: a value outside its range, or an encoder-decoder's row without its end-of-sequence token; the
            message names the split, the column (or row) and the value.
    """
    import pyarrow.compute as pc
    import pyarrow.types

    ranges = {"input_ids": ("token id", "vocab_size", config.vocab_size)}  # column: (what, bound's name, bound)
    if getattr(config, "type_vocab_size", None):
        ranges["token_type_ids"] = ("token type id", "type_vocab_size", config.type_vocab_size)
    if pad_token_id is not None and not 0 <= pad_token_id < config.vocab_size:
        raise ValueError(f"the tokenizer's padding id {pad_token_id} is outside [0, vocab_size={config.vocab_size})")
    label_range = ("label", "num_labels", config.num_labels)
    for split in ["train", *_eval_splits(encoded)]:
        table = encoded[split].with_format("arrow")[:]  # its rows, in order: a select() or shuffle() applied
        flat = {c: pc.list_flatten(table.column(c)) for c in ranges if c in table.column_names}
        checks = [(values, ranges[c]) for c, values in flat.items()]
        if "labels" in table.column_names and pyarrow.types.is_integer(table.schema.field("labels").type):
            labels = table.column("labels")  # class ids (regression targets are floats)
            checks.append((pc.filter(labels, pc.not_equal(labels, -100)), label_range))
        for values, (what, name, size) in checks:
            extremes = pc.min_max(values)
            for value in (extremes["min"].as_py(), extremes["max"].as_py()):
                if value is not None and not 0 <= value < size:
                    raise ValueError(f"GLUE {split} split: {what} {value} is outside [0, {name}={size})")
        if getattr(config, "is_encoder_decoder", False) and isinstance(config.eos_token_id, int):
            row = _first_row_without(table.column("input_ids"), flat["input_ids"], config.eos_token_id)
            if row is not None:
                raise ValueError(
                    f"GLUE {split} split: row {row} has no end-of-sequence token (eos_token_id={config.eos_token_id});"
                    " an encoder-decoder classifies the decoder's state at the last one: tokenize with a tokenizer"
                    " that appends it"
                )


def _first_row_without(column, flat, token_id: int) -> int | None:
    """The index of the first row of a list-of-ids Arrow column without `token_id`, or None.

    `flat` is `pc.list_flatten(column)`; `pc.list_parent_indices` numbers the rows across the column's chunks.
    """
    import numpy as np
    import pyarrow.compute as pc

    has = np.zeros(len(column), dtype=bool)
    has[pc.filter(pc.list_parent_indices(column), pc.equal(flat, token_id)).to_numpy(zero_copy_only=False)] = True
    return None if has.all() else int(np.argmin(has))


def _eval_splits(splits) -> list[str]:
    return [s for s in splits if s.startswith("validation")]


def build_glue_model(args: argparse.Namespace, task: GlueTask, tokenizer, config) -> tuple[torch.nn.Module, dict]:
    """Load the checkpoint with a sequence-classification head for `task` and wrap it for `--peft`.

    Args:
        args: `model_name_or_path`, `attn_implementation`, `ignore_mismatched_sizes`,
            `trust_remote_code` and the PEFT options (`peft`, `lora_*`, `target_modules`,
            `num_virtual_tokens`, `prefix_projection`, `prefix_hidden_size`).
        task: the GLUE task (number of labels, label names, regression or not).
        tokenizer: supplies the padding id when the checkpoint's config has none.
        config: the checkpoint's config (`AutoConfig.from_pretrained(args.model_name_or_path)`), unchanged.

    Returns:
        The model: a `PeftModel` (base frozen, adapter and head trainable) or, with `--peft none`, the
        plain `*ForSequenceClassification`; and the base's `hfzoo.training.checkpointing.base_model_record`
        (its loaded weights, config and vocabulary, taken before any wrapping; the new head left out), which the
        run's checkpoints record and a resume compares.

    Raises:
        ValueError: a package the model needs is not installed: the kernel `--attn_implementation` names, or one
            the code of a `--trust_remote_code` model imports (`missing_packages_refused`).
    """
    labels = {}
    if not task.is_regression:
        labels = {
            "id2label": dict(enumerate(task.label_names)),
            "label2id": {n: i for i, n in enumerate(task.label_names)},
        }
    kwargs: dict[str, Any] = {}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    if config.pad_token_id is None and tokenizer.pad_token_id is not None:
        kwargs["pad_token_id"] = tokenizer.pad_token_id
    with missing_packages_refused(args):
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            args.model_name_or_path,
            num_labels=task.num_labels,
            problem_type="regression" if task.is_regression else "single_label_classification",
            ignore_mismatched_sizes=args.ignore_mismatched_sizes,
            trust_remote_code=args.trust_remote_code,
            output_loading_info=True,
            **labels,
            **kwargs,
        )
    base = base_model_record(args.model_name_or_path, model, config, tokenizer, newly_initialized_keys(loading))
    peft_config = build_peft_config(
        args.peft,
        model.config,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.target_modules,
        num_virtual_tokens=args.num_virtual_tokens,
        prefix_projection=args.prefix_projection,
        encoder_hidden_size=args.prefix_hidden_size,
    )
    return wrap_with_peft(model, peft_config), base


def prepare_glue(args: argparse.Namespace) -> GlueRun:
    """Build and check everything before the first step: accelerator, data, model, optimizer, scheduler.

    Args:
        args: from `parse_glue_args`.

    Returns:
        A `GlueRun` whose model, optimizer, scheduler and dataloaders are `accelerator.prepare`d.

    Raises:
        ValueError, FileNotFoundError: bad input (unknown task, missing files, the hub's GLUE unreachable and not
            cached, a model without a loadable config, bad rows, a `--max_length` or a prefix that does not fit the
            position table, a `--push_to_hub` repository the hub does not create), before any training.
    """
    task = get_glue_task(args.task_name)
    check_scheduler_arguments(args)
    check_output_folder(args.output_dir)  # before any work: a run never ends unable to save its results
    check_model_path(args.model_name_or_path)
    glue_files(task, args.data_dir, args.train_file, args.validation_file)  # they exist: read after the model loads
    if os.path.isdir(args.model_name_or_path):
        check_weight_files(args.model_name_or_path)  # names a truncated or corrupt weight file, before any work
    config = load_checkpoint_config(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    args.max_length = resolve_max_length(config, args.max_length)
    if args.peft == "prefix":
        check_prefix_fits(config, args.num_virtual_tokens, args.max_length)
    resume_path = resolve_glue_resume(args)
    accelerator = create_accelerator(args, sync_with_dataloader=True)
    refuse_earlier_checkpoints(args, accelerator)
    if resume_path is not None:
        check_glue_resume_layout(resume_path, args, accelerator)
        check_resume_optimizer(resume_path, args, GLUE_STATE)
        check_glue_resume_arguments(resume_path, args)
    check_hub_repository(args, accelerator)  # with --push_to_hub: the hub answers before any work
    precision = choose_mixed_precision(args)  # what the accelerator was created with
    accelerator.print(f"precision: {precision.reason}")
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model, base_model = build_glue_model(args, task, tokenizer, config)
    if resume_path is not None:  # before any data is read
        check_resume_base_model(resume_path, base_model, config, GLUE_STATE)
    encoded = load_glue_data(args, task, tokenizer, accelerator)
    trainable, total = count_parameters(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    encoded = drop_unused_columns(encoded, base, accelerator)
    check_encoded_inputs(encoded, base.config, tokenizer.pad_token_id)  # the loop's forwards then skip theirs
    non_embedding_parameters = base.num_parameters(exclude_embeddings=True)
    compile_model(model, args, accelerator)  # in place: state_dict keys stay those of the eager model
    accelerator.print(
        f"{task.name} {args.peft}: trainable parameters {trainable:,} of {total:,} ({100 * trainable / total:.3f}%)"
    )

    half = accelerator.mixed_precision != "no"
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if half else None)
    # The loader's own generator: starting an epoch's iterator then draws its worker seed from it, not from
    # torch's global RNG, so the dropout masks of a resumed run continue exactly where the checkpoint left them.
    # With --group_by_length the order comes from a sampler seeded per epoch (shuffle=True gets accelerate's
    # seedable sampler), so a resumed run draws the same order either way.
    sampler = None
    if args.group_by_length:
        lengths = [len(ids) for ids in encoded["train"]["input_ids"]]
        sampler = EpochLengthGroupedSampler(args.per_device_train_batch_size, lengths, args.seed)
    train_loader = DataLoader(
        encoded["train"],
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=collator,
        batch_size=args.per_device_train_batch_size,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_loaders = {
        split: DataLoader(encoded[split], collate_fn=collator, batch_size=args.per_device_eval_batch_size)
        for split in _eval_splits(encoded)
    }
    optimizer = create_optimizer(
        model, learning_rate=args.learning_rate, weight_decay=args.weight_decay, muon=muon_settings(args)
    )
    steps_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)
    max_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    if warning := warmup_outlasts_training(args.num_warmup_steps, max_steps):
        accelerator.print(f"warning: {warning}")
    scheduler = create_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=max_steps,
        scheduler_kwargs=args.lr_scheduler_kwargs,
    )
    model, optimizer, train_loader, scheduler, *loaders = accelerator.prepare(
        model, optimizer, train_loader, scheduler, *eval_loaders.values()
    )
    delete_earlier_checkpoints(args, accelerator)  # every check passed: --overwrite_output_dir takes effect
    return GlueRun(
        args=args,
        task=task,
        accelerator=accelerator,
        tokenizer=tokenizer,
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        train_dataloader=train_loader,
        eval_dataloaders=dict(zip(eval_loaders, loaders)),
        train_examples=len(encoded["train"]),
        trainable_parameters=trainable,
        total_parameters=total,
        max_train_steps=max_steps,
        num_train_epochs=math.ceil(max_steps / steps_per_epoch),
        resume_path=resume_path,
        base_model=base_model,
        throughput=Throughput(
            resolve_peak_tflops(accelerator.device, accelerator.mixed_precision, args.peak_tflops),
            accelerator.num_processes,
        ),
        flops=SequenceClassificationFlops(base.config, non_embedding_parameters, args.max_length, accelerator.device),
        precision=precision,
        inputs_checked=True,  # check_encoded_inputs
    )


def run_glue(args: argparse.Namespace) -> dict[str, Any]:
    """Finetune and evaluate one GLUE task as `args` say; write the results to `args.output_dir`.

    `prepare_glue` (data: `load_glue_data`, model: `build_glue_model`), then `train_glue` (the loop),
    `glue_results` and `save_glue_outputs` (the results).

    Args:
        args: from `parse_glue_args`.

    Returns:
        The results dict written to `all_results.json` (see `glue_results`).

    Raises:
        ValueError, FileNotFoundError: bad input (unknown task, missing files, the hub's GLUE unreachable and not
            cached, a model without a loadable config, bad rows, a `--max_length` or a prefix that does not fit the
            position table), before any training.
    """
    run = prepare_glue(args)
    start = time.perf_counter()
    # its faults (a stop by SIGTERM, a non-finite step, a failed save, a lost process) end the run with one line
    with faults.handle_training_faults(run.accelerator, functools.partial(complete_checkpoints, args.output_dir)):
        progress = train_glue(run)
        results = glue_results(run, progress, time.perf_counter() - start)
        save_glue_outputs(run, results, progress)
    if args.with_tracking:
        run.accelerator.end_training()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Entry point of `recipes/finetune_glue.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The results (see `run_glue`).

    Raises:
        SystemExit: bad input (one-line message) or an argparse error; a non-finite step beyond
            `--max_nonfinite_steps` (`error: ...` naming the step and the last intact checkpoint, exit status
            `hfzoo.training.faults.EXIT_NONFINITE`, 76); SIGTERM or SIGINT during training (a checkpoint of the
            step then finished is written; `stopped by SIGTERM after step N; ...`, exit status
            `hfzoo.training.faults.EXIT_PREEMPTED`, 75); a failed checkpoint save, or in a multi-process run a
            collective that failed or timed out after `--ddp_timeout` seconds (`error: process R: ...` naming the
            lost process and the checkpoint to resume from), exit status 1
            (`hfzoo.training.faults.handle_training_faults`).
    """
    try:
        args = parse_glue_args(argv)
        with removed_if_refused(args.output_dir):  # a refused run leaves no empty output folder behind
            return run_glue(args)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None


def cli() -> None:
    """`hfzoo-finetune-glue` and `recipes/finetune_glue.py`: `main`, then the process ends with its exit status.

    A process of a multi-process run ends without the interpreter's teardown (`hfzoo.training.faults.run_launched`).
    """
    faults.run_launched(main)


if __name__ == "__main__":
    cli()
