"""Product key memory (Lample et al. 2019, "Large Memory Layers with Product Keys"): a feed-forward replacement.

`ProductKeyMemory` is the `"product_key_memory"` entry of `hfzoo.modules.layer.FEED_FORWARD_BLOCKS`: the
feed-forward sublayers listed in `config.memory_layers` (the encoder-decoder's decoder:
`decoder_memory_layers`) read a memory of `memory_num_keys ** 2` values instead of running an MLP. Its query
normalisations are registered in `MEMORY_QUERY_NORMS` at the bottom of this file.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import initialization as init

from ..choices import choice_hint


class HalfKeyLayerNorm(nn.Module):
    """Layer normalisation of each half of each head's query, as Narang et al. 2021's Mesh TensorFlow memory.

    Mesh TensorFlow's `ProductKeyValueMemory` normalises the query with a layer norm over the sub-key
    dimension instead of Lample et al.'s batch norm ("layer norm works well with the codebase").

    Args:
        config: an hfzoo config (`memory_heads`, `memory_key_dim`, `layer_norm_eps`).

    Shapes:
        `(num_tokens, memory_heads * memory_key_dim)` -> the same.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.memory_key_dim // 2, eps=config.layer_norm_eps)

    def forward(self, query: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise every sub-key query of `query`; `valid` is unused (no statistics across tokens)."""
        half = self.norm.normalized_shape[0]
        return self.norm(query.view(*query.shape[:-1], -1, half)).view(query.shape)


class QueryBatchNorm(nn.BatchNorm1d):
    """Batch normalisation of the memory queries (Lample et al. 2019, §3.2 and §4.4: "query batch normalization").

    An `nn.BatchNorm1d(memory_heads * memory_key_dim)` whose training statistics are taken over the real
    tokens only (padding never changes another token's output); evaluation uses the running statistics.

    Shapes:
        `(num_tokens, memory_heads * memory_key_dim)`, `valid` `(num_tokens,)` bool or None -> the same shape.
    """

    def __init__(self, config) -> None:
        super().__init__(config.memory_heads * config.memory_key_dim)

    def forward(self, query: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise `query` with the statistics of the `valid` rows (all rows when None)."""
        if valid is None or bool(valid.all()):
            return super().forward(query)
        normalized = query.clone()
        normalized[valid] = super().forward(query[valid])
        return normalized


class ProductKeyMemory(nn.Module):
    """A product-key memory layer (Lample et al. 2019, §3, Fig. 2), in place of a feed-forward sublayer.

    For each of `memory_heads` heads, the query `q = Norm(W_q x + b_q)` (`memory_key_dim` features, split in
    two halves) is scored against two sets of `memory_num_keys` sub-keys (`keys`, `(heads, 2, |K|, d_q / 2)`);
    the `memory_top_k` best of each set give k^2 candidate product keys whose score is the sum of the two
    sub-key scores, of which the k best are kept (§3.2: exactly the top k of all |K|^2 product keys). Their
    softmax weights read the `values` (`nn.EmbeddingBag(|K|^2, hidden_size)`) and the heads' reads are summed
    (§3.3, as the reference XLM `HashingMemory` and Mesh TensorFlow's `ProductKeyValueMemory`):
    ```
    out = sum_h sum_{i in top-k_h} softmax(s_h)_i * values[i]
    ```
    Reads `hidden_size`, `memory_num_keys` (|K|), `memory_heads` (H), `memory_top_k` (k), `memory_key_dim`
    (d_q) and `memory_query_norm` (a `MEMORY_QUERY_NORMS` key: `batch_norm`, Lample et al. §3.2; `layer_norm`
    over each sub-key, Narang et al.'s Mesh TensorFlow). Initialisation as XLM: sub-keys uniform in
    `+-(d_q / 2)^-1/2`, values normal with standard deviation `hidden_size^-1/2`. The values' gradients are
    dense (XLM can make them sparse).

    Args:
        config: an hfzoo config.

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)`, `padding_mask` `(batch_size, seq_len)` bool or
        None -> `(batch_size, seq_len, hidden_size)`, same dtype.
    """

    uses_padding_mask = True  # the layer hands it `padding_mask` (`hfzoo.modules.layer.HfzooLayer`)

    def __init__(self, config) -> None:
        super().__init__()
        self.num_keys = config.memory_num_keys
        self.num_heads = config.memory_heads
        self.top_k = config.memory_top_k
        self.key_dim = config.memory_key_dim
        self.query_proj = nn.Linear(config.hidden_size, self.num_heads * self.key_dim)
        self.query_norm = MEMORY_QUERY_NORMS[config.memory_query_norm](config)
        self.keys = nn.Parameter(torch.empty(self.num_heads, 2, self.num_keys, self.key_dim // 2))
        self.values = nn.EmbeddingBag(self.num_keys**2, config.hidden_size, mode="sum")

    def init_module_weights(self, config) -> None:
        """Sub-keys uniform in `+-(d_q / 2)^-1/2`, values normal(0, `hidden_size^-1/2`), as XLM (by `_init_weights`)."""
        bound = (self.key_dim // 2) ** -0.5
        init.uniform_(self.keys, -bound, bound)
        init.normal_(self.values.weight, mean=0.0, std=self.values.embedding_dim**-0.5)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """No projection of the value path: the memory's values are a table, which DeepNorm / Fixup leave as drawn."""
        return [], []

    def lookup(
        self, hidden_states: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best product keys of each head: their scores and their value indices (Lample et al. §3.2).

        Args:
            hidden_states: `(num_tokens, hidden_size)`.
            valid: `(num_tokens,)` bool (False at padding, left out of the batch-norm statistics), or None.

        Returns:
            `(scores, indices)`: `(num_tokens, heads, top_k)` float32 and int64 in `[0, num_keys ** 2)`, best first.
        """
        query = self.query_norm(self.query_proj(hidden_states), valid)
        query = query.view(-1, self.num_heads, 2, self.key_dim // 2)  # (tokens, heads, half, d_q / 2)
        sub_scores = torch.einsum("thcd,hckd->thck", query, self.keys.to(query.dtype)).float()
        sub_scores, sub_indices = sub_scores.topk(self.top_k, dim=-1)  # (tokens, heads, 2, k)
        # Product keys (i, j) score s1_i + s2_j and address value i * |K| + j: k^2 candidates per head.
        scores = sub_scores[:, :, 0, :, None] + sub_scores[:, :, 1, None, :]
        indices = sub_indices[:, :, 0, :, None] * self.num_keys + sub_indices[:, :, 1, None, :]
        scores, best = scores.flatten(2).topk(self.top_k, dim=-1)  # (tokens, heads, k)
        return scores, indices.flatten(2).gather(-1, best)

    def forward(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Read the memory for every position (shapes in the class docstring)."""
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])
        valid = padding_mask.reshape(-1) if padding_mask is not None else None
        scores, indices = self.lookup(tokens, valid)
        weights = torch.softmax(scores, dim=-1)  # over each head's k keys, float32
        read = self.values(indices.flatten(1), per_sample_weights=weights.flatten(1).to(self.values.weight.dtype))
        return read.to(hidden_states.dtype).view(shape)

    @staticmethod
    def check_config(config) -> None:
        """Refuse bad memory fields and memory positions outside a stack (`ValueError` naming the field).

        Called when the config is built (`FEED_FORWARD_BLOCKS` entries' `check_config`).
        """
        for name in ("memory_num_keys", "memory_heads", "memory_top_k", "memory_key_dim"):
            value = getattr(config, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if config.memory_key_dim % 2:
            raise ValueError(
                f"memory_key_dim={config.memory_key_dim} must be even: each query is split into two sub-key halves"
            )
        if config.memory_top_k > config.memory_num_keys:
            raise ValueError(
                f"memory_top_k={config.memory_top_k} exceeds memory_num_keys={config.memory_num_keys} "
                "(the top k of each sub-key set)"
            )
        if config.memory_query_norm not in MEMORY_QUERY_NORMS:
            raise ValueError(
                f"memory_query_norm={config.memory_query_norm!r} is not supported; "
                f"{choice_hint(config.memory_query_norm, MEMORY_QUERY_NORMS)}"
            )
        used = False
        for layout in config.stack_layouts():
            used |= bool(layout.memory_positions(config))  # validates the positions against the stack
        if not used:
            defaults = {f.name: f.default for f in dataclasses.fields(config)}
            for name in ("memory_num_keys", "memory_heads", "memory_top_k", "memory_key_dim", "memory_query_norm"):
                if getattr(config, name) != defaults[name]:
                    raise ValueError(
                        f"{name}={getattr(config, name)!r} only applies to a product key memory, but no stack has one "
                        f"(memory_layers is empty); leave it at its default {defaults[name]!r}"
                    )


# Normalisations of the memory queries, selected by `config.memory_query_norm`.
MEMORY_QUERY_NORMS = {
    "batch_norm": QueryBatchNorm,  # Lample et al. 2019 §3.2
    "layer_norm": HalfKeyLayerNorm,  # Narang et al. 2021 (Mesh TensorFlow)
}
