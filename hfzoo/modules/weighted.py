"""The Weighted Transformer's branched attention (Ahmed et al. 2017): the token mixer `"branched_attention"`.

Registered in `hfzoo.modules.mixers.TOKEN_MIXERS`. Each head is a branch with its own output projection,
scaled by a learned `kappa`, passed through a feed-forward block and weighted by a learned `alpha`; the
branches are summed. The feed-forward is part of the mixer, so the layers of a stack using it have no
feed-forward sublayer of their own, and in a cross-attending stack the cross-attention is branched too
(Narang et al. 2021's Mesh TensorFlow setup: `BranchedSelfAttention` + `BranchedEncDecAttention` per layer).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from .attention import HfzooAttention
from .feed_forward import FeedForward

#: Added to the sum of the branch weights (per branch) so that the normalisation never divides by 0.
BRANCH_WEIGHT_EPSILON = 1e-4


def simplex_weights(raw: torch.Tensor) -> torch.Tensor:
    """Non-negative weights summing to (almost) 1: `relu(z) / sum(relu(z) + eps)`.

    Ahmed et al. 2017 (§3) constrain `kappa` and `alpha` to be non-negative and to sum to 1; as Narang et al.
    2021's Mesh TensorFlow code (`BranchedSelfAttention._constraint`), hfzoo keeps them so with a ReLU and a
    normalisation by the sum, applied in the forward pass (PyTorch optimizers have no projection step).

    Args:
        raw: `(num_branches,)` learned values.

    Returns:
        `(num_branches,)` float32 weights >= 0 with sum `S / (S + num_branches * 1e-4)`, S the sum of `relu(raw)`.
    """
    positive = torch.relu(raw.float())
    return positive / (positive + BRANCH_WEIGHT_EPSILON).sum()


class BranchOutputProjection(nn.Linear):
    """Each head's output through its own rows of the output projection: `head_i W^O_i + b` (Ahmed et al. 2017, eq. 3).

    An `nn.Linear(num_heads * head_dim, hidden_size)` (the checkpoint layout and initialisation of
    `HfzooAttention.o_proj`) whose forward keeps the heads apart instead of summing them.

    Args:
        in_features: `num_heads * head_dim`.
        out_features: `hidden_size`.
        bias: add the bias to every branch.
        num_heads: number of heads (branches).

    Shapes:
        `(batch_size, q_len, num_heads, head_dim)` -> `(batch_size, q_len, num_heads, hidden_size)`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, num_heads: int) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.num_heads = num_heads

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        """Project each head of `heads` `(batch_size, q_len, num_heads, head_dim)` to `hidden_size`."""
        weight = self.weight.view(self.out_features, self.num_heads, -1)  # (hidden, heads, head_dim)
        branches = torch.einsum("bqhd,ohd->bqho", heads, weight.to(heads.dtype))
        return branches if self.bias is None else branches + self.bias.to(branches.dtype)


class BranchedAttention(HfzooAttention):
    """Branched (weighted) multi-head attention, Ahmed et al. 2017 ("Weighted Transformer Network for MT"), eq. 3-4.

    With `head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i)` as in `HfzooAttention`:
    ```
    branch_i = kappa_i * (head_i W^O_i + b^O)              (W^O_i: head i's columns of o_proj)
    output   = sum_i alpha_i * FFN(branch_i)               (one FFN, shared by the branches)
    ```
    `kappa = simplex_weights(kappa_raw)`, `alpha = simplex_weights(alpha_raw)` (`branch_kappa`, `branch_alpha`,
    one value per head, drawn from U(0, 1) as Mesh TensorFlow does). The feed-forward `mlp` is a
    `hfzoo.modules.feed_forward.FeedForward` (`intermediate_size`, `hidden_act`, `gated_mlp`, `mlp_bias`),
    shared by the branches as in Narang et al. 2021's implementation, whose parameter count (280M) it gives:
    one attention and one feed-forward per branched sublayer. It costs `num_attention_heads` feed-forward
    passes per token.

    Used for self-attention (`token_mixer="branched_attention"`) and, in a cross-attending stack, for the
    cross-attention after it (`TokenMixer.cross_attention`).

    Args:
        config: an hfzoo config.
        layer_idx: the mixer's KV-cache layer.
        is_causal: causal self-attention (decoder).
        is_cross_attention: attend to `key_value_states` (encoder outputs).

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> `(batch_size, q_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool, is_cross_attention: bool = False) -> None:
        super().__init__(config, layer_idx, is_causal=is_causal, is_cross_attention=is_cross_attention)
        inner = self.num_heads * self.head_dim
        self.o_proj = BranchOutputProjection(inner, config.hidden_size, config.attention_bias, self.num_heads)
        self.branch_kappa = nn.Parameter(torch.empty(self.num_heads))
        self.branch_alpha = nn.Parameter(torch.empty(self.num_heads))
        self.mlp = FeedForward(config)

    def init_module_weights(self, config) -> None:
        """Draw `branch_kappa` and `branch_alpha` from U(0, 1) (Mesh TensorFlow); called by `_init_weights`."""
        init.uniform_(self.branch_kappa, 0.0, 1.0)
        init.uniform_(self.branch_alpha, 0.0, 1.0)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([v_proj, o_proj, feed-forward inputs], [feed-forward output])`, for DeepNorm / Fixup (`layer.py`)."""
        value_path, outputs = self.mlp.residual_branch_projections()
        return [self.v_proj, self.o_proj, *value_path], outputs

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Branched attention of `hidden_states` (arguments as `HfzooAttention.forward`).

        Returns:
            `(output, attn_weights)`: `(batch_size, q_len, hidden_size)` and the attention probabilities
            `(batch_size, num_heads, q_len, kv_len)` (None for fused backends).
        """
        heads, weights = self.attend(hidden_states, **kwargs)  # (batch, q_len, heads, head_dim)
        branches = self.o_proj(heads)  # (batch, q_len, heads, hidden)
        kappa = simplex_weights(self.branch_kappa).to(branches.dtype)
        alpha = simplex_weights(self.branch_alpha).to(branches.dtype)
        branches = self.mlp(branches * kappa[:, None])  # (batch, q_len, heads, hidden)
        return torch.einsum("bqho,h->bqo", branches, alpha), weights
