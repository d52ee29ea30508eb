"""Faults a long training run must survive: preemption signals, non-finite values, failing processes.

- `PreemptionHandler`: SIGTERM / SIGINT ask the run to stop; the training loop finishes its current
  optimizer step, writes a checkpoint and exits with `EXIT_PREEMPTED`. Several processes agree on the
  step to stop at (one all-reduce of a flag per step over a CPU process group).
- `NonFiniteGuard`: a non-finite gradient norm (or loss) stops the run at the step it happens, without
  applying that step's update; `--max_nonfinite_steps N` skips up to N such steps instead.
  `OptimizerStepper` takes the optimizer and scheduler steps, leaving such updates out (on the device, with a
  fused optimizer, reading the norm a step later). `first_nonfinite_parameter` keeps non-finite weights out of
  checkpoints.
- `handle_training_faults`: the context manager around the training loop that turns these faults (and
  failed collectives) into a one-line message and an exit code, and always destroys the process group.
- `record_peers` / `lost_peers`: which process (rank, node, host) a failed collective lost, for that message.
- `run_launched`: runs a job's entry point as a process's whole work; a process of a multi-process run then
  ends without the interpreter's teardown, which can abort it after a run that finished.

Exit codes: 0 success, 1 error (including a failed checkpoint save or collective), 2 bad arguments,
`EXIT_PREEMPTED` = 75 (stopped by a signal after writing a checkpoint; sysexits' EX_TEMPFAIL: run
again with `--resume_from_checkpoint latest`), `EXIT_NONFINITE` = 76 (stopped on a non-finite loss or
gradient norm; the last checkpoint is intact).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..data.loading import DataReadError

logger = logging.getLogger(__name__)

#: Exit code of a run stopped by SIGTERM/SIGINT after writing its checkpoint (sysexits.h EX_TEMPFAIL).
EXIT_PREEMPTED = 75
#: Exit code of a run stopped on a non-finite loss or gradient norm.
EXIT_NONFINITE = 76
#: The signals that ask a run to stop at the end of its current optimizer step.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingPreempted(Exception):
    """The run stopped on a signal after writing a checkpoint.

    Attributes:
        signal_name: e.g. `"SIGTERM"`.
        step: the optimizer step the checkpoint holds.
        checkpoint: the checkpoint folder (None when the run had nothing to save).
    """

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        where = f"checkpoint {checkpoint} written" if checkpoint is not None else "no checkpoint written"
        super().__init__(
            f"stopped by {signal_name} after step {step}; {where}; continue with --resume_from_checkpoint latest"
        )


class NonFiniteError(RuntimeError):
    """A non-finite loss, gradient norm or weight stopped the run (the message names the step)."""


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read (the message names the folder or file and the cause)."""


# ---------------------------------------------------------------------------------------------------
# Agreement between processes
# ---------------------------------------------------------------------------------------------------

_CONTROL_GROUP: dict[str, object] = {}


def _control_group(accelerator):
    """A process group for small CPU messages: the default group when it is gloo, else one gloo group.

    Created on first use; every process reaches the same calls in the same order, as `new_group` needs.
    """
    if "group" not in _CONTROL_GROUP:
        if "gloo" in str(dist.get_backend()):
            _CONTROL_GROUP["group"] = None  # the default group
        else:
            timeout = getattr(getattr(accelerator, "init_handler", None), "timeout", None)
            _CONTROL_GROUP["group"] = dist.new_group(backend="gloo", timeout=timeout)
    return _CONTROL_GROUP["group"]


def agree_max(accelerator, value: int) -> int:
    """The largest of `value` over all processes (`value` itself in a one-process run).

    Uses a CPU (gloo) all-reduce, so it never waits for the accelerator's queued work.

    Args:
        accelerator: the run's `Accelerator`.
        value: this process's integer.

    Returns:
        The maximum over processes.
    """
    if accelerator.num_processes == 1 or not dist.is_initialized():
        return value
    flag = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_control_group(accelerator))
    return int(flag.item())


