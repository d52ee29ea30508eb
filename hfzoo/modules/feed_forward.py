"""Position-wise feed-forward blocks.

`FeedForward` is the two-layer MLP of Vaswani et al. 2017 (§3.3, eq. 2) with the activation named by
`config.hidden_act` (any key of transformers' `ACT2FN`: relu, gelu, gelu_new, silu/swish, ...).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN


class FeedForward(nn.Module):
    """`down_proj(dropout(act(up_proj(x))))`: FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, eq. 2).

    Reads `hidden_size`, `intermediate_size` (d_ff), `hidden_act`, `mlp_bias`, `hidden_dropout_prob` and
    `gated_mlp` (then `down_proj(dropout(act(gate_proj(x)) * up_proj(x)))`, Shazeer 2020) from the config.

    Shapes:
        input `(batch_size, seq_len, hidden_size)` -> output of the same shape and dtype.
    """

    def __init__(self, config) -> None:
        super().__init__()
        # Gated (GLU family, Shazeer 2020 eq. 5-6): down_proj(act(gate_proj(x)) * up_proj(x)).
        self.gate_proj = (
            nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias) if config.gated_mlp else None
        )
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Apply the MLP to `hidden_states` `(batch_size, seq_len, hidden_size)`."""
        if self.gate_proj is not None:
            hidden = self.act_fn(self.gate_proj(hidden_states)) * self.up_proj(hidden_states)
        else:
            hidden = self.act_fn(self.up_proj(hidden_states))
        return self.down_proj(self.dropout(hidden))
