"""Normalization layers, selected by `config.norm_type`.

Options are registered in `NORM_CLASSES` at the bottom of this file: `layer_norm` (Ba et al. 2016),
`rms_norm` (Zhang & Sennrich 2019) and `none` (an identity: no normalization, for ReZero alone and
Fixup). `QK_NORMS` holds the per-head normalizations of queries and keys (`config.qk_norm`, QK-norm:
Dehghani et al. 2023 §3.1; OLMo 2), applied by `hfzoo.modules.attention.HfzooAttention`.
The residual wiring that places them (`config.norm_position`: pre / post / sandwich / deepnorm) and the
residual scalings (ReZero, Fixup, DeepNorm) live in `hfzoo/modules/layer.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..choices import choice_hint


class RMSNorm(nn.Module):
    """Root-mean-square layer normalization (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4).

    `y = x / sqrt(mean(x^2) + eps) * weight`: no mean subtraction and no bias (as in T5's `T5LayerNorm`).
    The statistic is computed in float32 and the result cast back to the input dtype, so bf16 inputs
    are normalised without overflow.

    Args:
        hidden_size: size of the last dimension.
        eps: added to the mean square before the square root.
        elementwise_affine: learn the per-feature scale `weight` (True); False: `y = x / sqrt(mean(x^2) + eps)`
            with no parameter (as `nn.RMSNorm(elementwise_affine=False)`).

    Shapes:
        input `(..., hidden_size)` -> output of the same shape and dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None
        self.normalized_size = hidden_size
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalise `hidden_states` `(..., hidden_size)` by its root mean square over the last dimension."""
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is None:
            return hidden_states.to(dtype)
        return self.weight * hidden_states.to(dtype)

    def extra_repr(self) -> str:
        """Show the normalised size, epsilon and whether the scale is learned in `print(model)`."""
        return f"({self.normalized_size},), eps={self.eps}, elementwise_affine={self.weight is not None}"


def build_norm(config) -> nn.Module:
    """Build the normalization layer named by `config.norm_type` over `config.hidden_size` features.

    `layer_norm` reads `config.layer_norm_eps`; `rms_norm` reads `config.rms_norm_eps`; `none` is an
    `nn.Identity` (no parameters).

    Args:
        config: an hfzoo config (validated, so `norm_type` is a key of `NORM_CLASSES`).

    Returns:
        An `nn.Module` mapping `(..., hidden_size)` to the same shape.
    """
    return NORM_CLASSES[config.norm_type](config)


NORM_CLASSES = {
    "layer_norm": lambda config: nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
    "rms_norm": lambda config: RMSNorm(config.hidden_size, eps=config.rms_norm_eps),
    "none": lambda config: nn.Identity(),
}


# QK-norm (`config.qk_norm`): each attention head's queries and keys normalised over `head_dim` before their dot
# product (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters", §3.1; OLMo 2, Walsh et
# al. 2024, whose RMSNorm variant it is). With `qk_norm_learnable_scale` a learned `(head_dim,)` scale shared by
# the heads (no bias: a bias on the keys adds the same q . b to every score of a query, which the softmax
# ignores); without it the normalised vectors have norm sqrt(head_dim). Epsilons: `rms_norm_eps` / `layer_norm_eps`.
QK_NORMS = {
    "rms_norm": lambda config: RMSNorm(
        config.head_dim, eps=config.rms_norm_eps, elementwise_affine=config.qk_norm_learnable_scale
    ),
    "layer_norm": lambda config: nn.LayerNorm(
        config.head_dim, eps=config.layer_norm_eps, elementwise_affine=config.qk_norm_learnable_scale, bias=False
    ),
}


def build_qk_norm(config) -> nn.Module | None:
    """The QK-norm of one of query / key (`QK_NORMS[config.qk_norm]`), or None when `config.qk_norm` is None.

    Args:
        config: an hfzoo config (validated: `qk_norm` is None or a key of `QK_NORMS`).

    Returns:
        A module mapping `(batch_size, num_heads, seq_len, head_dim)` to the same shape and dtype
        (normalised over `head_dim`, statistics in float32 for `rms_norm`), or None.
    """
    qk_norm = getattr(config, "qk_norm", None)
    return None if qk_norm is None else QK_NORMS[qk_norm](config)


def check_qk_norm_config(config) -> None:
    """Refuse a `qk_norm` outside `QK_NORMS` or a non-boolean `qk_norm_learnable_scale`.

    Raises:
        ValueError: naming the field, its value and the allowed values.
    """
    if config.qk_norm is not None and config.qk_norm not in QK_NORMS:
        raise ValueError(
            f"qk_norm={config.qk_norm!r} is not supported; {choice_hint(config.qk_norm, [None, *QK_NORMS])}"
        )
    if not isinstance(config.qk_norm_learnable_scale, bool):
        raise ValueError(f"qk_norm_learnable_scale must be True or False, got {config.qk_norm_learnable_scale!r}")
    if config.qk_norm is None and not config.qk_norm_learnable_scale:
        raise ValueError(
            "qk_norm_learnable_scale=False only applies with qk_norm='rms_norm' or 'layer_norm', but qk_norm=None; "
            "leave it at its default True"
        )
