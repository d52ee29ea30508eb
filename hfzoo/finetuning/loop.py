"""The GLUE finetuning loop: train, evaluate after every epoch, keep the best epoch, checkpoint and resume.

`train_glue(run)` runs the optimisation of a `GlueRun` (built by `hfzoo.finetuning.glue.prepare_glue`) with
gradient accumulation, clipping, a tqdm progress bar and logging every `--logging_steps`; after each
epoch `evaluate_glue` computes every dev split's loss and official metrics, and the epoch with the best
main metric (`GlueTask.main_metric`) is remembered. `save_glue_checkpoint` writes resumable checkpoints
(`checkpoints/step_N`, atomically); a run resumed from one continues exactly as the uninterrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..data.glue import GlueTask
from ..hub import TRACKER_PROJECTS
from ..metrics import load_glue_metric
from ..modules.embeddings import caller_checked_ids
from ..training import faults
from ..training.arguments import tracker_config
from ..training.checkpointing import (
    CHECKPOINT_DIR,
    check_resume_arguments,
    optimizer_arguments,
    prune_checkpoints,
    recorded_arguments,
    resolve_resume_argument,
    save_accelerator_state,
    write_manifest,
)
from ..training.compilation import no_cache_kwargs
from ..training.precision import PrecisionChoice
from ..training.throughput import SequenceClassificationFlops, Throughput


@dataclass
class GlueRun:
    """Everything `train_glue` needs, built and checked by `prepare_glue`."""

    args: argparse.Namespace
    task: GlueTask
    accelerator: Accelerator
    tokenizer: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    train_dataloader: DataLoader
    eval_dataloaders: dict[str, DataLoader]
    train_examples: int
    trainable_parameters: int
    total_parameters: int
    max_train_steps: int
    num_train_epochs: int
    resume_path: Path | None = None
    # The base's `hfzoo.training.checkpointing.base_model_record`, which its checkpoints record (None: not recorded).
    base_model: dict[str, Any] | None = None
    throughput: Throughput | None = None  # TFLOP/s and MFU of the logged windows (None: tokens/s only)
    flops: SequenceClassificationFlops | None = None  # a batch's model FLOPs (None: not counted)
    precision: PrecisionChoice | None = None  # the precision it trains in and why (`--mixed_precision`)
    # Whether the datasets' ids and labels were checked before training (`glue.check_encoded_inputs`): the forwards
    # then run inside `caller_checked_ids()`, without the models' own checks (a host-device sync each on a GPU).
    inputs_checked: bool = False


def _metric_name(task: GlueTask, split: str) -> str:
    """The `evaluate` config of a dev split: MNLI's two dev sets have their own names."""
    return {"validation_matched": "mnli_matched", "validation_mismatched": "mnli_mismatched"}.get(split, task.name)


def evaluate_glue(
    model, dataloader, task: GlueTask, accelerator: Accelerator, metric_name: str, inputs_checked: bool = False
) -> dict[str, float]:
    """Predict a dev set; compute its mean loss and the task's official metric(s) (hfzoo's offline `evaluate` module).

    Args:
        model: the (possibly PEFT-wrapped, accelerate-prepared) sequence classifier.
        dataloader: batches with `labels`.
        task: the GLUE task (regression: the single logit is the prediction, the loss the squared error;
            else the argmax, the loss the cross-entropy, as the model's own loss).
        accelerator: gathers predictions and per-example losses across processes.
        metric_name: the `evaluate` config name (`mnli_matched` / `mnli_mismatched` for MNLI's dev sets).
        inputs_checked: the batches' ids and labels were checked before (`GlueRun.inputs_checked`): the forwards
            run inside `caller_checked_ids()`.

    Returns:
        `{metric: value, "loss": mean loss per example}` as floats.
    """
    metric = load_glue_metric(metric_name)
    model.eval()
    loss_sum, count = 0.0, 0
    no_cache = no_cache_kwargs(model)
    checked = caller_checked_ids if inputs_checked else contextlib.nullcontext
    for batch in dataloader:
        with torch.no_grad(), checked():
            logits = model(**batch, **no_cache).logits.float()
        labels = batch["labels"]
        if task.is_regression:
            predictions = logits.squeeze(-1)
            losses = F.mse_loss(predictions, labels.float(), reduction="none")
        else:
            predictions = logits.argmax(-1)
            losses = F.cross_entropy(logits, labels, reduction="none")
        predictions, references, losses = accelerator.gather_for_metrics((predictions, labels, losses))
        metric.add_batch(predictions=predictions.cpu().numpy(), references=references.cpu().numpy())
        loss_sum, count = loss_sum + float(losses.sum()), count + losses.numel()
    return {**{k: float(v) for k, v in metric.compute().items()}, "loss": loss_sum / max(count, 1)}


