"""Sparse mixture-of-experts feed-forward: routers, the MoE block and its auxiliary losses.

`SparseMoeFeedForward` replaces the feed-forward block of every `config.moe_layer_interval`-th layer
when `config.num_experts > 0` (layers with `(layer_idx + 1) % moe_layer_interval == 0`, as transformers'
`decoder_sparse_step`). A router (`HfzooRouter`) scores each token against `num_experts` experts (each a
`FeedForward`, so `gated_mlp` and `hidden_act` apply inside experts) and dispatches it; the block's
output is the gate-weighted sum of the chosen experts' outputs. Routing rules are registered in
`ROUTERS` at the bottom of this file:

- `top_k`: each token goes to its `num_experts_per_tok` most probable experts, weighted by the softmax
  over the kept logits (Shazeer et al. 2017, eq. 3-5, without the noise term; GShard/Mixtral top-2). No
  capacity limit: no token is dropped.
- `switch`: top-1 routing weighted by the router probability, with an expert capacity of
  `ceil(expert_capacity_factor * tokens / num_experts)` (Fedus et al. 2021, §2.1-2.2). Tokens over
  capacity are dropped: their feed-forward output is zero, so the residual carries them unchanged.
  Capacity is counted per sequence over its non-padding tokens, in position order (GShard's groups are
  the sequences), so padding never takes a slot, one sequence never displaces another's tokens, and a
  token's fate depends only on earlier tokens (causal decoders stay causal). Incremental decoding with
  a KV cache counts capacity over the tokens of each call, so it may keep tokens that a full forward drops.

The auxiliary losses (`router_aux_losses`) are computed by each family's LM head from the router logits
that the base model records (transformers' `output_router_logits` mechanism) and added to its loss.
"""

from __future__ import annotations

import torch
from torch import nn

from .feed_forward import FeedForward


