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
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.logging import get_logger
from accelerate.utils import (
    DistributedType,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    send_to_device,
    set_seed,
)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    default_data_collator,
    get_scheduler,
)

from ..data.collators import DataCollatorForMaskedLM, DataCollatorForSpanCorruption
from ..data.loading import check_input_files, load_raw_datasets
from ..data.packing import token_counts, tokenize_and_pack
from ..hub import build_model_card, push_to_hub
from ..integrity import check_weight_files
from ..models.presets import PRESETS, build_config, parse_overrides
from . import faults
from .arguments import parse_pretrain_args
from .checkpointing import (
    _check_resume_topology,
    _resolve_resume,
    check_resume_config,
    checkpoint_folder,
    load_checkpoint,
    prepare_output_dir,
    save_checkpoint,
)
from .evaluation import evaluate_lm, unigram_perplexity
from .runtime import disable_cudnn_sdpa, tune_glibc_malloc

logger = get_logger(__name__)

#: objective -> the Auto class whose head it trains (and so which model families can take it).
OBJECTIVE_AUTO_CLASSES = {"clm": AutoModelForCausalLM, "mlm": AutoModelForMaskedLM, "span": AutoModelForSeq2SeqLM}


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
    train_dataset: datasets.Dataset
    eval_dataset: datasets.Dataset
    max_train_steps: int
    num_train_epochs: int
    resume_path: Path | None
    block_size: int
    train_collator: Any = default_data_collator  # applied to each micro-batch's examples in the loop
    nonfinite_guard: faults.NonFiniteGuard | None = None


def _load_tokenizer(name: str, argument: str):
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ValueError(f"{argument} {name}: cannot load a tokenizer ({str(err).splitlines()[0]})") from err


def build_model_config(args: argparse.Namespace, tokenizer) -> transformers.PreTrainedConfig:
    """Build the model config from `--config_name`/`--config_overrides` (or the pretrained model's).

    With a preset and no explicit `vocab_size`, the vocabulary size is the tokenizer's; the special
    token ids always come from the tokenizer.

    Raises:
        ValueError: unknown preset/override, invalid config, a tokenizer larger than `vocab_size`,
            or a model family without the objective's head (clm: causal LM, mlm: masked LM, span: seq2seq LM).
    """
    token_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if args.model_name_or_path is not None:
        config = transformers.AutoConfig.from_pretrained(args.model_name_or_path)
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
    auto_class = OBJECTIVE_AUTO_CLASSES[args.objective]
    if type(config) not in auto_class._model_mapping:
        raise ValueError(
            f"--objective {args.objective} needs a model with a {auto_class.__name__} head; "
            f"model_type {config.model_type!r} has none"
        )
    return config


def _check_block_size(args: argparse.Namespace, config) -> int:
    max_positions = getattr(config, "max_position_embeddings", None)
    block_size = args.block_size or min(1024, max_positions or 1024)
    if max_positions is not None and getattr(config, "position_embedding_type", "learned") != "none":
        if block_size > max_positions:
            raise ValueError(f"--block_size {block_size} is larger than max_position_embeddings={max_positions}")
    return block_size


def create_accelerator(args: argparse.Namespace) -> Accelerator:
    """Create the run's `Accelerator` for whatever `accelerate launch` started (one process, DDP or DeepSpeed).

    On a machine without a GPU, several processes need help to form a process group: DDP runs with
    `cpu=True` (accelerate's `MULTI_CPU`, gloo backend) and DeepSpeed with an explicit gloo process
    group. The world size is logged; a launch that started several processes (`WORLD_SIZE` > 1) but
    produced a world of one process is refused, so a "distributed" run never silently runs alone.

    Gradient accumulation is driven by the training loop in whole windows of
    `--gradient_accumulation_steps` micro-batches (`sync_with_dataloader=False`). Collectives wait at
    most `--ddp_timeout` seconds for the other processes.

    Raises:
        ValueError: `--mixed_precision fp16` without a GPU, or a multi-process launch that yields one process.
    """
    tune_glibc_malloc()
    disable_cudnn_sdpa()
    on_gpu = torch.cuda.is_available()
    if args.mixed_precision == "fp16" and not on_gpu:
        raise ValueError("--mixed_precision fp16 needs a GPU; on CPU use bf16 or no")
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    timeout = faults.collective_timeout(args.ddp_timeout)
    backend = "gloo" if use_deepspeed and not on_gpu else None  # None: accelerate's choice
    kwargs_handlers = [InitProcessGroupKwargs(backend=backend, timeout=timeout)]
    accelerator = Accelerator(
        cpu=not on_gpu and not use_deepspeed,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=args.gradient_accumulation_steps, sync_with_dataloader=False
        ),
        log_with=args.report_to if args.with_tracking else None,
        project_dir=args.output_dir,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=kwargs_handlers,
    )
    if launched > 1 and accelerator.num_processes == 1:
        raise ValueError(
            f"the launcher started WORLD_SIZE={launched} processes but this one runs alone "
            f"(distributed_type {accelerator.distributed_type.value}); see accelerate_configs/ for working configs"
        )
    if accelerator.mixed_precision == "fp16" and not on_gpu:
        raise ValueError("mixed_precision fp16 (from the accelerate config) needs a GPU; on CPU use bf16 or no")
    return accelerator