#: The loop's state in a checkpoint `<output_dir>/checkpoints/step_N` (`CHECKPOINT_DIR`, as pretraining's; left out
#: of hub uploads, `hfzoo.hub.IGNORE_PATTERNS`), written before the folder's manifest.
GLUE_STATE = "glue_state.json"
#: The flags that decide which examples a GLUE run trains on, as which tokens, in which order (`data_arguments`).
GLUE_DATA_FLAGS = ("task_name", "train_file", "validation_file", "max_length", "pad_to_max_length", "group_by_length",
                   "max_train_samples", "seed")  # fmt: skip
GLUE_DATA_CHANGE = (
    "the resumed run would go on at the checkpoint's position in other examples (another task, other tokens or "
    "another order); resume with the checkpoint's settings, or start a new run"
)
#: The flags that decide the shape and use of the trained adapter's weights (`adapter_arguments`).
GLUE_ADAPTER_FLAGS = ("peft", "lora_r", "lora_alpha", "target_modules", "num_virtual_tokens", "prefix_projection",
                      "prefix_hidden_size")  # fmt: skip
GLUE_ADAPTER_CHANGE = (
    "the checkpoint holds the trained weights of its own adapter, which do not fit this run's; resume with the "
    "checkpoint's adapter settings, or start a new run"
)
#: The best epoch's trainable weights in a checkpoint (kept for the final selection).
BEST_WEIGHTS = "best_epoch_trainable.safetensors"


@dataclass
class GlueProgress:
    """Where a GLUE run stands: what `train_glue` returns and what a checkpoint stores (`GLUE_STATE`).

    Attributes:
        step: optimizer steps done.
        epoch: epochs finished (evaluated).
        batches_done: batches of the current epoch already trained (skipped on resume).
        log_history: training records (`step`, `epoch`, `train_loss`, `learning_rate`, `tokens_per_second`).
        eval_history: dev metrics after each epoch (`epoch`, `step`, `eval_<metric>`, `eval_loss`).
        best_epoch: the epoch with the highest main metric so far (None before the first evaluation).
        best_metric: its value.
        throughput: training totals over the run's sessions: `tokens` (real tokens), `flops` (model
            FLOPs) and `seconds` (optimizer steps only; evaluations and checkpoints left out).
        batch_layout: the processes and batch settings that wrote it (`glue_batch_layout`; None in checkpoints
            of an older hfzoo): a resume must keep them (`check_glue_resume_layout`).
        optimizer_arguments: the optimizer hyperparameters that wrote it
            (`hfzoo.training.checkpointing.optimizer_arguments`; None in checkpoints of an older hfzoo): a resume
            must keep them (`check_resume_optimizer`).
        data_arguments, adapter_arguments: the values of `GLUE_DATA_FLAGS` and `GLUE_ADAPTER_FLAGS` that wrote it
            (`hfzoo.training.checkpointing.recorded_arguments`; None in checkpoints of an older hfzoo): a resume must
            keep them (`check_glue_resume_arguments`).
        base_model: the pretrained model it finetunes (`hfzoo.training.checkpointing.base_model_record`: its
            config, a digest of its vocabulary and of its loaded weights; None in checkpoints of an older hfzoo): a
            resume must start from the same model (`hfzoo.training.checkpointing.check_resume_base_model`).
        nonfinite_steps: the steps whose update was left out for a non-finite loss or gradient norm
            (`--max_nonfinite_steps`; `hfzoo.training.faults.NonFiniteGuard`), counted across resumes.
    """

    step: int = 0
    epoch: int = 0
    batches_done: int = 0
    log_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    eval_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best_epoch: int | None = None
    best_metric: float | None = None
    throughput: dict[str, float] = dataclasses.field(default_factory=lambda: {"tokens": 0, "flops": 0, "seconds": 0})
    batch_layout: dict[str, int] | None = None
    optimizer_arguments: dict[str, Any] | None = None
    data_arguments: dict[str, Any] | None = None
    adapter_arguments: dict[str, Any] | None = None
    base_model: dict[str, Any] | None = None
    nonfinite_steps: list[int] = dataclasses.field(default_factory=list)


