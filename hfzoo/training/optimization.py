"""The optimizer and learning-rate schedule of every recipe: AdamW (weight decay on matrices only), or Muon + AdamW.

Decoupled weight decay (Loshchilov & Hutter 2019) shrinks a parameter towards zero. That regularises
matrices (projections, embeddings), but for a bias, a normalization gain or a residual scalar gain
(ReZero's alpha, Bachlechner et al. 2020; Fixup's scalar biases and multiplier, Zhang et al. 2019) the
pull towards zero changes what the layer computes (a ReZero alpha decayed to 0 switches the block
off), so BERT, GPT-2 and transformers' `Trainer` exclude them. `no_weight_decay` decides by the
parameter's shape and the module that holds it, never by its name, so new modules are covered
without a list to keep up to date.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
kellerjordan.github.io/posts/muon) replaces a matrix's momentum by its nearest semi-orthogonal matrix
(a quintic Newton-Schulz iteration) before the update; it is meant for the hidden layers' 2-D weights
only, the embeddings, the output layer and the vector-shaped parameters staying with AdamW (the post's
"Empirical considerations"). `muon_parameters` decides which parameters that is, again by module type
and shape (`is_muon_parameter`); `create_optimizer(..., muon=MuonSettings(...))` builds
`torch.optim.Muon` for them and AdamW for the others, combined in one `MuonWithAdamW` that learning-rate
schedules, gradient clipping, accelerate and checkpoints see as a single optimizer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler

from ..modules.stack import HfzooStack

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


@dataclass(frozen=True)
class MuonSettings:
    """The arguments of `torch.optim.Muon` for the hidden layers' matrices (`--optim muon`).

    Args:
        learning_rate: peak Muon learning rate (the scheduler scales it like AdamW's); 0.02 in the post's
            speedrun. With `adjust_lr_fn="original"` an `(out, in)` matrix steps by
            `learning_rate * sqrt(max(1, out / in))` times its orthogonalised momentum.
        momentum: the momentum coefficient mu of `B_t = mu B_{t-1} + g_t`, in [0, 1).
        weight_decay: decoupled weight decay of the Muon matrices (`theta -= lr * wd * theta`), >= 0.
        nesterov: use Nesterov momentum (`g_t + mu B_t`), as the post does.
        ns_steps: Newton-Schulz iterations (the post: 5), in [1, 100).
        adjust_lr_fn: `"original"` (the post's `sqrt(max(1, out / in))`) or `"match_rms_adamw"` (Liu et al.
            2025, "Muon is Scalable for LLM Training", Sec. 2.2: `0.2 * sqrt(max(out, in))`, so AdamW's learning
            rate and weight decay carry over).
    """

    learning_rate: float = 0.02
    momentum: float = 0.95
    weight_decay: float = 0.0
    nesterov: bool = True
    ns_steps: int = 5
    adjust_lr_fn: str = "original"


def hidden_layer_modules(model: nn.Module) -> set[int]:
    """The ids of every module inside the layers of an hfzoo layer stack (`HfzooStack.layers`) of `model`.

    The layers are the hidden layers in Muon's sense: the embeddings (`embed_tokens`, positions, token
    types), the final norm, the layer-stack module of its own, the transparent attention and the heads
    sit outside them. Works through wrappers (PEFT, `torch.compile`, DDP), which keep the stacks as
    submodules.

    Args:
        model: the model.

    Returns:
        `{id(module)}` of the stacks' `layers` and all their submodules (empty for a model without an
        `HfzooStack`, e.g. a transformers checkpoint).
    """
    inside: set[int] = set()
    for module in model.modules():
        if isinstance(module, HfzooStack):
            inside.update(id(sub) for sub in module.layers.modules())
    return inside


def is_muon_parameter(param: nn.Parameter, module: nn.Module, in_hidden_layer: bool) -> bool:
    """Whether `param` (held by `module`) is a hidden-layer matrix that Muon updates.

    Muon: the `weight` of an `nn.Linear` (or subclass) inside a hidden layer (`hidden_layer_modules`): the
    attention projections, the feed-forward matrices and any other linear map of a layer. AdamW: everything
    else, that is every parameter outside the layers (token, position and token-type embeddings, the
    vocabulary projection, tied to the embedding or not, the heads' own matrices such as the MLM transform
    or a classifier, the final norm) and, inside the layers, biases, norm gains, scalar gains,
    embeddings (e.g. relative-position buckets), expert and memory tensors that are not `nn.Linear` weights,
    and convolutions. The rule reads the module type and shape only, never a parameter's name.

    Args:
        param: the parameter.
        module: the module whose `_parameters` hold it directly.
        in_hidden_layer: `module` is inside a hidden layer (`id(module) in hidden_layer_modules(model)`).

    Returns:
        True for a Muon parameter.
    """
    return in_hidden_layer and isinstance(module, nn.Linear) and param is module.weight and len(_shape(param)) == 2


def muon_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[tuple[nn.Parameter, nn.Module]]]:
    """Split the trainable parameters of `model` into Muon's and AdamW's (`is_muon_parameter`).

    Frozen parameters are left out; a parameter shared by several modules appears once, in Muon's list when
    any of its holders makes it a Muon parameter (tied layers hold the same `nn.Linear`).

    Args:
        model: the model (plain or wrapped; not partitioned by ZeRO-3, which `create_optimizer` refuses with
            Muon).

    Returns:
        `(muon, adamw)`: the Muon matrices, and each AdamW parameter with the module that holds it (for
        `no_weight_decay`).
    """
    inside = hidden_layer_modules(model)
    muon: dict[int, nn.Parameter] = {}
    adamw: dict[int, tuple[nn.Parameter, nn.Module]] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if not param.requires_grad:
                continue
            if is_muon_parameter(param, module, id(module) in inside):
                muon[id(param)] = param
                adamw.pop(id(param), None)
            elif id(param) not in muon:
                adamw.setdefault(id(param), (param, module))
    return list(muon.values()), list(adamw.values())


class MuonWithAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` and `torch.optim.AdamW` stepped together as one optimizer.

    torch has one class per optimizer, so the two groups of parameters live in two optimizers; this class
    shows them as one, the way accelerate's `AcceleratedOptimizer` wraps an optimizer:

    - `param_groups`: AdamW's groups (decayed, exempt) then Muon's, the children's own dicts, so a
      learning-rate schedule (transformers' `get_scheduler`, a `LambdaLR` that sets each group's `lr` to its
      `initial_lr` times one factor) scales both learning rates alike; `get_last_lr()[0]` is AdamW's;
    - `state`: both children's per-parameter states (disjoint parameters);
    - `state_dict()` / `load_state_dict()`: `{"adamw": ..., "muon": ...}`, the children's own state dicts, so
      accelerate's `save_state` / `load_state` keep Muon's momentum buffers and AdamW's moments and a resumed
      run continues exactly;
    - `step()`, `zero_grad()`: both children.

    Gradient clipping acts on the model's gradients and needs nothing here; an fp16 `GradScaler` unscales
    and checks every parameter of `param_groups`.

    Args:
        muon: the optimizer of the hidden-layer matrices.
        adamw: the optimizer of every other parameter.
    """

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        # Not `Optimizer.__init__`: the groups and states are the children's, not copies.
        self.muon, self.adamw = muon, adamw
        self.defaults: dict[str, Any] = {}
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """`{"adamw": ..., "muon": ...}` (the order of `param_groups` and `state_dict`)."""
        return {"adamw": self.adamw, "muon": self.muon}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW's then Muon's groups, read afresh each time (a child's `load_state_dict` replaces its dicts)."""
        return [group for optimizer in self.optimizers.values() for group in optimizer.param_groups]

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        """Parameter -> its state (AdamW's `exp_avg`, `exp_avg_sq`, `step`; Muon's `momentum_buffer`)."""
        return {param: value for optimizer in self.optimizers.values() for param, value in optimizer.state.items()}

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Both optimizers' state dicts, as `{"adamw": ..., "muon": ...}`."""
        return {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()}

    def load_state_dict(self, state_dict: dict[str, dict[str, Any]]) -> None:
        """Load what `state_dict()` returned into both optimizers.

        Raises:
            ValueError: `state_dict` is not that of a `MuonWithAdamW` (e.g. a plain AdamW checkpoint).
        """
        if not isinstance(state_dict, dict) or set(state_dict) != set(self.optimizers):
            keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(
                f"optimizer state with keys {keys} is not a Muon + AdamW state ({sorted(self.optimizers)}): "
                "the checkpoint was written with another --optim"
            )
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state_dict[name])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of both optimizers' parameters."""
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        """Step both optimizers (the closure, if any, is evaluated once, with gradients enabled)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers.values():
            optimizer.step()
        return loss

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Not supported: a new group belongs to one of the two optimizers (raises `NotImplementedError`)."""
        raise NotImplementedError("MuonWithAdamW: add a group to its .muon or .adamw optimizer")