def size_buckets_from_model(ds_config: dict[str, Any]) -> None:
    """Let accelerate size DeepSpeed's communication buckets from the model's hidden size, in place.

    Bucket sizes not set in the config become `"auto"`, which `accelerator.prepare` fills with
    hidden_size-based values (as transformers' DeepSpeed examples do). DeepSpeed's own defaults ignore
    the model size: the ZeRO-3 gradient bucket alone is 5e8 elements (2 GB in fp32) per process.

    Args:
        ds_config: the DeepSpeed config dict (`accelerator.state.deepspeed_plugin.deepspeed_config`).
    """
    zero = ds_config.setdefault("zero_optimization", {})
    zero.setdefault("reduce_bucket_size", "auto")
    if zero.get("stage") == 3:
        zero.setdefault("stage3_prefetch_bucket_size", "auto")
        zero.setdefault("stage3_param_persistence_threshold", "auto")


def reconcile_deepspeed_config(ds_config: dict[str, Any], args: argparse.Namespace, num_processes: int) -> None:
    """Fill DeepSpeed's `"auto"` batch, accumulation and clipping values from the recipe, in place.

    Values already written in the DeepSpeed config must agree with the recipe (no settings to keep in
    sync by hand): global batch = `num_processes x per_device_train_batch_size x gradient_accumulation_steps`.
    Precision (`bf16`/`fp16` sections) is filled by accelerate from `--mixed_precision`; an explicit
    `enabled: true` that contradicts it is refused here.

    Args:
        ds_config: the DeepSpeed config dict (`accelerator.state.deepspeed_plugin.deepspeed_config`).
        args: the recipe's arguments.
        num_processes: the world size.

    Raises:
        ValueError: a value in the DeepSpeed config contradicts the recipe (one line naming both).
    """
    per_device, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    wanted = {
        "train_micro_batch_size_per_gpu": (per_device, f"--per_device_train_batch_size {per_device}"),
        "gradient_accumulation_steps": (accumulation, f"--gradient_accumulation_steps {accumulation}"),
        "train_batch_size": (
            per_device * accumulation * num_processes,
            f"{num_processes} processes x {per_device} per device x {accumulation} accumulation",
        ),
        "gradient_clipping": (args.max_grad_norm, f"--max_grad_norm {args.max_grad_norm}"),
    }
    for key, (value, source) in wanted.items():
        current = ds_config.get(key, "auto")
        if current == "auto":
            ds_config[key] = value
        elif float(current) != float(value):
            raise ValueError(f'the DeepSpeed config sets {key}={current}, which contradicts {source}; set it to "auto"')
    size_buckets_from_model(ds_config)
    precision = args.mixed_precision
    for section in ("bf16", "fp16"):
        enabled = ds_config.get(section, {}).get("enabled", "auto")
        if enabled is True and precision is not None and precision != section:
            raise ValueError(
                f"the DeepSpeed config enables {section}, which contradicts --mixed_precision {precision}; "
                'set its "enabled" to "auto"'
            )