def check_glue_resume_arguments(resume_path: Path, args: argparse.Namespace) -> None:
    """Refuse a resume with another task, data or adapter settings than its checkpoint's, before any data is read.

    Raises:
        ValueError: one line naming each changed flag with both values (`check_resume_arguments`).
    """
    for flags, key, consequence in ((GLUE_DATA_FLAGS, "data_arguments", GLUE_DATA_CHANGE),
                                    (GLUE_ADAPTER_FLAGS, "adapter_arguments", GLUE_ADAPTER_CHANGE)):  # fmt: skip
        check_resume_arguments(resume_path, args, flags, key, consequence, GLUE_STATE)


def glue_batch_layout(args: argparse.Namespace, accelerator: Accelerator) -> dict[str, int]:
    """`{"num_processes", "per_device_train_batch_size", "gradient_accumulation_steps"}` of this run."""
    return {
        "num_processes": accelerator.num_processes,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
    }


def check_glue_resume_layout(resume_path: Path, args: argparse.Namespace, accelerator: Accelerator) -> None:
    """Refuse a checkpoint written with other processes or batch settings, before any data is read.

    A GLUE checkpoint's data position is the number of batches each process has trained in the current epoch
    (`GlueProgress.batches_done`), and its random states are per process, so the run resumes exactly only with the
    number of processes, `--per_device_train_batch_size` and `--gradient_accumulation_steps` that wrote it.
    A checkpoint of an older hfzoo does not record them and is not checked.

    Raises:
        ValueError: one line naming both layouts.
    """
    saved = json.loads((resume_path / GLUE_STATE).read_text()).get("batch_layout")
    here = glue_batch_layout(args, accelerator)
    if saved is not None and saved != here:

        def show(layout: dict[str, int]) -> str:
            return ", ".join(f"{key} {value}" for key, value in layout.items())

        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: written with {show(saved)}; this run has {show(here)}: its data "
            "position counts each process's batches, so resume with the settings that wrote it"
        )


def resolve_glue_resume(args: argparse.Namespace) -> Path | None:
    """The checkpoint folder `--resume_from_checkpoint` names, checked against its manifest.

    `latest`: the newest intact checkpoint in `--output_dir` (unfinished saves and damaged folders are skipped with
    a warning), or None when there is none (`hfzoo.training.checkpointing.resolve_resume_argument`).

    Raises:
        ValueError: a folder that is not a complete GLUE checkpoint, or one whose files do not match its manifest
            (`CheckpointError`, naming the file); `latest` with checkpoints of which none is intact.
    """
    if not args.resume_from_checkpoint:
        return None
    return resolve_resume_argument(args.resume_from_checkpoint, args.output_dir, GLUE_STATE, "GLUE checkpoint")


