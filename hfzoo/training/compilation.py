"""`--torch_compile` of the recipes: compile the model in place, or run it eagerly with a warning.

`compile_model(model, args, accelerator)` calls `torch.nn.Module.compile` on the model before
`accelerator.prepare`. Compiling in place (rather than wrapping the model in `torch.compile`'s
`OptimizedModule`) keeps the module tree, so `state_dict` keys, `save_pretrained`, checkpoints and
DDP's parameter hooks stay those of the eager model (no `_orig_mod.` prefix).

Configurations that do not compile cleanly (`compile_blocker`, registry `COMPILE_BLOCKERS` at the bottom;
docs/modifications.md lists them with the reason) run eagerly with a warning, as does a run under
DeepSpeed, whose engine hooks into the module's forward pass.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

logger = logging.getLogger(__name__)

__all__ = ["COMPILE_BLOCKERS", "compile_blocker", "compile_model", "compile_requested"]


def compile_requested(args: argparse.Namespace) -> bool:
    """`--torch_compile`, or `--torch_compile_mode` / `--torch_compile_backend` (which imply it, as in transformers)."""
    return bool(
        getattr(args, "torch_compile", False)
        or getattr(args, "torch_compile_mode", None)
        or getattr(args, "torch_compile_backend", None)
    )


def compile_blocker(config) -> str | None:
    """Why a model config cannot compile without graph breaks (None: it can).

    Args:
        config: any transformers config (fields an hfzoo config lacks are read as absent).

    Returns:
        The reason of the first matching `COMPILE_BLOCKERS` entry, or None.
    """
    for field, (matches, reason) in COMPILE_BLOCKERS.items():
        if hasattr(config, field) and matches(getattr(config, field)):
            return f"{field}={getattr(config, field)!r}: {reason}"
    return None


def compile_model(model: torch.nn.Module, args: argparse.Namespace, accelerator: Accelerator) -> bool:
    """Compile `model` in place with `torch.nn.Module.compile` when the run asks for it and the model allows it.

    Args:
        model: the model, before `accelerator.prepare` (a `PeftModel` is compiled whole; its base model's
            config decides whether it can be).
        args: `torch_compile`, `torch_compile_mode`, `torch_compile_backend` (transformers' names).
        accelerator: the run's accelerator (DeepSpeed runs stay eager).

    Returns:
        True when the model was compiled; False when not asked for, or when it falls back to eager
        execution (with a warning naming the reason).
    """
    if not compile_requested(args):
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    reason = compile_blocker(base.config)
    if reason is None and accelerator.distributed_type == DistributedType.DEEPSPEED:
        reason = "the DeepSpeed engine hooks into the forward pass of every module"
    if reason is not None:
        logger.warning(f"--torch_compile: running eagerly ({reason})")
        return False
    options = {"backend": args.torch_compile_backend or "inductor"}
    if args.torch_compile_mode:
        options["mode"] = args.torch_compile_mode
    model.compile(**options)
    logger.info(f"--torch_compile: model compiled ({options})")
    return True


#: config field -> (predicate on its value, why such a model does not compile cleanly). Checked by
#: `tests/training/test_compile.py`, which also checks that every other configuration it covers has no graph break.
COMPILE_BLOCKERS: dict[str, tuple[Callable[[object], bool], str]] = {
    "num_experts": (
        lambda value: bool(value),
        "mixture-of-experts layers hand their router logits to the load-balancing loss through transformers' "
        "output-capturing hooks, which read a ContextVar that torch.compile cannot trace (graph breaks in every "
        "expert layer)",
    ),
}