def gather_messages(accelerator, message: str | None) -> list[str]:
    """Collect one optional message from every process (the non-None ones, in process order).

    Args:
        accelerator: the run's `Accelerator`.
        message: this process's message, or None.

    Returns:
        The messages of all processes that had one.
    """
    if accelerator.num_processes == 1 or not dist.is_initialized():
        return [message] if message is not None else []
    gathered: list[str | None] = [None] * accelerator.num_processes
    dist.all_gather_object(gathered, message, group=_control_group(accelerator))
    return [m for m in gathered if m is not None]


def broadcast_from_main(accelerator, obj):
    """The main process's `obj` (any picklable value), on every process.

    Args:
        accelerator: the run's `Accelerator`.
        obj: the value (only the main process's is used).

    Returns:
        The main process's value.
    """
    if accelerator.num_processes == 1 or not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group(accelerator))
    return box[0]


def decide_on_main(accelerator, decide: Callable[[], object], error_type: type[Exception] = ValueError):
    """Run `decide()` on the main process only; every process returns its result or raises its error.

    For the checks a run makes before it starts (reading the output folder, asking the hub) that must give one
    answer on every process: the others wait for the main process's and never look themselves.

    Args:
        accelerator: the run's `Accelerator` (None: this process alone).
        decide: the check, called without arguments on the main process; returns a picklable value.
        error_type: the error `decide` raises to refuse (raised again, with its message, on every process).

    Returns:
        The main process's `decide()`.

    Raises:
        error_type: `decide` raised it on the main process (there: the same error; elsewhere: one with its message).
        Exception: `decide` raised another exception (a bug, a failing disk): the main process raises it; the others
            raise `RuntimeError` naming it (instead of failing in their next collective when the main process ends).
    """
    result, error, message, refused = None, None, None, False
    if accelerator is None or accelerator.is_main_process:
        try:
            result = decide()
        except error_type as err:
            error, message, refused = err, str(err), True
        except Exception as err:
            error, message = err, f"{type(err).__name__}: {err}"
    if accelerator is not None:
        result, message, refused = broadcast_from_main(accelerator, (result, message, refused))
    if error is not None:
        raise error
    if refused:
        raise error_type(message)
    if message is not None:
        raise RuntimeError(f"the main process failed this check before the run ({message}); its log has the traceback")
    return result


def end_process_group() -> None:
    """Destroy the default process group if there is one (so that the process exits without hanging).

    With gloo, the other processes' pending collectives then fail at once instead of waiting for
    their timeout.
    """
    _CONTROL_GROUP.clear()
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def collective_timeout(seconds: float) -> timedelta:
    """The `timeout` for `init_process_group` from `--ddp_timeout` seconds (transformers' argument name).

    One millisecond is added so that accelerate passes the value on even when it equals its own
    default (`InitProcessGroupKwargs.to_kwargs` drops default values, and the backends' defaults differ).
    """
    return timedelta(seconds=seconds, milliseconds=1)


# ---------------------------------------------------------------------------------------------------
# Lost peers
# ---------------------------------------------------------------------------------------------------

#: Each process's `{"rank", "node", "host"}`, by rank, recorded at start-up (`record_peers`).
_PEERS: list[dict] = []
#: How long a survivor waits for the others to answer after a failed collective (`lost_peers`), seconds.
PEER_ANSWER_SECONDS = 5.0


def record_peers(accelerator) -> list[dict]:
    """Record every process's rank, node and host name, so that a failed collective can name the one it lost.

    The node is torchrun's `GROUP_RANK` (`accelerate launch --machine_rank`, Slurm's node id), None when the
    launcher sets none. One all-gather over the CPU group; every process must call it (it is a collective).

    Args:
        accelerator: the run's `Accelerator`.

    Returns:
        One `{"rank": int, "node": int | None, "host": str}` per process, in rank order.
    """
    node = os.environ.get("GROUP_RANK")
    mine = {"rank": accelerator.process_index, "node": int(node) if node else None, "host": socket.gethostname()}
    if accelerator.num_processes == 1 or not dist.is_initialized():
        peers = [mine]
    else:
        peers = [None] * accelerator.num_processes
        dist.all_gather_object(peers, mine, group=_control_group(accelerator))
    _PEERS[:] = peers
    return peers