def _trainable_state(run: GlueRun) -> dict[str, torch.Tensor]:
    model = run.accelerator.unwrap_model(run.model)
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def _load_trainable_state(run: GlueRun, state: dict[str, torch.Tensor]) -> None:
    parameters = dict(run.accelerator.unwrap_model(run.model).named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            parameters[name].copy_(value)


def _load_glue_state(run: GlueRun) -> None:
    """`accelerator.load_state` of `run.resume_path`, naming the checkpoint when its weights do not fit the model.

    Raises:
        ValueError: the checkpoint was written from another model (`--model_name_or_path`): torch's
            `load_state_dict` error, in one line.
    """
    try:
        run.accelerator.load_state(str(run.resume_path))
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        if not lines or not lines[0].startswith("Error(s) in loading state_dict"):
            raise
        detail = lines[1] if len(lines) > 1 else lines[0]
        detail = detail if len(detail) <= 200 else f"{detail[:200]}..."
        raise ValueError(
            f"--resume_from_checkpoint {run.resume_path}: its weights do not fit this run's model "
            f"(--model_name_or_path {run.args.model_name_or_path}: {detail}); resume from the model the checkpoint "
            "was written from"
        ) from err


def save_glue_checkpoint(run: GlueRun, progress: GlueProgress, best_state: dict[str, torch.Tensor] | None) -> Path:
    """Save a resumable checkpoint atomically: accelerate's state, the best epoch's weights, `GLUE_STATE`, a manifest.

    Every process writes its part to `checkpoints/step_N.tmp`; the main process then adds the best
    epoch's trainable weights, the loop state and, last, `manifest.json` (every file's size and sha256,
    `hfzoo.training.checkpointing.write_manifest`, checked before a resume), and renames the folder to
    `checkpoints/step_N`; then only the newest `--checkpoints_total_limit` checkpoints are kept (`prune_checkpoints`).

    Returns:
        The checkpoint folder.
    """
    accelerator = run.accelerator
    root = Path(run.args.output_dir) / CHECKPOINT_DIR
    final, tmp = root / f"step_{progress.step}", root / f"step_{progress.step}.tmp"
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    save_accelerator_state(accelerator, run.model, tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if best_state is not None:
            save_file(best_state, tmp / BEST_WEIGHTS)
        (tmp / GLUE_STATE).write_text(json.dumps(dataclasses.asdict(progress), indent=1))
        write_manifest(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune_checkpoints(root, run.args.checkpoints_total_limit, progress.step)
    accelerator.wait_for_everyone()
    return final


def _eval_record(task: GlueTask, metrics_by_split: dict[str, dict[str, float]]) -> dict[str, float]:
    """`eval_<metric>` names as transformers' GLUE examples write them (MNLI mismatched: `eval_<metric>_mm`)."""
    record = {}
    for split, metrics in metrics_by_split.items():
        suffix = "_mm" if split == "validation_mismatched" else ""
        record.update({f"eval_{name}{suffix}": value for name, value in metrics.items()})
    return record


def _improves(value: float, best: float | None) -> bool:
    """Higher is better for every GLUE metric; an undefined one (NaN, e.g. Pearson of constant predictions) is worst."""
    return best is None or (not math.isnan(value) and (math.isnan(best) or value > best))


def train_glue(run: GlueRun) -> GlueProgress:
    """Finetune for `run.max_train_steps` optimizer steps, evaluating every dev split after each epoch.

    Resumes from `run.resume_path` when set. After each epoch the main metric of the first dev split
    (`GlueTask.main_metric`) decides whether the epoch is the best so far; at the end the model holds
    the best epoch's weights, or the last epoch's with `--save_last_epoch`.

    Args:
        run: from `prepare_glue`.

    Returns:
        The final `GlueProgress` (histories, best epoch).
    """
    args, accelerator, model, task = run.args, run.accelerator, run.model, run.task
    if args.with_tracking:
        accelerator.init_trackers(TRACKER_PROJECTS["glue"], tracker_config(args))
    layout = {
        "batch_layout": glue_batch_layout(args, accelerator),
        "optimizer_arguments": optimizer_arguments(args),
        "data_arguments": recorded_arguments(args, GLUE_DATA_FLAGS),
        "adapter_arguments": recorded_arguments(args, GLUE_ADAPTER_FLAGS),
        "base_model": run.base_model,
    }
    progress, best_state = GlueProgress(**layout), None
    if run.resume_path is not None:  # with this run's layout and optimizer (checked in `prepare_glue`)
        _load_glue_state(run)
        saved = json.loads((run.resume_path / GLUE_STATE).read_text())
        progress = GlueProgress(**{**saved, **layout})
        if (run.resume_path / BEST_WEIGHTS).is_file():
            best_state = load_file(run.resume_path / BEST_WEIGHTS)
        accelerator.print(f"resumed from {run.resume_path} at step {progress.step}")
    main_metric = f"eval_{task.main_metric}"
    bar = tqdm(
        total=run.max_train_steps,
        initial=progress.step,
        disable=not accelerator.is_local_main_process,
        desc=f"{task.name} ({args.peft})",
        unit="step",
    )
    window_loss = torch.zeros((), device=accelerator.device)
    window_tokens = torch.zeros((), device=accelerator.device)
    window_flops = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    window_batches, window_start = 0, time.perf_counter()
    # A step whose gradient norm (or, under fp16 loss scaling, loss) is not finite is never applied; the guard then
    # stops the run, or with --max_nonfinite_steps lets it go on. With a fused optimizer the stepper reads each
    # step's norm one step late (no host-device sync per step), so a step is checked then or at the next `settle()`.
    stepper = faults.OptimizerStepper.for_run(accelerator, run.optimizer, run.lr_scheduler, progress.step)
    guard = faults.NonFiniteGuard(
        args.max_nonfinite_steps, check_grad_norm=accelerator.mixed_precision != "fp16", log=accelerator.is_main_process
    )
    guard.load_state_dict({"nonfinite_steps": progress.nonfinite_steps})
    step_loss, step_batches = torch.zeros((), device=accelerator.device), 0
    unchecked: dict[int, tuple[torch.Tensor, int]] = {}  # step -> (its summed micro-batch losses, micro-batches)

    def count_checked(checked: list[faults.CheckedStep]) -> None:
        nonlocal window_loss, window_batches
        for done in checked:
            loss_sum, batches = unchecked.pop(done.step)
            if not guard.check(done.step, loss_sum / batches, done.grad_norm):  # raises unless skips are allowed
                window_loss += loss_sum
                window_batches += batches
        progress.nonfinite_steps = list(guard.skipped_steps)

    no_cache = no_cache_kwargs(model)  # a KV cache is of no use here (and makes compiled layers specialize)
    # SIGTERM/SIGINT: stop after the current step with a checkpoint (uninstalled by `run_glue` on any exit)
    preemption = faults.PreemptionHandler().install()
    checked = caller_checked_ids if run.inputs_checked else contextlib.nullcontext
    while progress.epoch < run.num_train_epochs:
        if progress.step >= run.max_train_steps and progress.batches_done == 0:
            break  # resumed after the last evaluation: nothing left
        model.train()
        run.train_dataloader.set_epoch(progress.epoch)
        loader = run.train_dataloader
        if progress.batches_done:
            loader = accelerator.skip_first_batches(run.train_dataloader, progress.batches_done)
        for batch in loader if progress.step < run.max_train_steps else ():
            with accelerator.accumulate(model):
                with checked():
                    loss = model(**batch, **no_cache).loss
                accelerator.backward(loss)
                step_loss += loss.detach().float()
                step_batches += 1
                if accelerator.sync_gradients:
                    unchecked[progress.step + 1] = (step_loss, step_batches)
                    step_loss, step_batches = torch.zeros((), device=accelerator.device), 0
                    bound = args.max_grad_norm if args.max_grad_norm > 0 else math.inf  # inf: the norm, no clipping
                    stepper.step(accelerator.clip_grad_norm_(model.parameters(), bound))
                    count_checked(stepper.checked())
                else:  # accelerate's wrappers do nothing between synchronizations
                    run.optimizer.step()
                    run.lr_scheduler.step()
                run.optimizer.zero_grad()
            progress.batches_done += 1
            window_tokens += batch["attention_mask"].sum()
            if run.throughput is not None and run.flops is not None:  # tensors: no host sync until the log line
                window_flops += run.flops(batch["attention_mask"])
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            bar.update(1)
            last = progress.step >= run.max_train_steps
            saving = (
                args.checkpointing_steps not in (None, "epoch") and progress.step % int(args.checkpointing_steps) == 0
            )
            logging_step = progress.step % args.logging_steps == 0 or last
            if logging_step or saving:
                count_checked(stepper.settle())  # before a log line, a save or the evaluation that follows
            if logging_step:
                tokens = accelerator.reduce(window_tokens, reduction="sum").item()
                flops = accelerator.reduce(window_flops, reduction="sum").item()
                seconds = time.perf_counter() - window_start
                record = {
                    "step": progress.step,
                    "epoch": progress.epoch,
                    "train_loss": (window_loss / window_batches).item() if window_batches else math.nan,
                    "learning_rate": run.lr_scheduler.get_last_lr()[0],
                    "tokens_per_second": tokens / seconds,
                }
                if run.throughput is not None:
                    record.update(run.throughput.metrics(tokens, flops, seconds))
                for key, value in (("tokens", tokens), ("flops", flops), ("seconds", seconds)):
                    progress.throughput[key] += value
                progress.log_history.append(record)
                bar.set_postfix(
                    loss=f"{record['train_loss']:.4f}",
                    lr=f"{record['learning_rate']:.2e}",
                    tok_s=f"{record['tokens_per_second']:.0f}",
                    **({"tflops": f"{record['tflops']:.3g}"} if "tflops" in record else {}),
                    **({"mfu": f"{100 * record['mfu']:.1f}%"} if "mfu" in record else {}),
                )
                if args.with_tracking:
                    accelerator.log(record, step=progress.step)
                window_loss.zero_(), window_tokens.zero_(), window_flops.zero_()
                window_batches, window_start = 0, time.perf_counter()
            if saving:
                pause_start = time.perf_counter()
                save_glue_checkpoint(run, progress, best_state)
                window_start += time.perf_counter() - pause_start  # not training time
            if last:
                break  # a signal now: the evaluation and the save are all that is left, and they run
            signal_name = preemption.requested(accelerator)  # all processes agree on the step to stop at
            if signal_name is not None:
                count_checked(stepper.settle())
                folder = Path(args.output_dir) / CHECKPOINT_DIR / f"step_{progress.step}"
                if not saving:
                    folder = save_glue_checkpoint(run, progress, best_state)
                raise faults.TrainingPreempted(signal_name, progress.step, folder)
        count_checked(stepper.settle())  # every step of the epoch, before its evaluation
        pause_start = time.perf_counter()
        metrics = {
            split: evaluate_glue(model, eval_loader, task, accelerator, _metric_name(task, split), run.inputs_checked)
            for split, eval_loader in run.eval_dataloaders.items()
        }
        record = {"epoch": progress.epoch + 1, "step": progress.step, **_eval_record(task, metrics)}
        progress.eval_history.append(record)
        progress.epoch, progress.batches_done = progress.epoch + 1, 0
        if _improves(record[main_metric], progress.best_metric):
            progress.best_epoch, progress.best_metric = record["epoch"], record[main_metric]
            best_state = _trainable_state(run) if not args.save_last_epoch else None
        bar.write(f"epoch {record['epoch']}: " + ", ".join(f"{k} {v:.4f}" for k, v in record.items() if "eval_" in k))
        if args.with_tracking:
            accelerator.log(record, step=progress.step)
        if args.checkpointing_steps == "epoch":
            save_glue_checkpoint(run, progress, best_state)
        window_start += time.perf_counter() - pause_start  # evaluation and saving are not training time
    bar.close()
    if best_state is not None and progress.best_epoch != progress.epoch:
        _load_trainable_state(run, best_state)  # the best epoch's weights are the ones saved
    return progress