def build_collator(args: argparse.Namespace, tokenizer, block_size: int):
    """Return the objective's batch collator and the length of the raw packed blocks it consumes.

    - `clm`: blocks of `block_size` tokens, labels = inputs (`default_data_collator`).
    - `mlm`: blocks of `block_size` tokens, BERT's 80/10/10 masking (`DataCollatorForMaskedLM`).
    - `span`: raw blocks of T5's expanded length, corrupted into inputs of exactly `block_size` tokens
      (`DataCollatorForSpanCorruption`).

    Raises:
        ValueError: the tokenizer lacks what the objective needs (mask token, sentinels, EOS), or bad
            objective parameters.
    """
    if args.objective == "mlm":
        if not 0.0 < args.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {args.mlm_probability}")
        if tokenizer.mask_token is None:
            raise ValueError(
                f"--objective mlm needs a tokenizer with a mask token; {args.tokenizer_name} has none "
                "(train one with --model_family encoder)"
            )
        collator = DataCollatorForMaskedLM(
            tokenizer=tokenizer, mlm_probability=args.mlm_probability, whole_word_mask=args.whole_word_mask
        )
        return collator, block_size
    if args.objective == "span":
        collator = DataCollatorForSpanCorruption(
            tokenizer=tokenizer,
            noise_density=args.noise_density,
            mean_noise_span_length=args.mean_noise_span_length,
            inputs_length=block_size,
        )
        return collator, collator.expanded_inputs_length
    return default_data_collator, block_size