def describe_process(rank: int) -> str:
    """`"process R (node N, host H)"` from the peers recorded by `record_peers` (`"process R"` if unknown)."""
    peer = _PEERS[rank] if rank < len(_PEERS) else None
    if peer is None:
        return f"process {rank}"
    node = f"node {peer['node']}, " if peer.get("node") is not None else ""
    return f"process {rank} ({node}host {peer['host']})"


def lost_peers(rank: int, world_size: int, wait: float = PEER_ANSWER_SECONDS) -> list[int] | None:
    """After a failed collective, the ranks that do not answer within `wait` seconds (dead or stuck).

    Every surviving process writes a key into the launcher's rendezvous store (torchrun's TCP store at
    `MASTER_ADDR:MASTER_PORT`, which outlives the process group) and waits for the others' keys. The
    processes whose key does not appear are the lost ones.

    Args:
        rank: this process's rank.
        world_size: the number of processes.
        wait: seconds to wait for the others.

    Returns:
        The ranks that did not answer (sorted), or None when the store cannot be reached (its host is gone).
    """
    try:
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        socket.create_connection(address, timeout=wait).close()  # gone: no TCPStore retries and C++ traces
        store = dist.TCPStore(
            *address,
            is_master=False,
            timeout=timedelta(seconds=wait),
            wait_for_workers=False,
        )
        prefix = f"hfzoo_alive/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        store.set(f"{prefix}{rank}", "1")
        missing = [r for r in range(world_size) if r != rank]
        deadline = time.monotonic() + wait
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([f"{prefix}{r}"])]
            time.sleep(0.1)
        return missing
    except Exception:  # no launcher store, or its host is the lost one
        return None


def lost_peer_message(accelerator, err: BaseException, checkpoints: Callable[[], list[Path]] | None) -> str:
    """The one-line message of a survivor whose collective failed: which process it lost and how to go on.

    Names the processes that did not answer (`lost_peers`), with their node and host (`record_peers`), or,
    when the store is gone too, the peer address gloo reports; then the last complete checkpoint and
    `--resume_from_checkpoint latest`. Starts with `error: process R: a collective operation failed or timed out`
    and ends with the backend's first line (e.g. gloo's `Connection closed by peer [ADDRESS]:PORT`).

    Args:
        accelerator: the run's `Accelerator` (`process_index`, `num_processes`).
        err: the collective's exception.
        checkpoints: returns the run's complete checkpoint folders, oldest first; None: none named.

    Returns:
        The message, one line.
    """
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    lost = lost_peers(accelerator.process_index, accelerator.num_processes)
    if lost:
        names = ", ".join(describe_process(r) for r in lost)
        who = f"lost {names}, which did not answer within {PEER_ANSWER_SECONDS:g} s"
    else:
        address = re.search(r"\[([^\]]+)\]:(\d+)", first)
        who = f"lost the peer at {address.group(1)}:{address.group(2)}" if address else "lost a peer"
    done = checkpoints() if checkpoints is not None else []
    resume = (
        f"restart every node with --resume_from_checkpoint latest (last complete checkpoint: {done[-1]})"
        if done
        else "no checkpoint was written; restart every node (with --checkpointing_steps N to keep progress)"
    )
    return (
        f"error: process {accelerator.process_index}: a collective operation failed or timed out "
        f"(another process failed or stopped responding; see its output): {who}; {resume}; {first}"
    )


# ---------------------------------------------------------------------------------------------------
# Preemption
# ---------------------------------------------------------------------------------------------------