def is_moe_layer(config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` (0-based, within its stack) has a mixture-of-experts feed-forward.

    Args:
        config: an hfzoo config (`num_experts`, `moe_layer_interval`).
        layer_idx: index of the layer in its stack.

    Returns:
        True when `config.num_experts > 0` and `(layer_idx + 1) % config.moe_layer_interval == 0`.
    """
    return config.num_experts > 0 and (layer_idx + 1) % config.moe_layer_interval == 0


def token_padding_mask(
    attention_mask: torch.Tensor | None, seq_len: int, past_length: int | torch.Tensor | None = None
) -> torch.Tensor | None:
    """The `(batch_size, seq_len)` bool mask of real (non-padding) tokens, from the attention mask.

    From a 2-D mask, its last `seq_len` columns. From a prepared 4-D mask (what `generate` hands a model with a
    static cache) given `past_length`, whether each current token may attend to itself: padding masks a padded
    token's own key, and causality and local windows never do; its key is at `past_length + i` (a static cache's
    slots, or the keys of a dynamic cache, start at position 0).

    Args:
        attention_mask: `(batch_size, past_len + seq_len)` with 1 for tokens and 0 for padding (the
            last `seq_len` columns are the current tokens), a prepared 4-D mask `(batch_size or 1, 1 or heads,
            seq_len, kv_len)` (boolean, True = attend, or additive float, 0 = attend), or None.
        seq_len: number of current tokens.
        past_length: tokens before the current ones (an int, or a static cache's length tensor), needed to read
            a 4-D mask; None: a 4-D mask gives None.

    Returns:
        A bool tensor `(batch_size, seq_len)` (batch size 1 from a 4-D mask broadcast over the batch), or None
        when there is no mask to read (every token is real).
    """
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return None
    if attention_mask.dim() == 2:
        return attention_mask[:, -seq_len:].bool()
    if attention_mask.dim() != 4 or past_length is None:
        return None
    queries = torch.arange(seq_len, device=attention_mask.device)
    own_keys = attention_mask[:, 0, queries, queries + past_length]  # (batch or 1, seq_len)
    return own_keys if own_keys.dtype == torch.bool else own_keys == 0


def top_k_routing(
    probs: torch.Tensor, valid: torch.Tensor, top_k: int, capacity_factor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing (Shazeer et al. 2017, eq. 3-5 without noise; GShard / Mixtral): no capacity, no dropping.

    Gates are the router probabilities of the `top_k` chosen experts renormalised to sum to 1, which
    equals `Softmax(KeepTopK(logits, k))` (with `top_k=1` every gate is 1: use `switch` routing for
    probability-weighted top-1).

    Args:
        probs: `(batch_size, seq_len, num_experts)` float32 router probabilities.
        valid: `(batch_size, seq_len)` bool, False for padding (never dispatched).
        top_k: experts per token.
        capacity_factor: unused (top-k routing has no capacity).

    Returns:
        `(weights, experts)`, each `(batch_size, seq_len, top_k)`: float32 gates and int64 expert ids,
        -1 where a slot is not dispatched.
    """
    weights, experts = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    experts = experts.masked_fill(~valid[..., None], -1)
    return weights * valid[..., None], experts


def switch_routing(
    probs: torch.Tensor, valid: torch.Tensor, top_k: int, capacity_factor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Switch routing (Fedus et al. 2021, §2.1-2.2): top-1 expert, gate = its probability, capacity per sequence.

    Expert capacity = `ceil(capacity_factor * n / num_experts)` for a sequence of `n` non-padding
    tokens (eq. 3, with the sequence as the batch of tokens); tokens are served in position order and
    the ones beyond an expert's capacity are dropped.

    Args:
        probs: `(batch_size, seq_len, num_experts)` float32 router probabilities.
        valid: `(batch_size, seq_len)` bool, False for padding (never dispatched, never counted).
        top_k: must be 1 (checked by the config).
        capacity_factor: the capacity factor (> 0).

    Returns:
        `(weights, experts)`, each `(batch_size, seq_len, 1)`: float32 gates and int64 expert ids, -1 for
        dropped tokens and padding.
    """
    num_experts = probs.shape[-1]
    gate, expert = probs.max(dim=-1)  # (batch_size, seq_len)
    one_hot = nn.functional.one_hot(expert, num_experts) * valid[..., None]  # (batch_size, seq_len, num_experts)
    # 1-based place of each token in its expert's queue within its sequence
    place = (one_hot.cumsum(dim=1) * one_hot).sum(dim=-1)  # (batch_size, seq_len)
    capacity = torch.ceil(capacity_factor * valid.sum(dim=1, keepdim=True) / num_experts)  # (batch_size, 1)
    kept = valid & (place <= capacity)
    return (gate * kept)[..., None], expert.masked_fill(~kept, -1)[..., None]


class HfzooRouter(nn.Module):
    """Scores tokens against experts and picks where each goes (`config.router_type`, see `ROUTERS`).

    The router runs in float32 even under bf16 autocast (Fedus et al. 2021, §2.4 "selective precision").
    Its weight is `classifier` (`hidden_size -> num_experts`, no bias), as in transformers' Switch
    Transformers router.

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)`, `padding_mask` `(batch_size, seq_len)` bool
        or None -> `router_logits` `(batch_size * seq_len, num_experts)` float32, `weights` and `experts`
        `(batch_size * seq_len, num_experts_per_tok)` (float32 gates; int64 expert ids, -1 = not dispatched).
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.route = ROUTERS[config.router_type]
        self.top_k = config.num_experts_per_tok
        self.capacity_factor = config.expert_capacity_factor

    def forward(
        self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Route `hidden_states`; returns `(router_logits, weights, experts)` (shapes in the class docstring)."""
        batch_size, seq_len, _ = hidden_states.shape
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            logits = nn.functional.linear(hidden_states.float(), self.classifier.weight.float())
        valid = (
            torch.ones(batch_size, seq_len, dtype=torch.bool, device=logits.device)
            if padding_mask is None
            else padding_mask.to(logits.device, torch.bool)
        )
        weights, experts = self.route(logits.softmax(dim=-1), valid, self.top_k, self.capacity_factor)
        return logits.reshape(batch_size * seq_len, -1), weights.flatten(0, 1), experts.flatten(0, 1)


class SparseMoeFeedForward(nn.Module):
    """Mixture-of-experts feed-forward: `sum_k gate_k(x) * expert_{e_k(x)}(x)` (Shazeer et al. 2017, eq. 1).

    `router` (`HfzooRouter`) chooses the experts; `experts` is a `ModuleList` of `num_experts`
    `FeedForward` blocks (each with `up_proj`/`down_proj`, and `gate_proj` with `gated_mlp`). Tokens are
    gathered per expert (a loop over experts, none over tokens); every expert runs, on zero tokens if
    none was routed to it. Dropped tokens and padding get a zero output.

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)`, `padding_mask` `(batch_size, seq_len)` bool
        or None -> `(batch_size, seq_len, hidden_size)`, same dtype.
    """

    uses_padding_mask = True  # the layer hands it `padding_mask` (`hfzoo.modules.layer.HfzooLayer`)

    def __init__(self, config) -> None:
        super().__init__()
        self.router = HfzooRouter(config)
        self.experts = nn.ModuleList([FeedForward(config) for _ in range(config.num_experts)])

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """Every expert's projections (value path, output) for DeepNorm / Fixup; the router keeps its initialisation."""
        value_path, outputs = [], []
        for expert in self.experts:
            expert_value_path, expert_outputs = expert.residual_branch_projections()
            value_path += expert_value_path
            outputs += expert_outputs
        return value_path, outputs

    def forward(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Route each token to its experts and combine their outputs (shapes in the class docstring)."""
        _, weights, experts = self.router(hidden_states, padding_mask)
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # (batch_size * seq_len, hidden_size)
        output = torch.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            token, slot = torch.where(experts == index)  # (n,), (n,): tokens routed to this expert
            expert_out = expert(tokens[token]) * weights[token, slot, None]
            output.index_add_(0, token, expert_out.to(output.dtype))
        return output.view_as(hidden_states)


def load_balancing_loss(
    router_logits: torch.Tensor, top_k: int, padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Load-balancing loss of one MoE layer: `N * sum_i f_i * P_i` (Fedus et al. 2021, eq. 4-6).

    `f_i` is the fraction of (non-padding) tokens whose top-`top_k` experts include expert i (summed over
    the k choices, as transformers' Mixtral `load_balancing_loss_func`; with `top_k=1` exactly eq. 5), and
    `P_i` the mean router probability of expert i (eq. 6). Equals 1 for perfectly uniform routing. The
    choice is the router's top-k before any capacity dropping, as in the paper.

    Args:
        router_logits: `(num_tokens, num_experts)` logits of one layer (`num_tokens = batch_size * seq_len`).
        top_k: experts chosen per token.
        padding_mask: `(batch_size, seq_len)` (1 = token) or None; padding is excluded from both statistics.

    Returns:
        A float32 scalar.
    """
    logits = router_logits.float()
    num_experts = logits.shape[-1]
    probs = logits.softmax(dim=-1)  # (num_tokens, num_experts)
    chosen = nn.functional.one_hot(probs.topk(top_k, dim=-1).indices, num_experts).sum(dim=1)  # (num_tokens, E)
    weight = torch.ones_like(probs[:, 0]) if padding_mask is None else padding_mask.reshape(-1).to(probs)
    total = weight.sum()
    fraction = (chosen * weight[:, None]).sum(dim=0) / total  # f_i
    mean_prob = (probs * weight[:, None]).sum(dim=0) / total  # P_i
    return num_experts * (fraction * mean_prob).sum()


def router_z_loss(router_logits: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Router z-loss of one MoE layer: `mean_tokens (logsumexp_i x_i)^2` (Zoph et al. 2022, ST-MoE, eq. 5).

    Args:
        router_logits: `(num_tokens, num_experts)` logits of one layer.
        padding_mask: `(batch_size, seq_len)` (1 = token) or None; padding is excluded from the mean.

    Returns:
        A float32 scalar.
    """
    z = torch.logsumexp(router_logits.float(), dim=-1) ** 2  # (num_tokens,)
    if padding_mask is None:
        return z.mean()
    weight = padding_mask.reshape(-1).to(z)
    return (z * weight).sum() / weight.sum()


def router_aux_losses(
    router_logits: tuple[torch.Tensor, ...], config, padding_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The auxiliary losses of one stack's MoE layers, each averaged over those layers.

    Args:
        router_logits: one `(batch_size * seq_len, num_experts)` tensor per MoE layer of the stack.
        config: the model config (`num_experts_per_tok`, `router_aux_loss_coef`, `router_z_loss_coef`).
        padding_mask: `(batch_size, seq_len)` (1 = token) or None.

    Returns:
        `(aux_loss, balance_loss, z_loss)` float32 scalars: the load-balancing loss (`load_balancing_loss`)
        and router z-loss (`router_z_loss`) averaged over layers, and `aux_loss = router_aux_loss_coef *
        balance_loss + router_z_loss_coef * z_loss`, the term added to the training loss.
    """
    balance = torch.stack([load_balancing_loss(x, config.num_experts_per_tok, padding_mask) for x in router_logits])
    z = torch.stack([router_z_loss(x, padding_mask) for x in router_logits])
    balance, z = balance.mean(), z.mean()
    return config.router_aux_loss_coef * balance + config.router_z_loss_coef * z, balance, z


ROUTERS = {
    "top_k": top_k_routing,
    "switch": switch_routing,
}