def _build_model(args: argparse.Namespace, config) -> torch.nn.Module:
    auto_class = OBJECTIVE_AUTO_CLASSES[args.objective]
    if args.model_name_or_path is not None:
        return auto_class.from_pretrained(
            args.model_name_or_path, config=config, attn_implementation=args.attn_implementation
        )
    return auto_class.from_config(config, attn_implementation=args.attn_implementation)


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
        args: parsed arguments (see `hfzoo.training.arguments`).

    Returns:
        A `PretrainingRun`.

    Raises:
        ValueError, FileNotFoundError: bad input, with a message naming it.
    """
    prepare_output_dir(args.output_dir, checkpointing=args.checkpointing_steps is not None)
    accelerator = create_accelerator(args)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    logger.info(
        f"world size {accelerator.num_processes} (distributed_type {accelerator.distributed_type.value}, "
        f"mixed_precision {accelerator.mixed_precision})"
    )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        reconcile_deepspeed_config(accelerator.state.deepspeed_plugin.deepspeed_config, args, accelerator.num_processes)
    if accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_warning()
        transformers.utils.logging.set_verbosity_warning()
    else:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    set_seed(args.seed)
    resume_path = _resolve_resume(args, accelerator)

    tokenizer = _load_tokenizer(args.tokenizer_name or args.model_name_or_path, "--tokenizer_name")
    config = build_model_config(args, tokenizer)
    if args.model_name_or_path is not None and os.path.isdir(args.model_name_or_path):
        check_weight_files(args.model_name_or_path)  # before the data: names a truncated or corrupt file
    if resume_path is not None:
        check_resume_config(resume_path, config)
        _check_resume_topology(resume_path, accelerator)
    block_size = _check_block_size(args, config)
    collator, raw_block_size = build_collator(args, tokenizer, block_size)

    check_input_files(args.train_file, args.validation_file)  # on every process, before any waits for another
    with accelerator.main_process_first():
        raw = load_raw_datasets(
            train_file=args.train_file,
            validation_file=args.validation_file,
            dataset_name=args.dataset_name,
            dataset_config_name=args.dataset_config_name,
            text_column_name=args.text_column_name,
            validation_split_percentage=args.validation_split_percentage,
            check_files=False,
        )
        packed = tokenize_and_pack(
            raw,
            tokenizer,
            args.text_column_name,
            raw_block_size,
            num_proc=args.preprocessing_num_workers,
            clean=not args.no_clean_text,
            load_from_cache_file=not args.overwrite_cache,
            with_labels=args.objective == "clm",
        )
    train_dataset, eval_dataset = packed["train"], packed["validation"]
    if args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(args.max_train_samples, len(train_dataset))))
    if args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(args.max_eval_samples, len(eval_dataset))))
    logger.info(f"{len(train_dataset)} training and {len(eval_dataset)} validation blocks of {raw_block_size} tokens")

    with _zero3_init(accelerator):
        model = _build_model(args, config)
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    # Under DeepSpeed ZeRO-3 the parameters may already be partitioned (zero.Init): use their full shapes.
    shapes = [tuple(getattr(p, "ds_shape", p.shape)) for p in model.parameters()]
    n_params = sum(math.prod(shape) for shape in shapes)
    logger.info(f"model {type(model).__name__}: {n_params / 1e6:.2f}M parameters")

    # Exact resume: a checkpoint's RNG state must be the one the next micro-batch's random masking (mlm, span) and
    # dropout draw from. So the loader yields lists of examples and the training loop collates each micro-batch
    # (the loader prepares one batch ahead of the step), and creating a loader iterator draws its seed from the
    # loader's own generator, not from torch's global RNG. The order of the blocks is the seedable sampler's.
    train_dataloader = DataLoader(
        train_dataset,
        shuffle=True,
        collate_fn=list,
        batch_size=args.per_device_train_batch_size,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_dataloader = DataLoader(eval_dataset, collate_fn=collator, batch_size=args.per_device_eval_batch_size)
    # No weight decay on biases and normalization weights (1-D tensors), as in BERT and GPT-2.
    decay = [p for p, shape in zip(model.parameters(), shapes) if len(shape) >= 2]
    no_decay = [p for p, shape in zip(model.parameters(), shapes) if len(shape) < 2]
    fused = args.optim == "adamw_torch_fused" and accelerator.distributed_type != DistributedType.DEEPSPEED
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        fused=fused or None,
    )
    # Each optimizer step takes a whole window of accumulation micro-batches; an incomplete last window
    # of an epoch is skipped, so that every step sees the same global batch.
    steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes) // args.gradient_accumulation_steps
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(train_dataset)} training blocks make fewer than one global batch of "
            f"{accelerator.num_processes} processes x {args.per_device_train_batch_size} per device x "
            f"{args.gradient_accumulation_steps} accumulation"
        )
    max_train_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    num_train_epochs = math.ceil(max_train_steps / steps_per_epoch)
    # accelerate steps the scheduler once per process per optimizer step (run_clm_no_trainer does the same).
    lr_scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
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
        train_collator=collator,
        nonfinite_guard=faults.NonFiniteGuard(
            args.max_nonfinite_steps,
            check_grad_norm=accelerator.mixed_precision != "fp16",
            log=accelerator.is_main_process,
        ),
    )


def count_predicted_tokens(batch: dict[str, torch.Tensor], objective: str) -> torch.Tensor:
    """Number of labelled positions the loss averages over in `batch` (int64 scalar tensor).

    `clm` models shift labels inside (position t predicts label t+1), so the first label of each row is
    never predicted; `mlm` and `span` count every label that is not -100.
    """
    labels = batch["labels"]
    if objective == "clm":
        labels = labels[..., 1:]
    return (labels != -100).sum()


def accumulation_step(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer,
    lr_scheduler,
    micro_batches: list[dict[str, torch.Tensor]],
    objective: str,
    max_grad_norm: float,
) -> tuple[torch.Tensor, float | None]:
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
        objective: `clm`, `mlm` or `span` (how labels are counted, see `count_predicted_tokens`).
        max_grad_norm: clip the global gradient norm to this (0: no clipping; the norm is still measured).

    A step whose gradient norm is not finite is not applied: neither the optimizer nor the scheduler
    steps (under DeepSpeed, the engine skips it itself; under fp16, the loss scaler does).

    Returns:
        `(loss, grad_norm)`: the float32 scalar per-token mean loss over the global batch (same on every
        process) and the gradient norm before clipping (None where the backend does not report it).
    """
    counts = [count_predicted_tokens(batch, objective) for batch in micro_batches]
    global_count = accelerator.reduce(torch.stack(counts).sum().to(accelerator.device), reduction="sum")
    weight = accelerator.num_processes * len(micro_batches) / global_count.clamp(min=1).float()
    total = torch.zeros((), dtype=torch.float32, device=accelerator.device)
    grad_norm = None
    for batch, count in zip(micro_batches, counts):
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss * (count * weight))
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
                grad_norm = None if norm is None else float(norm)
            # A non-finite gradient norm is never applied (under fp16 loss scaling the scaler skips the step).
            if grad_norm is None or math.isfinite(grad_norm) or accelerator.scaler is not None:
                optimizer.step()
                lr_scheduler.step()
            optimizer.zero_grad()
        total += loss.detach().float() * count
    return accelerator.reduce(total, reduction="sum") / global_count.clamp(min=1), grad_norm