_ACTIVE_HANDLERS: list[PreemptionHandler] = []


class PreemptionHandler:
    """Turn SIGTERM / SIGINT into a request to stop at the end of the current optimizer step.

    The first signal is recorded (and a line is written to stderr); later ones are reported and
    otherwise ignored while the step finishes and the checkpoint is written (SIGKILL still ends the
    process at once). `requested` is checked once per optimizer step; with several processes it
    all-reduces the flag, so every process stops after the same step even when the signal reached them
    at different times (or reached only one of them).

    Handlers can only be installed from the main thread; elsewhere `install` does nothing.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS) -> None:
        self.signals = signals
        self.received: int = 0
        self._previous: dict[int, object] = {}

    def install(self) -> PreemptionHandler:
        """Install the handlers (remembering the previous ones); returns self."""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("not in the main thread: SIGTERM/SIGINT will not stop training gracefully")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        _ACTIVE_HANDLERS.append(self)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were installed before `install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self in _ACTIVE_HANDLERS:
            _ACTIVE_HANDLERS.remove(self)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.received:
            sys.stderr.write(f"{name} received again: still finishing the step and writing the checkpoint\n")
        else:
            self.received = signum
            sys.stderr.write(f"{name} received: finishing the current step, then writing a checkpoint\n")
        sys.stderr.flush()

    def requested(self, accelerator) -> str | None:
        """Whether any process received a stop signal: its name (e.g. `"SIGTERM"`), else None.

        Every process must call this at the same point of every step (it is a collective when there
        are several processes).
        """
        signum = agree_max(accelerator, self.received)
        return signal.Signals(signum).name if signum else None


def restore_signal_handlers() -> None:
    """Uninstall every installed `PreemptionHandler` (newest first)."""
    for handler in reversed(list(_ACTIVE_HANDLERS)):
        handler.uninstall()


# ---------------------------------------------------------------------------------------------------
# Non-finite values
# ---------------------------------------------------------------------------------------------------


class NonFiniteGuard:
    """Decide what happens after an optimizer step whose gradient norm or loss is not finite.

    The training step itself never applies an update with a non-finite gradient norm
    (`OptimizerStepper`); this guard then stops the run (the default, `max_nonfinite_steps=0`) or lets it
    continue, logging the skipped step, until more than `max_nonfinite_steps` steps have been skipped over
    the whole run (resumes included).

    The gradient norm is on the host once the stepper has checked the step, so checking it costs nothing; the loss
    (a device tensor) is read only when there is no usable gradient norm: under fp16 loss scaling an
    infinite norm is the scaler's business (it skips the step and lowers the scale), and a DeepSpeed
    config may not compute the norm. A non-finite loss makes the gradients non-finite, so the norm
    catches it otherwise.

    Args:
        max_nonfinite_steps: how many such steps may be skipped before the run stops.
        check_grad_norm: False under fp16 loss scaling (see above).
        log: log each skipped step (True on the main process only).
    """

    def __init__(self, max_nonfinite_steps: int = 0, check_grad_norm: bool = True, log: bool = True) -> None:
        self.max_nonfinite_steps = max_nonfinite_steps
        self.check_grad_norm = check_grad_norm
        self.log = log
        self.skipped_steps: list[int] = []

    def check(self, step: int, loss: torch.Tensor, grad_norm: float | None) -> bool:
        """Check one optimizer step.

        Args:
            step: the step number (1-based) of the step just taken.
            loss: its float32 scalar loss (same on every process).
            grad_norm: its gradient norm before clipping (same on every process), or None.

        Returns:
            True when the step was non-finite and its update skipped (the run goes on).

        Raises:
            NonFiniteError: the step was non-finite and no more skips are allowed.
        """
        if self.check_grad_norm and grad_norm is not None:
            if math.isfinite(grad_norm):
                return False
            what = f"gradient norm ({grad_norm}; loss {float(loss)})"
        else:
            value = float(loss)
            if math.isfinite(value):
                return False
            what = f"loss ({value})"
        if len(self.skipped_steps) >= self.max_nonfinite_steps:
            allowed = (
                f"{self.max_nonfinite_steps} such step(s) already skipped ({self.skipped_steps})"
                if self.max_nonfinite_steps
                else "skip such steps with --max_nonfinite_steps N"
            )
            raise NonFiniteError(
                f"non-finite {what} at step {step}: its update was not applied and training stopped ({allowed})"
            )
        self.skipped_steps.append(step)
        if self.log:
            logger.warning(
                f"step {step}: non-finite {what}; update skipped "
                f"({len(self.skipped_steps)} of at most {self.max_nonfinite_steps}, --max_nonfinite_steps)"
            )
        return True

    def state_dict(self) -> dict[str, list[int]]:
        """What a checkpoint records: the steps skipped so far."""
        return {"nonfinite_steps": list(self.skipped_steps)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the skipped steps from a checkpoint's training state."""
        self.skipped_steps = list(state.get("nonfinite_steps", []))


