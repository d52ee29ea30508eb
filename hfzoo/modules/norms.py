"""Normalization layers, selected by `config.norm_type`.

Options are registered in `NORM_CLASSES` at the bottom of this file: `layer_norm` (Ba et al. 2016),
`rms_norm` (Zhang & Sennrich 2019) and `none` (an identity: no normalization, for ReZero alone and
Fixup). The residual wiring that places them (`config.norm_position`: pre / post / sandwich /
deepnorm) and the residual scalings (ReZero, Fixup, DeepNorm) live in `hfzoo/modules/layer.py`.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square layer normalization (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4).

    `y = x / sqrt(mean(x^2) + eps) * weight`: no mean subtraction and no bias (as in T5's `T5LayerNorm`).
    The statistic is computed in float32 and the result cast back to the input dtype, so bf16 inputs
    are normalised without overflow.

    Args:
        hidden_size: size of the last dimension.
        eps: added to the mean square before the square root.

    Shapes:
        input `(..., hidden_size)` -> output of the same shape and dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalise `hidden_states` `(..., hidden_size)` by its root mean square over the last dimension."""
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden_states.to(dtype)

    def extra_repr(self) -> str:
        """Show the normalised size and epsilon in `print(model)`."""
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


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