def _windows(loader, size: int):
    """Yield lists of `size` consecutive batches of `loader` (an incomplete last list is dropped)."""
    window = []
    for batch in loader:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []


def _write_json(path: Path, values: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(values, indent=2) + "\n")
    os.replace(tmp, path)


def train(run: PretrainingRun) -> dict[str, float]:
    """Run the optimisation loop, evaluate, and save the final model.

    Returns:
        The final metrics written to `all_results.json`.
    """
    args, accelerator, model = run.args, run.accelerator, run.model
    block_size = run.block_size
    raw_block_size = len(run.train_dataset[0]["input_ids"])  # text tokens per example (span: before corruption)
    tokens_per_step = (
        args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes * raw_block_size
    )
    if args.with_tracking:
        accelerator.init_trackers(
            "pretrain", {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        )
    logger.info("***** Running training *****")
    logger.info(f"  Blocks = {len(run.train_dataset)}, epochs = {run.num_train_epochs}")
    logger.info(
        f"  Global batch = {args.per_device_train_batch_size} per device x {accelerator.num_processes} processes"
        f" x {args.gradient_accumulation_steps} accumulation = {tokens_per_step} tokens"
    )
    logger.info(f"  Optimizer steps = {run.max_train_steps}")

    completed_steps, tokens_seen = 0, 0
    init_metrics = None
    if run.resume_path is None:
        init_metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=args.seed)
        logger.info(f"validation loss at initialization: {init_metrics['eval_loss']:.4f}")
    else:
        state = load_checkpoint(accelerator, run.resume_path)
        run.nonfinite_guard.load_state_dict(state)
        completed_steps, tokens_seen = state["step"], state["tokens_seen"]
        logger.info(f"Resumed from {run.resume_path} at step {completed_steps}")
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
    history: list[dict[str, float]] = []
    first_window = True
    last_saved = completed_steps  # a resumed run's starting point is already a checkpoint
    # A run resumed from its last checkpoint has nothing left to train.
    epochs = range(start_epoch, run.num_train_epochs) if completed_steps < run.max_train_steps else range(0)
    preemption = faults.PreemptionHandler().install()  # SIGTERM/SIGINT: stop after the current step
    for epoch in epochs:
        run.train_dataloader.set_epoch(epoch)
        loader = run.train_dataloader
        if epoch == start_epoch and skip_batches:
            loader = accelerator.skip_first_batches(run.train_dataloader, skip_batches)
        for window in _windows(loader, args.gradient_accumulation_steps):
            micro_batches = [send_to_device(run.train_collator(examples), accelerator.device) for examples in window]
            if first_window:
                # Which blocks each process trains on (sums of token ids per row): different on every process.
                row_sums = micro_batches[0]["input_ids"].sum(dim=-1).tolist()
                logger.info(
                    f"process {accelerator.process_index}/{accelerator.num_processes}: "
                    f"first micro-batch row token-id sums {row_sums}",
                    main_process_only=False,
                )
                first_window = False
            loss, grad_norm = accumulation_step(
                accelerator,
                model,
                run.optimizer,
                run.lr_scheduler,
                micro_batches,
                args.objective,
                args.max_grad_norm,
            )
            completed_steps += 1
            if run.nonfinite_guard.check(completed_steps, loss, grad_norm):  # raises unless skips are allowed
                window_skipped += 1
            else:
                window_loss += loss  # a tensor: no device sync until the log line reads it
            tokens_seen += tokens_per_step
            window_steps += 1
            progress.update(1)
            if completed_steps % args.logging_steps == 0 or completed_steps == run.max_train_steps:
                elapsed = time.perf_counter() - window_start
                record = {
                    "train_loss": float(window_loss) / (window_steps - window_skipped or math.nan),
                    "learning_rate": run.lr_scheduler.get_last_lr()[0],
                    "tokens_per_second": window_steps * tokens_per_step / elapsed,
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
                )
                if args.with_tracking:
                    accelerator.log(record, step=completed_steps)
                window_start, window_steps, window_loss, window_skipped = time.perf_counter(), 0, 0.0, 0
            if args.checkpointing_steps not in (None, "epoch") and completed_steps % int(args.checkpointing_steps) == 0:
                save_checkpoint(run, completed_steps, tokens_seen)
                last_saved = completed_steps
            if args.eval_steps and completed_steps % args.eval_steps == 0 and completed_steps < run.max_train_steps:
                metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=args.seed)
                logger.info(f"step {completed_steps}: {metrics}")
                if args.with_tracking:
                    accelerator.log(metrics, step=completed_steps)
            signal_name = preemption.requested(accelerator)  # all processes agree on the step to stop at
            if signal_name is not None:
                if last_saved != completed_steps:
                    save_checkpoint(run, completed_steps, tokens_seen)
                raise faults.TrainingPreempted(signal_name, completed_steps, checkpoint_folder(args, completed_steps))
            if completed_steps >= run.max_train_steps:
                break
        if args.checkpointing_steps == "epoch":
            save_checkpoint(run, completed_steps, tokens_seen)
            last_saved = completed_steps
        if completed_steps >= run.max_train_steps:
            break
    if args.checkpointing_steps is not None and last_saved != completed_steps:
        save_checkpoint(run, completed_steps, tokens_seen)  # the end of training is always a checkpoint
    preemption.uninstall()
    progress.close()
    train_runtime = time.perf_counter() - start

    metrics = evaluate_lm(model, run.eval_dataloader, accelerator, seed=args.seed)
    logger.info(f"validation: eval_loss {metrics['eval_loss']:.4f}, perplexity {metrics['perplexity']:.2f}")
    results: dict[str, Any] = {
        "objective": args.objective,
        **metrics,
        "train_loss": history[-1]["train_loss"] if history else None,
        "train_runtime": train_runtime,
        "train_steps": completed_steps,
        "train_tokens_seen": tokens_seen,
        "train_tokens_per_second": tokens_seen / train_runtime if train_runtime > 0 else None,
        "eval_blocks": len(run.eval_dataset),
        "block_size": block_size,
    }
    if init_metrics is not None:
        results["init_eval_loss"] = init_metrics["eval_loss"]
        results["eval_loss_reduction"] = 1.0 - metrics["eval_loss"] / init_metrics["eval_loss"]
        logger.info(
            f"validation loss {init_metrics['eval_loss']:.4f} at initialization -> {metrics['eval_loss']:.4f} "
            f"({100 * results['eval_loss_reduction']:.1f}% lower)"
        )
    if accelerator.is_main_process and args.objective == "clm":
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
    save_final_model(run, results, history)
    accelerator.end_training()  # also ends the process group, so that launched processes exit promptly
    return results