def skips_updates_on_device(optimizer) -> bool:
    """Whether `optimizer` can leave out an update on the device, given a `found_inf` tensor.

    True for torch's fused optimizers (`fused=True` Adam, AdamW, SGD, Adagrad): they declare
    `_step_supports_amp_scaling` and read `found_inf` (a float32 0-d tensor, 1.0 to skip) in `step()`, as
    `torch.amp.GradScaler` gives it to them; the kernel then changes neither the parameters, nor the moments,
    nor the step counts. accelerate's `AcceleratedOptimizer` is looked through.

    Args:
        optimizer: a torch optimizer or accelerate's wrapper of one.
    """
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, torch.optim.Optimizer) or not getattr(inner, "_step_supports_amp_scaling", False):
        return False
    # The older contract (a `grad_scaler` keyword of `step`) is GradScaler's alone.
    return "grad_scaler" not in inspect.signature(inner.step).parameters


@dataclass(frozen=True)
class CheckedStep:
    """An optimizer step whose gradient norm has been read on the host.

    Attributes:
        step: the step's number (1-based, counting the steps of the run resumed from).
        grad_norm: its gradient norm before clipping, or None where the backend does not report one.
        applied: whether its update was applied (False: a non-finite norm; a loss scaler's own skips count
            as applied here).
    """

    step: int
    grad_norm: float | None
    applied: bool