def create_optimizer(
    model: nn.Module,
    *,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    fused: bool = False,
    muon: MuonSettings | None = None,
) -> torch.optim.AdamW | MuonWithAdamW:
    """Build the recipes' AdamW over `weight_decay_groups(model, weight_decay)`, or Muon + AdamW.

    Args:
        model: the model to optimize.
        learning_rate: peak AdamW learning rate (the scheduler scales it).
        weight_decay: decoupled AdamW weight decay of the matrices.
        betas: Adam's `(beta1, beta2)`.
        fused: use the fused AdamW kernel (one kernel for all parameters); False: torch's default (foreach).
        muon: None: AdamW for every parameter. Else `torch.optim.Muon` with these settings for the
            hidden-layer matrices (`muon_parameters`) and AdamW, with the weight-decay groups of
            `no_weight_decay`, for the rest.

    Returns:
        The `torch.optim.AdamW`, or a `MuonWithAdamW`.

    Raises:
        ValueError: with `muon`, a model with no hidden-layer matrix (not an hfzoo model, or every such matrix
            frozen), a parameter partitioned by DeepSpeed ZeRO-3, or a bad Muon setting (naming its flag).
    """
    if muon is None:
        return torch.optim.AdamW(
            weight_decay_groups(model, weight_decay), lr=learning_rate, betas=betas, fused=fused or None
        )
    if any(hasattr(p, "ds_shape") for p in model.parameters()):
        raise ValueError("--optim muon: parameters partitioned by DeepSpeed ZeRO-3; Muon needs whole matrices")
    _check_muon_settings(muon)
    matrices, others = muon_parameters(model)
    if not matrices:
        raise ValueError(
            f"--optim muon: {type(model).__name__} has no trainable hidden-layer matrix (an nn.Linear weight in "
            "the layers of an hfzoo layer stack); use --optim adamw_torch_fused"
        )
    decay = [p for p, module in others if not no_weight_decay(p, module)]
    exempt = [p for p, module in others if no_weight_decay(p, module)]
    adamw = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}],
        lr=learning_rate,
        betas=betas,
        fused=fused or None,
    )
    muon_optimizer = torch.optim.Muon(
        matrices,
        lr=muon.learning_rate,
        weight_decay=muon.weight_decay,
        momentum=muon.momentum,
        nesterov=muon.nesterov,
        ns_steps=muon.ns_steps,
        adjust_lr_fn=muon.adjust_lr_fn,
    )
    return MuonWithAdamW(muon_optimizer, adamw)


