"""The optimizer and learning-rate schedule of every recipe: AdamW with weight decay on the weight matrices only.

Decoupled weight decay (Loshchilov & Hutter 2019) shrinks a parameter towards zero. That regularises
matrices (projections, embeddings), but for a bias, a normalization gain or a residual scalar gain
(ReZero's alpha, Bachlechner et al. 2020; Fixup's scalar biases and multiplier, Zhang et al. 2019) the
pull towards zero changes what the layer computes (a ReZero alpha decayed to 0 switches the block
off), so BERT, GPT-2 and transformers' `Trainer` exclude them. `no_weight_decay` decides by the
parameter's shape and the module that holds it, never by its name, so new modules are covered
without a list to keep up to date.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import get_scheduler

#: Modules whose every parameter is a normalization gain or shift (whatever its shape).
NORM_MODULE_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.RMSNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.modules.batchnorm._NormBase,  # BatchNorm*d, InstanceNorm*d
)


def _shape(param: nn.Parameter) -> tuple[int, ...]:
    # Under DeepSpeed ZeRO-3 a parameter may already be partitioned (an empty local tensor): its full shape.
    return tuple(getattr(param, "ds_shape", param.shape))


def no_weight_decay(param: nn.Parameter, module: nn.Module) -> bool:
    """Whether `param` (held by `module`) is exempt from weight decay.

    Exempt: every tensor with fewer than 2 dimensions (biases, norm gains, scalar gains such as ReZero's
    alpha `(1,)` and Fixup's scalars), and every parameter of a normalization module (`NORM_MODULE_TYPES`).

    Args:
        param: the parameter.
        module: the module whose `_parameters` hold it directly.

    Returns:
        True when weight decay must not be applied.
    """
    return len(_shape(param)) < 2 or isinstance(module, NORM_MODULE_TYPES)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split the trainable parameters of `model` into a decayed and an undecayed optimizer group.

    Frozen parameters (`requires_grad=False`, e.g. the base model under PEFT) are left out; a parameter
    shared by several modules (tied embeddings) appears once.

    Args:
        model: the model (plain, PEFT-wrapped, or already partitioned by ZeRO-3).
        weight_decay: decoupled weight decay of the decayed group (AdamW's `weight_decay`).

    Returns:
        `[{"params": decayed, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]`
        (see `no_weight_decay`).
    """
    decay, exempt, seen = [], [], set()
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            (exempt if no_weight_decay(param, module) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]


def create_optimizer(
    model: nn.Module,
    *,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    fused: bool = False,
) -> torch.optim.AdamW:
    """Build the recipes' AdamW over `weight_decay_groups(model, weight_decay)`.

    Args:
        model: the model to optimize.
        learning_rate: peak learning rate (the scheduler scales it).
        weight_decay: decoupled weight decay of the matrices.
        betas: Adam's `(beta1, beta2)`.
        fused: use the fused kernel (one kernel for all parameters); False: torch's default (foreach).

    Returns:
        The `torch.optim.AdamW`.
    """
    return torch.optim.AdamW(
        weight_decay_groups(model, weight_decay), lr=learning_rate, betas=betas, fused=fused or None
    )


def create_scheduler(
    name: str,
    optimizer: torch.optim.Optimizer,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    scheduler_kwargs: dict | None = None,
):
    """Build the learning-rate schedule `name` (`transformers.get_scheduler`) with its own arguments.

    Args:
        name: a `transformers.SchedulerType` name (`linear`, `cosine`, `cosine_with_min_lr`,
            `warmup_stable_decay`, ...).
        optimizer: the optimizer whose learning rate it scales.
        num_warmup_steps: scheduler steps of linear warmup.
        num_training_steps: scheduler steps in total.
        scheduler_kwargs: the schedule's own arguments (`--lr_scheduler_kwargs`), e.g.
            `{"min_lr_rate": 0.1}` for `cosine_with_min_lr`, `{"num_decay_steps": 100}` for
            `warmup_stable_decay`, `{"num_cycles": 2}` for `cosine_with_restarts`.

    Returns:
        A `torch.optim.lr_scheduler.LambdaLR` (or the schedule's class).

    Raises:
        ValueError: an argument the schedule does not take, or a required one missing (one line naming
            `--lr_scheduler_kwargs`).
    """
    try:
        return get_scheduler(
            name,
            optimizer=optimizer,
            num_warmup_steps=num_warmup_steps,
            num_training_steps=num_training_steps,
            scheduler_specific_kwargs=scheduler_kwargs or None,
        )
    except (TypeError, ValueError) as err:
        given = scheduler_kwargs or {}
        raise ValueError(
            f"--lr_scheduler_type {name} with --lr_scheduler_kwargs {given}: {str(err).splitlines()[0]}"
        ) from None