class OptimizerStepper:
    """The optimizer and scheduler steps of a training loop, without those of a non-finite gradient norm.

    A step whose gradient norm is NaN or infinite is left out: neither the optimizer nor the scheduler steps.
    Reading the norm to decide is a host-device synchronization on an accelerator: the host waits until the
    backward pass has run and the device then idles while the next kernels are launched. With `deferred`
    (an optimizer that `skips_updates_on_device`, no loss scaler), the update is launched at once with
    `found_inf = not isfinite(norm)`, so the device itself leaves out a non-finite one, and the norm is copied
    to the host without waiting. It is read at the next step, after that step's backward pass has been
    launched (long computed by then), or by `settle()`; only then does the scheduler take the checked step's
    step, before the next update, so every update gets the learning rate it gets without deferring.
    Otherwise (`deferred=False`) the norm is read at once and decides. Under a loss scaler (fp16) both steps
    are always taken: the scaler leaves out overflowing updates itself.

    Args:
        optimizer: the prepared optimizer (accelerate's `AcceleratedOptimizer`) or a torch optimizer.
        lr_scheduler: the prepared scheduler (stepped once per applied step, as `AcceleratedScheduler.step`).
        deferred: read the norm one step late (needs `skips_updates_on_device(optimizer)`).
        last_step: the number of the last step taken before this stepper's first (a resumed run's step).
        scaler: whether a loss scaler decides the skips (accelerate's `accelerator.scaler is not None`).

    Raises:
        ValueError: `deferred` with an optimizer that cannot skip an update on the device, or with a scaler.
    """

    def __init__(
        self, optimizer, lr_scheduler, deferred: bool = False, last_step: int = 0, scaler: bool = False
    ) -> None:
        if deferred and (scaler or not skips_updates_on_device(optimizer)):
            raise ValueError(
                f"a deferred non-finite check needs an optimizer that skips updates on the device (torch's fused "
                f"AdamW) and no loss scaler; got {type(getattr(optimizer, 'optimizer', optimizer)).__name__}"
                f"{' with a loss scaler' if scaler else ''}"
            )
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.deferred, self.scaler, self.last_step = deferred, scaler, last_step
        self._pending: tuple[int, torch.Tensor, object] | None = None  # step, the norm's host copy, its event
        self._checked: list[CheckedStep] = []

    @classmethod
    def for_run(cls, accelerator, optimizer, lr_scheduler, last_step: int = 0) -> OptimizerStepper:
        """The stepper of a run: deferred wherever it can be.

        That is with a fused optimizer, no loss scaler, and neither DeepSpeed (whose engine steps and checks
        itself) nor FSDP (whose sharded parameters the fused kernel would get as `DTensor`s).
        """
        from accelerate.utils import DistributedType

        scaler = getattr(accelerator, "scaler", None) is not None
        sharded = accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
        deferred = not scaler and not sharded and skips_updates_on_device(optimizer)
        return cls(optimizer, lr_scheduler, deferred=deferred, last_step=last_step, scaler=scaler)

    def step(self, grad_norm: torch.Tensor | float | None) -> torch.Tensor | float | None:
        """Take (or leave out) the next optimizer step, after its backward pass and gradient clipping.

        Args:
            grad_norm: the step's gradient norm before clipping: a 0-d tensor (from `clip_grad_norm_`), a
                float, or None (not reported: the step is taken).

        Returns:
            The norm as read on the host (a float), or, deferred, the tensor itself (not read yet); None for None.
        """
        self._settle_pending()
        self.last_step += 1
        if self.scaler or grad_norm is None:  # the scaler decides (fp16), or nothing to decide on
            value = None if grad_norm is None else float(grad_norm)
            self._apply(self.last_step, value, True)
            return value
        if self.deferred and isinstance(grad_norm, torch.Tensor):
            norm = grad_norm.detach().float()
            inner = getattr(self.optimizer, "optimizer", self.optimizer)
            inner.found_inf = (~torch.isfinite(norm)).float()  # read by the fused kernel (GradScaler's contract)
            try:
                self.optimizer.step()
            finally:
                del inner.found_inf
            event, host = None, norm
            if norm.device.type != "cpu":
                host = torch.empty((), dtype=norm.dtype, pin_memory=norm.device.type == "cuda")
                host.copy_(norm, non_blocking=True)
                event = torch.get_device_module(norm.device).Event()
                event.record()
            self._pending = (self.last_step, host, event)
            return grad_norm
        value = float(grad_norm)
        self._apply(self.last_step, value, math.isfinite(value))
        return value

    def _apply(self, step: int, grad_norm: float | None, finite: bool) -> None:
        if finite:
            self.optimizer.step()
            self.lr_scheduler.step()
        self._checked.append(CheckedStep(step, grad_norm, finite))

    def _settle_pending(self) -> None:
        if self._pending is None:
            return
        step, host, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # waits for the copy alone, not for the work queued after it
        value = float(host)
        if math.isfinite(value):  # the update itself was taken (or left out on the device) already
            self.lr_scheduler.step()
        self._checked.append(CheckedStep(step, value, math.isfinite(value)))

    def settle(self) -> list[CheckedStep]:
        """Read the pending step's norm now (a wait for it alone); every step checked since the last call.

        Call before anything that reads the scheduler, the optimizer or the parameters: a log line, a
        checkpoint, an evaluation, the end of training. Returns the steps oldest first.
        """
        self._settle_pending()
        return self.checked()

    def checked(self) -> list[CheckedStep]:
        """The steps checked since the last call, oldest first (a deferred step is checked at the next `step`)."""
        checked, self._checked = self._checked, []
        return checked