def save_final_model(run: PretrainingRun, results: dict[str, Any], history: list[dict[str, float]]) -> None:
    """Write `save_pretrained` weights + config + generation config, tokenizer, the results files and README.md.

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
        _write_json(output_dir / "eval_results.json", {k: results[k] for k in eval_keys if k in results})
        _write_json(output_dir / "all_results.json", results)
        _write_json(output_dir / "train_history.json", {"log_history": history})
        card = build_model_card(output_dir, results, args, model_name=args.hub_model_id or output_dir.name)
        card.save(output_dir / "README.md")
        zero3 = accelerator.distributed_type == DistributedType.DEEPSPEED and (
            accelerator.state.deepspeed_plugin.zero_stage == 3
        )
        if args.sample_prompt and zero3:
            logger.warning("--sample_prompt is skipped under ZeRO-3 (partitioned weights); sample from the saved model")
        elif args.sample_prompt and args.objective != "mlm":
            inputs = run.tokenizer(args.sample_prompt, return_tensors="pt").to(accelerator.device)
            with torch.no_grad():
                generated = unwrapped.eval().generate(**inputs, max_new_tokens=32, do_sample=False)
            print(f"Sample: {run.tokenizer.decode(generated[0], skip_special_tokens=True)}")
        if args.push_to_hub:
            push_to_hub(output_dir, args.hub_model_id or output_dir.name, token=args.hub_token)
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
        run = prepare(args)
    except (ValueError, FileNotFoundError) as err:
        faults.end_process_group()
        raise SystemExit(f"error: {err}") from None
    with faults.handle_training_faults(run.accelerator, args.output_dir):
        return train(run)