def _check_muon_settings(muon: MuonSettings) -> None:
    checks = [
        ("--muon_learning_rate", muon.learning_rate, muon.learning_rate > 0, "> 0"),
        ("--muon_momentum", muon.momentum, 0 <= muon.momentum < 1, "in [0, 1)"),
        ("--muon_weight_decay", muon.weight_decay, muon.weight_decay >= 0, ">= 0"),
        ("--muon_ns_steps", muon.ns_steps, isinstance(muon.ns_steps, int) and 1 <= muon.ns_steps < 100, "in [1, 100)"),
        (
            "--muon_adjust_lr_fn",
            muon.adjust_lr_fn,
            muon.adjust_lr_fn in MUON_ADJUST_LR_FNS,
            f"one of {MUON_ADJUST_LR_FNS}",
        ),
    ]
    for flag, value, ok, allowed in checks:
        if not ok:
            raise ValueError(f"{flag} {value!r}: must be {allowed}")


#: `torch.optim.Muon`'s `adjust_lr_fn` values (`MuonSettings.adjust_lr_fn`).
MUON_ADJUST_LR_FNS = ("original", "match_rms_adamw")


def warmup_outlasts_training(num_warmup_steps: int, num_training_steps: int) -> str | None:
    """A warning when the linear warmup does not end before training does, else None.

    With `num_warmup_steps >= num_training_steps` the learning rate is still rising when the run ends: the
    last step trains at `num_training_steps / num_warmup_steps` of the peak (`--learning_rate`) at most. Runs
    shortened with `--max_train_steps` for a quick look do this on purpose, so the jobs log this rather than
    refuse.

    Args:
        num_warmup_steps: optimizer steps of warmup (`--num_warmup_steps`).
        num_training_steps: optimizer steps of the run.

    Returns:
        The one-line warning, or None when the warmup ends within the run.
    """
    if num_warmup_steps < num_training_steps or num_training_steps < 1:
        return None
    return (
        f"--num_warmup_steps {num_warmup_steps} is not below the run's {num_training_steps} optimizer steps: the "
        f"learning rate is still warming up when training ends (at most {num_training_steps / num_warmup_steps:.0%} "
        "of --learning_rate)"
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
            `--lr_scheduler_kwargs`); a warmup or any schedule argument with `constant` (transformers'
            `get_scheduler` ignores both for it).
    """
    if name == "constant" and num_warmup_steps:
        raise ValueError(
            f"--lr_scheduler_type constant has no warmup (--num_warmup_steps {num_warmup_steps} would be ignored); "
            "use --lr_scheduler_type constant_with_warmup"
        )
    if name == "constant" and scheduler_kwargs:
        raise ValueError(
            f"--lr_scheduler_type constant takes no arguments (--lr_scheduler_kwargs {scheduler_kwargs} would be "
            "ignored)"
        )
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