def first_nonfinite_parameter(accelerator, model: torch.nn.Module) -> str | None:
    """The name of a parameter holding a NaN or infinity, on any process, or None when all are finite.

    Under DeepSpeed ZeRO-3 (`ds_tensor`) and FSDP2 (`DTensor`) each process checks its own shard. One host
    sync, plus one all-reduce when there are several processes.

    Args:
        accelerator: the run's `Accelerator`.
        model: the prepared (possibly wrapped) model.

    Returns:
        A parameter name (this process's first bad one, or `"(a parameter on another process)"`), or None.
    """
    named = [(n, getattr(p, "ds_tensor", p)) for n, p in accelerator.unwrap_model(model).named_parameters()]
    named = [(n, t.to_local() if isinstance(t, DTensor) else t) for n, t in named]  # FSDP2: this process's shard
    named = [(n, t) for n, t in named if t.numel() > 0]
    bad_name = None
    if named:
        finite = torch.stack([torch.isfinite(t.detach()).all() for _, t in named])
        bad = (~finite).nonzero()
        if bad.numel():
            bad_name = named[int(bad[0, 0])][0]
    if agree_max(accelerator, int(bad_name is not None)) and bad_name is None:
        return "(a parameter on another process)"
    return bad_name


# ---------------------------------------------------------------------------------------------------
# Turning faults into messages and exit codes
# ---------------------------------------------------------------------------------------------------


def nonfinite_message(err: NonFiniteError, checkpoints: list[Path]) -> str:
    """The one line a run stopped by a non-finite step prints: `error: <err>; the last checkpoint, <path>, is intact`.

    Args:
        err: the guard's error (names the step and what was not finite).
        checkpoints: the run's complete checkpoint folders, oldest first (`[]`: "no checkpoint was written").
    """
    kept = f"; the last checkpoint, {checkpoints[-1]}, is intact" if checkpoints else "; no checkpoint was written"
    return f"error: {err}{kept}"


@contextlib.contextmanager
def handle_training_faults(accelerator, checkpoints: Callable[[], list[Path]] | None = None):
    """Run the training loop; turn its faults into one line on stderr and an exit code, after cleaning up.

    - `TrainingPreempted`: the main process prints the message; every process exits with `EXIT_PREEMPTED`.
    - `NonFiniteError`: the main process prints `error: ...`; every process exits with `EXIT_NONFINITE`.
    - `CheckpointError` (a save that failed, e.g. a full disk) or `hfzoo.data.loading.DataReadError` (a streamed
      record that cannot be parsed, naming the data): `error: ...`, exit 1.
    - a failed or timed-out collective in a multi-process run (another process or node failed or hangs):
      `error: process R: ...` naming the lost process, its node and host, and the checkpoint to resume from
      (`lost_peer_message`), exit 1, instead of a traceback per process.

    Whatever happens, the signal handlers are restored; after a fault the process group is destroyed too (a
    run that ends well keeps it: the GLUE sweep runs its next task in it; `run_launched` ends it with the
    process). A process of a multi-process run that stops on any exception then ends with `os._exit` (after
    flushing its output; other exceptions print their traceback first): the interpreter's own teardown can deadlock
    there, since the DDP reducer keeps the gloo process group alive until it is garbage-collected with
    the GIL held, and the group's destructor waits for its worker thread, which may be waiting for the
    GIL to release the tensors of the last collective.

    Args:
        accelerator: the run's `Accelerator`.
        checkpoints: returns the run's complete checkpoint folders, oldest first
            (`hfzoo.training.checkpointing.complete_checkpoints`), to name the last one after a non-finite stop;
            None: the message names none.

    Raises:
        SystemExit: for the faults above (one process); other exceptions propagate unchanged.
    """
    multi = accelerator.num_processes > 1
    message, code, failed = None, 1, True
    try:
        yield
        failed = False
    except TrainingPreempted as err:
        message = str(err) if accelerator.is_main_process else None
        code = EXIT_PREEMPTED
    except NonFiniteError as err:  # every process stops at the same step (the norm is reduced): one line per run
        done = checkpoints() if checkpoints is not None and accelerator.is_main_process else []
        message = nonfinite_message(err, done) if accelerator.is_main_process else None
        code = EXIT_NONFINITE
    except (CheckpointError, DataReadError) as err:
        message = f"error: {err}"
    except BaseException as err:
        if not multi:
            raise
        if isinstance(err, RuntimeError) and _is_collective_failure(err):
            message = lost_peer_message(accelerator, err, checkpoints)
        else:
            traceback.print_exc()
    finally:
        restore_signal_handlers()
        if failed:
            end_process_group()
            close_progress_bars()
    if not failed:
        return
    if not multi and code == 1:
        raise SystemExit(message)  # printed by Python; exit status 1
    if message is not None:
        print(message, file=sys.stderr, flush=True)
    if multi:
        _exit_now(code)
    raise SystemExit(code)


