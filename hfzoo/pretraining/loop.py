"""The pretraining loop behind `recipes/pretrain.py`, on `accelerate` (one process, DDP or DeepSpeed).

`main(argv)` parses the arguments, then `prepare(args)` does everything that can fail on bad input
(tokenizer, model config, data loading, tokenization and packing) before the first training step;
such failures end the program with a one-line `error: ...` message. `train(run)` then runs the
optimisation loop with gradient accumulation, clipping, warmup + decay, periodic evaluation,
resumable checkpoints, and writes a standard `save_pretrained` folder with `eval_results.json` and
`all_results.json`, as transformers' `run_clm_no_trainer.py` does.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, send_to_device, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from ..data.loading import check_input_files, load_raw_datasets
from ..data.packing import token_counts, tokenize_and_pack
from ..hub import (
    TRACKER_PROJECTS,
    build_model_card,
    check_model_path,
    load_checkpoint_config,
    push_to_hub,
    source_error,
)
from ..integrity import check_weight_files
from ..models.presets import PRESETS, build_config, parse_overrides
from ..modules.embeddings import caller_checked_ids, check_batch_ids
from ..outputs import removed_if_refused, write_json_atomic
from ..training import faults
from ..training.accelerator import choose_mixed_precision, create_accelerator
from ..training.arguments import (
    check_hub_repository,
    check_scheduler_arguments,
    hub_repository,
    missing_packages_refused,
    muon_settings,
    tracker_config,
)
from ..training.checkpointing import (
    DATA_CHANGE,
    DATA_FLAGS,
    OBJECTIVE_CHANGE,
    OBJECTIVE_FLAGS,
    TRAIN_HISTORY_FILE,
    TRAINING_STATE,
    _check_resume_topology,
    _resolve_resume,
    base_model_record,
    check_resume_arguments,
    check_resume_base_model,
    check_resume_config,
    check_resume_optimizer,
    check_resume_tokenizer,
    checkpoint_folder,
    complete_checkpoints,
    delete_earlier_checkpoints,
    enable_universal_checkpoint_loading,
    load_checkpoint,
    newly_initialized_keys,
    prepare_output_dir,
    refuse_earlier_checkpoints,
    save_checkpoint,
)
from ..training.compilation import compile_model, no_cache_kwargs
from ..training.objectives import get_objective
from ..training.optimization import create_optimizer, create_scheduler, warmup_outlasts_training
from ..training.plots import plot_training_curves
from ..training.precision import PrecisionChoice
from ..training.streaming import DeviceLoader, StreamingTrainLoader, stream_blocks
from ..training.throughput import Throughput, pretraining_flops_per_token, resolve_peak_tflops
from .arguments import parse_pretrain_args
from .evaluation import evaluate_lm, unigram_perplexity

logger = get_logger(__name__)


@dataclass
class PretrainingRun:
    """Everything `train` needs, built and checked by `prepare`."""

    args: argparse.Namespace
    accelerator: Accelerator
    tokenizer: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    train_dataloader: DataLoader
    eval_dataloader: DataLoader
    train_dataset: datasets.Dataset | datasets.IterableDataset
    eval_dataset: datasets.Dataset | datasets.IterableDataset
    max_train_steps: int
    num_train_epochs: int
    resume_path: Path | None
    block_size: int
    raw_block_size: int  # text tokens per packed block (span: before corruption)
    train_collator: Any  # the loop collates each micro-batch's examples (both loaders yield lists of examples)
    nonfinite_guard: faults.NonFiniteGuard | None = None
    flops_per_token: float = 0.0  # training FLOPs per text token (`hfzoo.training.throughput`)
    throughput: Throughput | None = None  # turns tokens and seconds into TFLOP/s and MFU
    resharded_from: int | None = None  # the resumed checkpoint's number of processes, when not this run's
    train_history: dict[str, list] | None = None  # the records so far, saved with each checkpoint (`train`)
    precision: PrecisionChoice | None = None  # the precision it trains in and why (`--mixed_precision`)
    # `--model_name_or_path`'s `hfzoo.training.checkpointing.base_model_record` (None: newly initialized weights)
    base_model: dict[str, Any] | None = None


def _load_tokenizer(name: str, argument: str):
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"{argument} {name}: cannot load a tokenizer ({source_error(name, err)})") from err


def check_base_tokenizer(model_name_or_path: str, tokenizer, source: str) -> None:
    """Refuse a tokenizer that gives the tokens of a pretrained model's own tokenizer other ids.

    A model's embedding and output rows are learnt for its tokenizer's ids: continued with a tokenizer of the same
    size trained on other text (which passes the `vocab_size` check), each row would be read for another token and
    the run would train on without an error. A tokenizer that keeps every token of the model's at its id and adds
    others (within `vocab_size`) passes. A model without tokenizer files is not checked.

    Args:
        model_name_or_path: `--model_name_or_path` (a folder or hub id).
        tokenizer: this run's tokenizer (`get_vocab()`: token -> id).
        source: where it comes from, for the message (`"--tokenizer_name tok"`).

    Raises:
        ValueError: one line naming both, how many of the model's tokens have other ids or are missing, and the
            first of them.
    """
    try:
        own = AutoTokenizer.from_pretrained(model_name_or_path).get_vocab()
    except (OSError, ValueError):  # no tokenizer files beside the model
        return
    here = tokenizer.get_vocab()
    changed = sorted((token for token, i in own.items() if here.get(token) != i), key=own.get)
    if changed:
        first = changed[0]
        raise ValueError(
            f"{source}: gives {len(changed)} of the {len(own)} tokens of --model_name_or_path {model_name_or_path}'s "
            f"own tokenizer other ids or none (first: {first!r}, id {own[first]} there, {here.get(first)} here): "
            "the model's embeddings would be read for other tokens; leave out --tokenizer_name to continue with the "
            "model's tokenizer"
        )


def build_model_config(args: argparse.Namespace, tokenizer) -> transformers.PreTrainedConfig:
    """Build the model config from `--config_name`/`--config_overrides` (or the pretrained model's).

    With a preset and no explicit `vocab_size`, the vocabulary size is the tokenizer's; the special
    token ids always come from the tokenizer.

    Raises:
        ValueError: unknown preset/override, invalid config, a `--model_name_or_path` without a loadable config,
            a tokenizer larger than `vocab_size`,
            or a model family without the objective's head (clm: causal LM, mlm: masked LM, span: seq2seq LM).
    """
    token_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if args.model_name_or_path is not None:
        config = load_checkpoint_config(args.model_name_or_path)
        if args.config_overrides:
            raise ValueError("--config_overrides cannot change the architecture of --model_name_or_path")
    else:
        fields = dict(token_ids)
        if args.config_name in PRESETS and "vocab_size" not in parse_overrides(args.config_overrides):
            fields["vocab_size"] = len(tokenizer)
        config = build_config(args.config_name, args.config_overrides, **fields)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"the tokenizer {args.tokenizer_name or args.model_name_or_path} has {len(tokenizer)} tokens, "
            f"more than the model's vocab_size={config.vocab_size}"
        )
    objective = get_objective(args.objective)
    if not objective.supports(config):
        raise ValueError(
            f"--objective {args.objective} needs a model with an {objective.auto_class.__name__} head; "
            f"model_type {config.model_type!r} has none"
        )
    return config


def check_block_size(block_size: int | None, config) -> int:
    """The tokens per training block: `--block_size`, else 1024 or the model's position table when smaller.

    Args:
        block_size: `--block_size` (tokens), or None for the default.
        config: the model config; one without `max_position_embeddings` or with `position_embedding_type="none"`
            has no limit.

    Returns:
        The block size in tokens.

    Raises:
        ValueError: a `block_size` larger than `max_position_embeddings`; the message gives both numbers.
    """
    max_positions = getattr(config, "max_position_embeddings", None)
    block_size = block_size or min(1024, max_positions or 1024)
    if max_positions is not None and getattr(config, "position_embedding_type", "learned") != "none":
        if block_size > max_positions:
            raise ValueError(f"--block_size {block_size} is larger than max_position_embeddings={max_positions}")
    return block_size


def _build_model(args: argparse.Namespace, config, tokenizer) -> tuple[torch.nn.Module, dict[str, Any] | None]:
    """The model to train, and the `base_model_record` of `--model_name_or_path` (None: newly initialized).

    Raises:
        ValueError: a package the model needs is not installed (`missing_packages_refused`).
    """
    auto_class = get_objective(args.objective).auto_class
    with missing_packages_refused(args):
        if args.model_name_or_path is None:
            return auto_class.from_config(config, attn_implementation=args.attn_implementation), None
        model, loading = auto_class.from_pretrained(
            args.model_name_or_path, config=config, attn_implementation=args.attn_implementation,
            output_loading_info=True,
        )  # fmt: skip
    newly_initialized = newly_initialized_keys(loading)  # a head the base has not
    return model, base_model_record(args.model_name_or_path, model, config, tokenizer, newly_initialized)


@contextlib.contextmanager
def _zero3_init(accelerator: Accelerator):
    """Build the model partitioned (DeepSpeed `zero.Init`) only when the accelerate config asks for it.

    accelerate registers its ZeRO-3 config with transformers, which then always builds models under
    `zero.Init`; with `zero3_init_flag: false` the model is built whole instead, so that a seed gives
    the same initial weights as a single-process run.
    """
    plugin = accelerator.state.deepspeed_plugin if accelerator.distributed_type == DistributedType.DEEPSPEED else None
    if plugin is None or plugin.zero_stage != 3 or plugin.zero3_init_flag:
        yield
        return
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(plugin.dschf)


def prepare(args: argparse.Namespace) -> PretrainingRun:
    """Build and check everything before the first step: accelerator, tokenizer, config, data, model.

    Args:
        args: parsed arguments (see `hfzoo.pretraining.arguments`).

    Returns:
        A `PretrainingRun`.

    Raises:
        ValueError, FileNotFoundError: bad input, with a message naming it (a `--push_to_hub` repository the hub
            does not create included: `check_hub_repository`).
    """
    check_scheduler_arguments(args)
    prepare_output_dir(args.output_dir, checkpointing=args.checkpointing_steps is not None)
    accelerator = create_accelerator(args)
    precision = choose_mixed_precision(args)  # what the accelerator was created with
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    logger.info(
        f"world size {accelerator.num_processes} (distributed_type {accelerator.distributed_type.value}, "
        f"mixed_precision {accelerator.mixed_precision})"
    )
    logger.info(f"precision: {precision.reason}")
    if accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_warning()
        transformers.utils.logging.set_verbosity_warning()
    else:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    # before the data and the model: the engine is known once the accelerator exists
    if args.optim == "muon" and accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        raise ValueError(
            f"--optim muon is not supported under {accelerator.distributed_type.value}: Muon orthogonalises "
            "whole matrices, which DeepSpeed and FSDP shard; use DDP or one process"
        )
    set_seed(args.seed)
    resume_path = _resolve_resume(args, accelerator)
    refuse_earlier_checkpoints(args, accelerator)

    for name, flag in ((args.model_name_or_path, "--model_name_or_path"), (args.tokenizer_name, "--tokenizer_name")):
        if name is not None:
            check_model_path(name, flag)
    tokenizer_flag = "--tokenizer_name" if args.tokenizer_name else "--model_name_or_path"  # else its own tokenizer
    tokenizer_name = args.tokenizer_name or args.model_name_or_path
    tokenizer = _load_tokenizer(tokenizer_name, tokenizer_flag)
    if args.model_name_or_path is not None and args.tokenizer_name is not None:
        check_base_tokenizer(args.model_name_or_path, tokenizer, f"--tokenizer_name {args.tokenizer_name}")
    config = build_model_config(args, tokenizer)
    if args.model_name_or_path is not None and os.path.isdir(args.model_name_or_path):
        check_weight_files(args.model_name_or_path)  # before the data: names a truncated or corrupt file
    resharded_from = None  # the checkpoint's number of processes, when it differs from this run's
    if resume_path is not None:
        check_resume_config(resume_path, config)
        check_resume_tokenizer(resume_path, tokenizer, f"{tokenizer_flag} {tokenizer_name}")
        resharded_from = _check_resume_topology(resume_path, accelerator, args)
        check_resume_optimizer(resume_path, args)
        check_resume_arguments(resume_path, args, OBJECTIVE_FLAGS, "objective_arguments", OBJECTIVE_CHANGE)
        if resharded_from is not None and accelerator.distributed_type == DistributedType.DEEPSPEED:
            enable_universal_checkpoint_loading(accelerator)
    block_size = check_block_size(args.block_size, config)
    objective = get_objective(args.objective)
    collator, raw_block_size = objective.build_collator(args, tokenizer, block_size)
    check_input_files(args.train_file, args.validation_file, args.streaming)  # every process, before any waits
    check_hub_repository(args, accelerator)  # with --push_to_hub: the hub answers before any work
    if resume_path is not None:  # once the files are known to exist
        check_resume_arguments(resume_path, args, DATA_FLAGS, "data_arguments", DATA_CHANGE)
    with _zero3_init(accelerator):  # before the data: a resume on another base is refused before any work
        model, base_model = _build_model(args, config, tokenizer)
    if resume_path is not None:
        check_resume_base_model(resume_path, base_model, config, TRAINING_STATE)

    if args.streaming:
        train_dataloader, eval_dataloader = _streaming_loaders(args, accelerator, tokenizer, objective, collator,
                                                               raw_block_size)  # fmt: skip
        train_dataset, eval_dataset = train_dataloader.dataset, eval_dataloader.dataset
    else:
        with accelerator.main_process_first():
            packed = pack_pretraining_data(args, tokenizer, objective, raw_block_size)
        train_dataset, eval_dataset = packed["train"], packed["validation"]
        if args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(args.max_train_samples, len(train_dataset))))
        if args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(min(args.max_eval_samples, len(eval_dataset))))
        logger.info(
            f"{len(train_dataset)} training and {len(eval_dataset)} validation blocks of {raw_block_size} tokens"
        )

    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    compile_model(model, args, accelerator)  # in place: state_dict keys stay those of the eager model
    # Under DeepSpeed ZeRO-3 the parameters may already be partitioned (zero.Init): use their full shapes.
    n_params = sum(math.prod(getattr(p, "ds_shape", p.shape)) for p in model.parameters())
    logger.info(f"model {type(model).__name__}: {n_params / 1e6:.2f}M parameters")
    try:
        target_length = getattr(collator, "target_length", None) if config.is_encoder_decoder else None
        flops_per_token = pretraining_flops_per_token(config, block_size, raw_block_size, target_length)
    except AttributeError:  # not an hfzoo config (a transformers checkpoint): FLOPs unknown
        flops_per_token = 0.0
    peak = resolve_peak_tflops(accelerator.device, accelerator.mixed_precision, args.peak_tflops)
    logger.info(
        f"model FLOPs per token {flops_per_token:.4g}; peak {peak.tflops or float('nan'):.4g} TFLOP/s per device "
        f"({peak.source})"
    )

    fused = args.optim == "adamw_torch_fused" and accelerator.distributed_type != DistributedType.DEEPSPEED
    optimizer = create_optimizer(
        model,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        fused=fused,
        muon=muon_settings(args),
    )
    if args.streaming:
        max_train_steps = num_train_epochs = args.max_train_steps  # every pass over the stream makes a step
    else:
        # Exact resume: a checkpoint's RNG state must be the one the next micro-batch's random masking (mlm,
        # span) and dropout draw from. So the loader yields lists of examples and the training loop collates
        # each micro-batch (accelerate's loader prepares one batch ahead of the step), and creating a loader
        # iterator draws its seed from the loader's own generator, not from torch's global RNG.
        train_dataloader = DataLoader(
            train_dataset,
            shuffle=True,
            collate_fn=list,
            batch_size=args.per_device_train_batch_size,
            generator=torch.Generator().manual_seed(args.seed),
        )
        eval_dataloader = DataLoader(eval_dataset, collate_fn=collator, batch_size=args.per_device_eval_batch_size)
        # Each optimizer step takes a whole window of accumulation micro-batches; an incomplete last window
        # of an epoch is skipped, so that every step sees the same global batch.
        steps_per_epoch = (
            math.ceil(len(train_dataloader) / accelerator.num_processes) // args.gradient_accumulation_steps
        )
        if steps_per_epoch == 0:
            raise ValueError(
                f"{len(train_dataset)} training blocks make fewer than one global batch of "
                f"{accelerator.num_processes} processes x {args.per_device_train_batch_size} per device x "
                f"{args.gradient_accumulation_steps} accumulation"
            )
        max_train_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
        num_train_epochs = math.ceil(max_train_steps / steps_per_epoch)
    if warning := warmup_outlasts_training(args.num_warmup_steps, max_train_steps):
        logger.warning(warning)
    # accelerate steps the scheduler once per process per optimizer step (run_clm_no_trainer does the same).
    lr_scheduler = create_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
        scheduler_kwargs=args.lr_scheduler_kwargs,
    )
    if args.streaming:  # each process reads its own shard: accelerate must not split the loaders again
        model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    else:
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
            model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
        )
        # Its batches are lists of examples, collated and sent to the device by the training loop: accelerate's
        # device placement of each batch would only walk every token id of every example (about 1.5 ms of host
        # time per batch of 16 x 128 tokens, on a step the GPU may finish in less).
        train_dataloader.device = None
    delete_earlier_checkpoints(args, accelerator)  # every check passed: --overwrite_output_dir takes effect
    return PretrainingRun(
        args=args,
        accelerator=accelerator,
        tokenizer=tokenizer,
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        max_train_steps=max_train_steps,
        num_train_epochs=num_train_epochs,
        resume_path=resume_path,
        block_size=block_size,
        raw_block_size=raw_block_size,
        train_collator=collator,
        resharded_from=resharded_from,
        nonfinite_guard=faults.NonFiniteGuard(
            args.max_nonfinite_steps,
            check_grad_norm=accelerator.mixed_precision != "fp16",
            log=accelerator.is_main_process,
        ),
        flops_per_token=flops_per_token,
        throughput=Throughput(peak, accelerator.num_processes),
        precision=precision,
        base_model=base_model,
    )


def pack_pretraining_data(args: argparse.Namespace, tokenizer, objective, raw_block_size: int):
    """Load the recipe's training and validation text and tokenize it into blocks, through `datasets`' cache.

    The one call that decides the cache entry (files, tokenizer, block size, cleaning, labels): the recipe and
    the modification study (which prepares the data once before its runs) both use it, so a run finds the
    study's blocks in the cache.

    Args:
        args: the recipe's parsed arguments (`parse_pretrain_args`); not `--streaming`.
        tokenizer: the run's tokenizer.
        objective: the `hfzoo.training.objectives` objective (whether blocks carry labels).
        raw_block_size: tokens per packed block (the objective's input length before corruption).

    Returns:
        A `datasets.DatasetDict` with `train` and `validation` blocks of `raw_block_size` token ids.
    """
    return tokenize_and_pack(
        _load_raw_datasets(args),
        tokenizer,
        args.text_column_name,
        raw_block_size,
        num_proc=args.preprocessing_num_workers,
        clean=not args.no_clean_text,
        load_from_cache_file=not args.overwrite_cache,
        with_labels=objective.labels_in_blocks,
    )


def _load_raw_datasets(args: argparse.Namespace, streaming: bool = False):
    return load_raw_datasets(
        train_file=args.train_file,
        validation_file=args.validation_file,
        dataset_name=args.dataset_name,
        dataset_config_name=args.dataset_config_name,
        text_column_name=args.text_column_name,
        validation_split_percentage=args.validation_split_percentage,
        streaming=streaming,
        check_files=False,  # `prepare` checked them on every process
    )


def _data_sources(args: argparse.Namespace) -> tuple[str, str]:
    """The training and validation data as messages name them (`--train_file ['books.jsonl']`)."""
    train = f"--train_file {args.train_file}" if args.train_file else f"--dataset_name {args.dataset_name}"
    return train, f"--validation_file {args.validation_file}" if args.validation_file else train


def _streaming_loaders(args, accelerator: Accelerator, tokenizer, objective, collator, raw_block_size: int):
    """`--streaming`: this process's shard of the training stream and the whole validation stream, batched."""
    train_dataset, eval_dataset = stream_blocks(
        _load_raw_datasets(args, streaming=True),
        tokenizer,
        args.text_column_name,
        raw_block_size,
        with_labels=objective.labels_in_blocks,
        clean=not args.no_clean_text,
        max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples,
        process_index=accelerator.process_index,
        num_processes=accelerator.num_processes,
        sources=_data_sources(args),
    )
    logger.info(f"streaming blocks of {raw_block_size} tokens; process {accelerator.process_index} reads its shard")
    train_dataloader = StreamingTrainLoader(
        train_dataset, args.per_device_train_batch_size, accelerator, args.gradient_accumulation_steps
    )
    accelerator.register_for_checkpointing(train_dataloader)  # its position is saved with every checkpoint
    eval_dataloader = DeviceLoader(
        DataLoader(eval_dataset, collate_fn=collator, batch_size=args.per_device_eval_batch_size), accelerator.device
    )
    return train_dataloader, eval_dataloader


def accumulation_step(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer,
    lr_scheduler,
    micro_batches: list[dict[str, torch.Tensor]],
    objective: str,
    max_grad_norm: float,
    forward_kwargs: dict[str, bool] | None = None,
    stepper: faults.OptimizerStepper | None = None,
) -> tuple[torch.Tensor, torch.Tensor | float | None]:
    """One optimizer step over a window of micro-batches, with the loss normalised over the global batch.

    Each micro-batch's mean loss is reweighted by its share of the predicted tokens of the whole global
    batch (all micro-batches of all processes), so the gradient is that of the per-token mean over the
    global batch whatever the split into processes, micro-batches and padding; this is what
    transformers' `Trainer` does with `num_items_in_batch`. accelerate (or DeepSpeed) divides each
    backward by the accumulation steps and DDP/ZeRO average over processes; the weight undoes both.

    Args:
        accelerator: the run's `Accelerator`; `len(micro_batches)` must equal its `gradient_accumulation_steps`.
        model: the prepared model (DDP module or DeepSpeed engine).
        optimizer: the prepared optimizer.
        lr_scheduler: the prepared scheduler.
        micro_batches: the process's micro-batches, each with `labels` `(batch_size, seq_len)` int64.
        objective: a name in `hfzoo.training.objectives.OBJECTIVES` (how its labels are counted:
            `Objective.count_predicted_tokens`).
        max_grad_norm: clip the global gradient norm to this (0: no clipping; the norm is still measured).
        forward_kwargs: more keyword arguments of every forward (default: `no_cache_kwargs(model)`, looked up
            on each call; a training loop looks them up once).
        stepper: takes the optimizer and scheduler steps (`hfzoo.training.faults.OptimizerStepper`, which a
            training loop keeps for the whole run and asks which steps were applied); default: one that reads
            the gradient norm at once, for this call.

    A step whose gradient norm is not finite is not applied: neither the optimizer nor the scheduler
    steps (under DeepSpeed, the engine skips it itself; under fp16, the loss scaler does). A deferred
    `stepper` decides on the device and checks the norm on the host at the next step.

    Returns:
        `(loss, grad_norm)`: the float32 scalar per-token mean loss over the global batch (same on every
        process) and the gradient norm before clipping: a float, or with a deferred `stepper` a 0-d tensor on the
        device (not read back); None where the backend does not report it.
    """
    counts = [get_objective(objective).count_predicted_tokens(batch) for batch in micro_batches]
    global_count = accelerator.reduce(torch.stack(counts).sum().to(accelerator.device), reduction="sum")
    weight = accelerator.num_processes * len(micro_batches) / global_count.clamp(min=1).float()
    total = torch.zeros((), dtype=torch.float32, device=accelerator.device)
    grad_norm = None
    if forward_kwargs is None:
        forward_kwargs = no_cache_kwargs(model)
    if stepper is None:
        stepper = faults.OptimizerStepper(optimizer, lr_scheduler, scaler=accelerator.scaler is not None)
    for batch, count in zip(micro_batches, counts):
        with accelerator.accumulate(model):
            loss = model(**batch, **forward_kwargs).loss
            accelerator.backward(loss * (count * weight))
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
                # A non-finite gradient norm is never applied (under fp16 loss scaling the scaler skips the step).
                grad_norm = stepper.step(norm)
            else:  # accelerate's wrappers do nothing between synchronizations
                optimizer.step()
                lr_scheduler.step()
            optimizer.zero_grad()
        total += loss.detach().float() * count
    return accelerator.reduce(total, reduction="sum") / global_count.clamp(min=1), grad_norm


def without_full_attention_mask(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`batch` without its `attention_mask` where that mask attends to every token; otherwise `batch` itself.

    The models compute the same logits without a mask as with an all-ones one (every variant:
    `tests/helpers/variant_checks.py`), while transformers' masking asks the mask's device whether a given mask is all
    ones (to use the attention kernels' own causal masking): on a GPU a host-device synchronization in every forward.
    Packed pretraining blocks have no padding, so the training loop asks once, here, on the CPU.

    Args:
        batch: a collated micro-batch on the CPU; `attention_mask`, when present, `(batch_size, seq_len)`, 1 = token.

    Returns:
        A new dict without `attention_mask` when it was all ones, else `batch` unchanged.
    """
    mask = batch.get("attention_mask")
    if mask is None or not bool(mask.all()):
        return batch
    return {key: value for key, value in batch.items() if key != "attention_mask"}


def _windows(loader, size: int):
    """Yield lists of `size` consecutive batches of `loader` (an incomplete last list is dropped)."""
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []


def _resumed_history(
    run: PretrainingRun, completed_steps: int, eval_seed: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The training and validation records up to the resumed step, from the checkpoint's `train_history.json`.

    A checkpoint is written before the validation pass of its own step, so that pass, when `--eval_steps` asks
    for one there, is run again now (with the same `eval_seed`: the numbers of the interrupted run).

    Returns:
        `(log_history, eval_history)`: empty lists for a checkpoint written before they were saved with it.
    """
    saved = {}
    with contextlib.suppress(OSError, ValueError):
        saved = json.loads((run.resume_path / TRAIN_HISTORY_FILE).read_text())
    history = [r for r in saved.get("log_history", []) if r.get("step", 0) <= completed_steps]
    eval_history = [r for r in saved.get("eval_history", []) if r.get("step", 0) <= completed_steps]
    args = run.args
    due = args.eval_steps and completed_steps % args.eval_steps == 0 and completed_steps < run.max_train_steps
    if saved and due and all(r["step"] != completed_steps for r in eval_history):
        metrics = evaluate_lm(run.model, run.eval_dataloader, run.accelerator, seed=eval_seed)
        eval_history.append({"step": completed_steps, **metrics})
    return history, eval_history


def train(run: PretrainingRun) -> dict[str, float]:
    """Run the optimisation loop, evaluate, and save the final model.

    Returns:
        The final metrics written to `all_results.json`.
    """
    args, accelerator, model = run.args, run.accelerator, run.model
    block_size = run.block_size
    raw_block_size = run.raw_block_size
    tokens_per_step = (
        args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes * raw_block_size
    )
    if args.with_tracking:
        accelerator.init_trackers(TRACKER_PROJECTS["pretraining"], tracker_config(args))
    logger.info("***** Running training *****")
    if not args.streaming:
        logger.info(f"  Blocks = {len(run.train_dataset)}, epochs = {run.num_train_epochs}")
    logger.info(
        f"  Global batch = {args.per_device_train_batch_size} per device x {accelerator.num_processes} processes"
        f" x {args.gradient_accumulation_steps} accumulation = {tokens_per_step} tokens"
    )
    logger.info(f"  Optimizer steps = {run.max_train_steps}")

    completed_steps, tokens_seen = 0, 0
    eval_seed = args.seed if args.eval_seed is None else args.eval_seed  # the validation set's corruption/masks
    init_metrics = None
    eval_history: list[dict[str, float]] = []  # validation metrics by step, for train_history.json and the plot
    eval_seconds = 0.0  # wall time of the validation passes (at initialization, during and after training)
    if run.resume_path is None:
        eval_start = time.perf_counter()
        init_metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=eval_seed)
        eval_seconds += time.perf_counter() - eval_start
        eval_history.append({"step": 0, **init_metrics})
        logger.info(f"validation loss at initialization: {init_metrics['eval_loss']:.4f}")
    else:
        state = load_checkpoint(accelerator, run.resume_path, run.resharded_from, Path(args.output_dir))
        run.nonfinite_guard.load_state_dict(state)
        completed_steps, tokens_seen = state["step"], state["tokens_seen"]
        logger.info(f"Resumed from {run.resume_path} at step {completed_steps}")
    if args.streaming:  # the stream's position (and pass) came back with the checkpoint
        start_epoch, skip_batches = run.train_dataloader.epoch, 0
    else:
        steps_per_epoch = len(run.train_dataloader) // args.gradient_accumulation_steps
        start_epoch = completed_steps // steps_per_epoch
        skip_batches = (completed_steps % steps_per_epoch) * args.gradient_accumulation_steps

    progress = tqdm(
        total=run.max_train_steps,
        initial=completed_steps,
        disable=not accelerator.is_local_main_process,
        desc="Training",
        unit="step",
    )
    model.train()
    start = time.perf_counter()
    window_start, window_steps, window_loss, window_skipped = start, 0, 0.0, 0
    tokens_at_start, paused = tokens_seen, 0.0  # paused: seconds of evaluations and saves inside the loop
    history: list[dict[str, float]] = []
    if run.resume_path is not None:  # the records before the resume, saved with the checkpoint
        history, eval_history = _resumed_history(run, completed_steps, eval_seed)
    run.train_history = {"log_history": history, "eval_history": eval_history}  # saved with every checkpoint
    first_window = True
    # A KV cache is of no use in training (and makes compiled layers specialize); looked up once, not every step
    # (unwrapping the prepared model asks importlib's package metadata whether DeepSpeed is installed).
    no_cache = no_cache_kwargs(model)
    vocab_size = accelerator.unwrap_model(model).config.vocab_size
    last_saved = completed_steps  # a resumed run's starting point is already a checkpoint
    # Steps the optimizer; with a fused optimizer it reads each step's gradient norm one step late (no host-device
    # sync per step: the device leaves out a non-finite update itself), so a step's check arrives then or at the
    # next `settle()` (before every log line, save, evaluation and stop).
    stepper = faults.OptimizerStepper.for_run(accelerator, run.optimizer, run.lr_scheduler, completed_steps)
    step_losses: dict[int, torch.Tensor] = {}  # the losses of the steps not checked yet
    grad_norm = None

    def count_checked(checked: list[faults.CheckedStep]) -> None:
        nonlocal window_loss, window_skipped, grad_norm
        for done in checked:
            loss = step_losses.pop(done.step)
            if run.nonfinite_guard.check(done.step, loss, done.grad_norm):  # raises unless skips are allowed
                window_skipped += 1
            else:
                window_loss += loss  # a tensor: no device sync until the log line reads it
            grad_norm = done.grad_norm

    # A run resumed from its last checkpoint has nothing left to train.
    epochs = range(start_epoch, run.num_train_epochs) if completed_steps < run.max_train_steps else range(0)
    # SIGTERM/SIGINT: stop after the current step; after the last one, the final evaluation and save still run.
    preemption = faults.PreemptionHandler().install()  # on errors, `faults.handle_training_faults` restores
    for epoch in epochs:
        run.train_dataloader.set_epoch(epoch)
        loader = run.train_dataloader
        if epoch == start_epoch and skip_batches:
            loader = accelerator.skip_first_batches(run.train_dataloader, skip_batches)
        for micro_batches in _windows(loader, args.gradient_accumulation_steps):
            # Lists of examples: each micro-batch is collated (random masking/corruption: torch's RNG, here in step
            # order), its ids checked against the vocabulary on the CPU, and placed on the device now; the forwards
            # then skip their own checks of the ids (`caller_checked_ids`: a host-device sync each on a GPU).
            prepared = []
            for examples in micro_batches:
                batch = run.train_collator(examples)
                check_batch_ids(batch, vocab_size)
                prepared.append(send_to_device(without_full_attention_mask(batch), accelerator.device))
            micro_batches = prepared
            if first_window:
                # Which blocks each process trains on (sums of token ids per row): different on every process.
                row_sums = micro_batches[0]["input_ids"].sum(dim=-1).tolist()
                logger.info(
                    f"process {accelerator.process_index}/{accelerator.num_processes}: "
                    f"first micro-batch row token-id sums {row_sums}",
                    main_process_only=False,
                )
                first_window = False
            with caller_checked_ids():
                step_losses[completed_steps + 1], _ = accumulation_step(
                    accelerator,
                    model,
                    run.optimizer,
                    run.lr_scheduler,
                    micro_batches,
                    args.objective,
                    args.max_grad_norm,
                    no_cache,
                    stepper=stepper,
                )
            completed_steps += 1
            tokens_seen += tokens_per_step
            window_steps += 1
            progress.update(1)
            log_now = completed_steps % args.logging_steps == 0 or completed_steps == run.max_train_steps
            every = args.checkpointing_steps
            save_now = every not in (None, "epoch") and completed_steps % int(every) == 0
            eval_now = args.eval_steps and completed_steps % args.eval_steps == 0
            count_checked(stepper.settle() if log_now or save_now or eval_now else stepper.checked())
            if log_now:
                elapsed = time.perf_counter() - window_start
                window_tokens = window_steps * tokens_per_step
                record = {
                    "train_loss": float(window_loss) / (window_steps - window_skipped or math.nan),
                    "learning_rate": run.lr_scheduler.get_last_lr()[0],
                    **run.throughput.metrics(window_tokens, window_tokens * run.flops_per_token, elapsed),
                    "step_seconds": elapsed,  # the optimizer steps since the last record (pauses left out)
                    "tokens_seen": tokens_seen,
                    "step": completed_steps,
                    "epoch": epoch,
                }
                if grad_norm is not None:
                    record["grad_norm"] = grad_norm
                history.append(record)
                progress.set_postfix(
                    loss=f"{record['train_loss']:.4f}",
                    lr=f"{record['learning_rate']:.2e}",
                    tok_s=f"{record['tokens_per_second']:.0f}",
                    **({"tflops": f"{record['tflops']:.3g}"} if "tflops" in record else {}),
                    **({"mfu": f"{100 * record['mfu']:.1f}%"} if "mfu" in record else {}),
                )
                if args.with_tracking:
                    accelerator.log(record, step=completed_steps)
                window_start, window_steps, window_loss, window_skipped = time.perf_counter(), 0, 0.0, 0
            pause_start = time.perf_counter()
            if save_now:
                save_checkpoint(run, completed_steps, tokens_seen)
                last_saved = completed_steps
            if eval_now and completed_steps < run.max_train_steps:
                eval_start = time.perf_counter()
                metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=eval_seed)
                eval_seconds += time.perf_counter() - eval_start
                eval_history.append({"step": completed_steps, **metrics})
                logger.info(f"step {completed_steps}: {metrics}")
                if args.with_tracking:
                    accelerator.log(metrics, step=completed_steps)
            pause = time.perf_counter() - pause_start  # not training time: left out of tokens/s and MFU
            window_start, paused = window_start + pause, paused + pause
            signal_name = preemption.requested(accelerator)  # all processes agree on the step to stop at
            if signal_name is not None:
                count_checked(stepper.settle())
                if last_saved != completed_steps:
                    save_checkpoint(run, completed_steps, tokens_seen)
                raise faults.TrainingPreempted(signal_name, completed_steps, checkpoint_folder(args, completed_steps))
            if completed_steps >= run.max_train_steps:
                break
        count_checked(stepper.settle())  # the epoch's last step
        if args.checkpointing_steps == "epoch":
            pause_start = time.perf_counter()
            save_checkpoint(run, completed_steps, tokens_seen)
            last_saved = completed_steps
            pause = time.perf_counter() - pause_start
            window_start, paused = window_start + pause, paused + pause
        if completed_steps >= run.max_train_steps:
            break
    step_seconds = time.perf_counter() - start - paused  # the optimizer steps alone
    if args.checkpointing_steps is not None and last_saved != completed_steps:
        save_checkpoint(run, completed_steps, tokens_seen)  # the end of training is always a checkpoint
    progress.close()
    train_runtime = time.perf_counter() - start
    trained_tokens = tokens_seen - tokens_at_start
    speed = run.throughput.metrics(trained_tokens, trained_tokens * run.flops_per_token, step_seconds)

    eval_start = time.perf_counter()
    metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=eval_seed)
    eval_seconds += time.perf_counter() - eval_start
    eval_history.append({"step": completed_steps, **metrics})
    logger.info(f"validation: eval_loss {metrics['eval_loss']:.4f}, perplexity {metrics['perplexity']:.2f}")
    results: dict[str, Any] = {
        "objective": args.objective,
        **metrics,
        "train_loss": history[-1]["train_loss"] if history else None,
        "train_runtime": train_runtime,
        # Wall seconds of this session's optimizer steps (the sum of the log records' `step_seconds`) and of
        # its validation passes (at initialization, every --eval_steps, and the final one).
        "train_step_seconds": step_seconds,
        "eval_seconds": eval_seconds,
        "train_steps": completed_steps,
        "train_tokens_seen": tokens_seen,
        "train_tokens_per_second": trained_tokens / train_runtime if train_runtime > 0 else None,
        # Throughput of the optimizer steps of this process's session (evaluations and saves left out).
        "flops_per_token": run.flops_per_token,
        "train_step_tokens_per_second": speed.get("tokens_per_second"),
        "train_tflops": speed.get("tflops"),
        "train_mfu": speed.get("mfu"),
        "peak_tflops": run.throughput.peak.tflops,
        "peak_tflops_source": run.throughput.peak.source,
        "eval_blocks": sum(1 for _ in run.eval_dataset) if args.streaming else len(run.eval_dataset),
        "block_size": block_size,
        **(run.precision.record() if run.precision is not None else {}),
    }
    if init_metrics is not None:
        results["init_eval_loss"] = init_metrics["eval_loss"]
        results["eval_loss_reduction"] = 1.0 - metrics["eval_loss"] / init_metrics["eval_loss"]
        logger.info(
            f"validation loss {init_metrics['eval_loss']:.4f} at initialization -> {metrics['eval_loss']:.4f} "
            f"({100 * results['eval_loss_reduction']:.1f}% lower)"
        )
    # The unigram baseline counts the training tokens: only for data that was read whole.
    if accelerator.is_main_process and get_objective(args.objective).predicts_every_token and not args.streaming:
        vocab_size = accelerator.unwrap_model(model).config.vocab_size
        counts = token_counts(run.train_dataset, vocab_size)
        eval_ids = np.asarray(run.eval_dataset.with_format("numpy")["input_ids"])[:, 1:]  # the predicted tokens
        results["unigram_perplexity"] = unigram_perplexity(counts, eval_ids)
        results["perplexity_ratio_to_unigram"] = results["perplexity"] / results["unigram_perplexity"]
        logger.info(
            f"validation perplexity {results['perplexity']:.2f} vs add-one unigram perplexity "
            f"{results['unigram_perplexity']:.2f} (ratio {results['perplexity_ratio_to_unigram']:.3f})"
        )
    if args.with_tracking:
        accelerator.log({k: v for k, v in results.items() if isinstance(v, (int, float))}, step=completed_steps)
    save_final_model(run, results, history, eval_history)
    accelerator.end_training()  # also ends the process group, so that launched processes exit promptly
    preemption.uninstall()
    return results


def save_final_model(
    run: PretrainingRun,
    results: dict[str, Any],
    history: list[dict[str, float]],
    eval_history: list[dict[str, float]] | None = None,
) -> None:
    """Write `save_pretrained` weights + config + generation config, tokenizer, the results files and README.md.

    `train_history.json` holds the training records (`log_history`) and the validation records
    (`eval_history`); `training_curves.png` plots both (`hfzoo.training.plots.plot_training_curves`).

    README.md is the model card of `hfzoo.hub.build_model_card` (results and recipe arguments, without
    the hub token); with `--push_to_hub` the folder is then uploaded by `hfzoo.hub.push_to_hub`.
    """
    args, accelerator = run.args, run.accelerator
    accelerator.wait_for_everyone()
    bad = faults.first_nonfinite_parameter(accelerator, run.model)
    if bad is not None:
        raise faults.NonFiniteError(f"refusing to save the final model: parameter {bad} is not finite")
    unwrapped = accelerator.unwrap_model(run.model)
    output_dir = Path(args.output_dir)
    if unwrapped.can_generate():
        unwrapped.generation_config.bos_token_id = run.tokenizer.bos_token_id
        unwrapped.generation_config.eos_token_id = run.tokenizer.eos_token_id
        unwrapped.generation_config.pad_token_id = run.tokenizer.pad_token_id
    unwrapped.save_pretrained(
        output_dir,
        is_main_process=accelerator.is_main_process,
        save_function=accelerator.save,
        state_dict=accelerator.get_state_dict(run.model),
    )
    if accelerator.is_main_process:
        run.tokenizer.save_pretrained(output_dir)
        eval_keys = (
            "eval_loss",
            "perplexity",
            "unigram_perplexity",
            "perplexity_ratio_to_unigram",
            "eval_blocks",
        )
        write_json_atomic(output_dir / "eval_results.json", {k: results[k] for k in eval_keys if k in results})
        write_json_atomic(output_dir / "all_results.json", results)
        eval_history = eval_history or []
        write_json_atomic(output_dir / "train_history.json", {"log_history": history, "eval_history": eval_history})
        plot_training_curves(
            history, eval_history, output_dir / "training_curves.png", title=f"{output_dir.name} ({args.objective})"
        )
        card = build_model_card(output_dir, results, args, model_name=hub_repository(args))
        card.save(output_dir / "README.md")
        zero3 = accelerator.distributed_type == DistributedType.DEEPSPEED and (
            accelerator.state.deepspeed_plugin.zero_stage == 3
        )
        if args.sample_prompt and zero3:
            logger.warning("--sample_prompt is skipped under ZeRO-3 (partitioned weights); sample from the saved model")
        elif args.sample_prompt and get_objective(args.objective).can_generate:
            inputs = run.tokenizer(args.sample_prompt, return_tensors="pt").to(accelerator.device)
            with torch.no_grad():
                generated = unwrapped.eval().generate(**inputs, max_new_tokens=32, do_sample=False)
            print(f"Sample: {run.tokenizer.decode(generated[0], skip_special_tokens=True)}")
        if args.push_to_hub:
            push_to_hub(output_dir, hub_repository(args), token=args.hub_token, private=args.hub_private_repo)
    accelerator.wait_for_everyone()


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Entry point of `recipes/pretrain.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The final metrics.

    Raises:
        SystemExit: bad input (one-line message) or an argparse error; a run stopped by SIGTERM/SIGINT
            (exit code `faults.EXIT_PREEMPTED`, after writing a checkpoint), by a non-finite loss
            (`faults.EXIT_NONFINITE`), by a failed checkpoint save or a failed process (1). See
            `hfzoo.training.faults.handle_training_faults`.
    """
    try:
        args = parse_pretrain_args(argv)
        with removed_if_refused(args.output_dir):  # a refused run leaves no empty output folder behind
            run = prepare(args)
    except (ValueError, FileNotFoundError) as err:
        faults.end_process_group()
        raise SystemExit(f"error: {err}") from None
    with faults.handle_training_faults(run.accelerator, functools.partial(complete_checkpoints, args.output_dir)):
        return train(run)


def cli() -> None:
    """`hfzoo-pretrain` and `recipes/pretrain.py`: `main`, then the process ends with its exit status.

    A process of a multi-process run ends without the interpreter's teardown (`hfzoo.training.faults.run_launched`).
    """
    faults.run_launched(main)


if __name__ == "__main__":
    cli()