def run_launched(main: Callable[[], object]) -> None:
    """Run a job's entry point as the whole work of this process, then end the process with its exit status.

    For the console scripts and recipes (`hfzoo-pretrain`, `recipes/pretrain.py`, ...). A process that a
    launcher started as one of several (`torchrun`, `accelerate launch`, DeepSpeed's launcher: `WORLD_SIZE` > 1)
    ends with `os._exit` once `main` has returned or raised (`SystemExit`'s status; 1 after printing another
    exception's traceback, as Python does), after destroying the process group, closing its progress bars and
    flushing its logs and output. The interpreter's teardown is skipped: the DDP
    reducer keeps the gloo process group alive past `destroy_process_group`, so gloo's worker threads can still
    be releasing the tensors of the last collective while the interpreter finalizes, and a thread that takes the
    GIL then aborts the process (`terminate called without an active exception`, SIGABRT, which the launcher
    reports as a failed run) after the run finished and wrote its outputs. A single process exits as Python does.

    Args:
        main: the job's entry point (reads `sys.argv`); its return value is not used.

    Raises:
        SystemExit, Exception: a single process, `main`'s own, unchanged.
    """
    several = _launched_as_one_of_several()
    try:
        main()
        status = 0
    except SystemExit as err:
        if not several:
            raise
        status = err.code
    except Exception:
        if not several:
            raise
        traceback.print_exc()  # as Python prints an uncaught exception, which then exits with 1
        status = 1
    if not several:
        return
    end_process_group()
    close_progress_bars()
    if status is None:
        status = 0
    elif not isinstance(status, int):  # SystemExit("error: ..."): Python prints the message and exits with 1
        print(status, file=sys.stderr)
        status = 1
    _exit_now(status)


def _launched_as_one_of_several() -> bool:
    """Whether a launcher started this process as one of several (torchrun's `WORLD_SIZE` environment variable)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def launched_rank() -> int:
    """This process's rank among those its launcher started (torchrun's `RANK`; 0 without a launcher).

    For work done once per run before any process group exists, or outside the jobs' `Accelerator`: rank 0 is
    `Accelerator.is_main_process`.
    """
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _exit_now(status: int) -> None:
    """Flush the logs, stdout and stderr, then end the process with `status` without the interpreter's teardown."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def close_progress_bars() -> None:
    """Close the open tqdm bars, so that the message that follows starts on a line of its own."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()


def _is_collective_failure(err: BaseException) -> bool:
    """Whether an exception comes from a collective whose peer failed, left, or timed out."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err).lower()
    return any(
        marker in text
        for marker in ("connection closed by peer", "connection reset by peer", "timed out", "gloo", "nccl")
    )
