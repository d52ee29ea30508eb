"""Synthesizer attention (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer Models").

The `TOKEN_MIXERS` entry `synthesizer` (`hfzoo.modules.mixers`): attention whose weights are *synthesized*
instead of (or besides) computed from query-key dot products, then applied to values as usual:
`Y = softmax(B) V`. How `B` is made is `config.synthesizer_type` (registry `SYNTHESIZERS` at the bottom):

- `dense` (§3.1): each token predicts its row of logits over the key positions, `B_i = W_2 relu(W_1 x_i)`,
  with `W_1` the query projection and `W_2` a `(head_dim, max_position_embeddings)` matrix shared by the heads
  (as Mesh TensorFlow's `synthetic_attention`, the code of Narang et al. 2021);
- `random` (§3.2): `B = R`, a learned `(num_heads, L, L)` matrix (L = `max_position_embeddings`), the same for
  every input;
- `factorized_random` (§3.3): `R = R_1 R_2^T` with `R_1, R_2` of shape `(num_heads, L, rank)`.

`config.synthesizer_mixing` (§3.4, mixture synthesizers) combines `B` with dot-product attention: `none`;
`plus` (`B + Q K^T`, Narang et al.'s "plus"); `plus_alpha` (`sigmoid(a) B + (1 - sigmoid(a)) Q K^T` with one
learned scalar `a` per layer, initialised to 0). Score biases (`relative_attention_bias`, `alibi`) are added
to the logits, masks as in attention: in a causal stack the synthesized matrix is masked to the current and
earlier positions before the softmax (Tay et al. §3, "for autoregressive tasks the synthesized matrix is
masked"). Positions are token indices (`past_len + i`), so the random matrices read rows and columns
`0 ... seq_len - 1`; a sequence longer than `max_position_embeddings` is refused. Incremental decoding caches
the values (and the keys of the mixtures; without keys, the values take the cache's key slot): generation
with the cache equals generation without.

Heads: `synthesizer_num_heads` x `synthesizer_head_dim` (default: the attention's), so Narang et al.'s
rows can use Mesh TensorFlow's 8 heads of 128 while cross-attention keeps 12 of 64.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.cache_utils import Cache, EncoderDecoderCache

from ..choices import choice_hint
from .positions import (
    ATTENTION_SCORE_BIASES,
    ROTARY_POSITION_EMBEDDINGS,
    apply_rotary_pos_emb,
    build_layer_score_bias,
    token_positions,
)


class DenseSynthesis(nn.Module):
    """Dense synthesis (Tay et al. 2020 §3.1): `B_i = W_2 relu(q_i)`, logits of each query over the key positions.

    `weight` (an `nn.Linear(head_dim, max_position_embeddings)` without bias) is shared by the heads; key
    position j uses its row j. `q_i = W_1 x_i` is the synthesizer's query projection.

    Args:
        config: an hfzoo config (`max_position_embeddings`).
        num_heads: the synthesizer's heads.
        head_dim: their size.
    """

    uses_queries = True

    def __init__(self, config, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(head_dim, config.max_position_embeddings, bias=False)

    def forward(self, queries: torch.Tensor, query_positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Logits `(batch_size, num_heads, q_len, kv_len)` from `queries` `(batch_size, num_heads, q_len, head_dim)`."""
        return torch.matmul(F.relu(queries), self.proj.weight[:kv_len].t().to(queries.dtype))

    @staticmethod
    def flops_per_pair(config, num_heads: int, head_dim: int) -> int:
        """Training FLOPs per (query, key) pair: `relu(q) . W_2[j]`, 2 per head dimension forward, x3 with backward."""
        return 6 * num_heads * head_dim


class RandomSynthesis(nn.Module):
    """Random synthesis (Tay et al. 2020 §3.2): `B = R`, learned and independent of the input.

    `logits` is an `nn.Embedding(max_position_embeddings, num_heads * max_position_embeddings)`: row i holds
    query position i's logits over every key position for every head (initialised normal(0,
    `initializer_range`): near-uniform weights at the start).

    Args:
        config: an hfzoo config (`max_position_embeddings`).
        num_heads: the synthesizer's heads.
        head_dim: unused.
    """

    uses_queries = False

    def __init__(self, config, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.max_length = config.max_position_embeddings
        self.logits = nn.Embedding(self.max_length, num_heads * self.max_length)

    def forward(self, queries: torch.Tensor | None, query_positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Logits `(1, num_heads, q_len, kv_len)`: rows `query_positions`, columns `0 ... kv_len - 1` of R."""
        rows = self.logits(query_positions).view(-1, self.num_heads, self.max_length)[..., :kv_len]
        return rows.transpose(0, 1)[None]  # (1, heads, q_len, kv_len)

    @staticmethod
    def flops_per_pair(config, num_heads: int, head_dim: int) -> int:
        """0: R is looked up, not computed."""
        return 0


class FactorizedRandomSynthesis(nn.Module):
    """Factorized random synthesis (Tay et al. 2020 §3.3): `R = R_1 R_2^T` per head, rank `synthesizer_factorized_rank`.

    `query_factors` / `key_factors` are `nn.Embedding(max_position_embeddings, num_heads * rank)`: the rows of
    R_1 for the query positions and of R_2 for the key positions.

    Args:
        config: an hfzoo config (`max_position_embeddings`, `synthesizer_factorized_rank`).
        num_heads: the synthesizer's heads.
        head_dim: unused.
    """

    uses_queries = False

    def __init__(self, config, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.rank = num_heads, config.synthesizer_factorized_rank
        self.query_factors = nn.Embedding(config.max_position_embeddings, num_heads * self.rank)
        self.key_factors = nn.Embedding(config.max_position_embeddings, num_heads * self.rank)

    def forward(self, queries: torch.Tensor | None, query_positions: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Logits `(1, num_heads, q_len, kv_len)` = `R_1[query_positions] R_2[0 ... kv_len - 1]^T` per head."""
        key_positions = torch.arange(kv_len, device=query_positions.device)
        r1 = self.query_factors(query_positions).view(-1, self.num_heads, self.rank).transpose(0, 1)
        r2 = self.key_factors(key_positions).view(kv_len, self.num_heads, self.rank).permute(1, 2, 0)
        return torch.matmul(r1, r2)[None]  # (1, heads, q_len, rank) @ (heads, rank, kv_len)

    @staticmethod
    def flops_per_pair(config, num_heads: int, head_dim: int) -> int:
        """Training FLOPs per pair of `R_1 R_2^T`: 2 per head and rank forward, x3 with backward."""
        return 6 * num_heads * config.synthesizer_factorized_rank


def synthesizer_shape(config) -> tuple[int, int]:
    """The synthesizer's `(num_heads, head_dim)`: `synthesizer_num_heads` / `_head_dim`, or the attention's."""
    return (config.synthesizer_num_heads or config.num_attention_heads, config.synthesizer_head_dim or config.head_dim)


def additive_attention_mask(
    attention_mask: torch.Tensor | None,
    q_len: int,
    kv_len: int,
    is_causal: bool,
    dtype: torch.dtype,
    device,
    past_length: int | torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The backend's self-attention mask as an additive float mask broadcastable to `(batch, heads, q_len, kv_len)`.

    Args:
        attention_mask: from `transformers.masking_utils`: an additive float mask (eager), a boolean mask with
            True where attending (SDPA), or None (SDPA relying on its causal kernel, or no masking at all).
        q_len: queries (the last `q_len` of `kv_len` tokens, or the `q_len` after `past_length`).
        kv_len: keys.
        is_causal: build the causal mask when `attention_mask` is None.
        dtype: the mask's dtype.
        device: its device.
        past_length: tokens cached before the queries (`hfzoo.modules.positions.token_positions`), or None.

    Returns:
        0 where attending, the dtype's minimum where masked; None when nothing is masked.
    """
    if attention_mask is not None:
        attention_mask = attention_mask[..., :kv_len]
        if attention_mask.dtype == torch.bool:
            return torch.zeros((), dtype=dtype, device=device).masked_fill(~attention_mask, torch.finfo(dtype).min)
        return attention_mask.to(dtype)
    if not is_causal:
        return None
    query_positions, key_positions = token_positions(q_len, kv_len, device, past_length)
    future = key_positions[None, :] > query_positions[:, None]
    return torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill(future, torch.finfo(dtype).min)


class Synthesizer(nn.Module):
    """Synthesizer token mixer (Tay et al. 2020): `o_proj(softmax(logits) V)` with synthesized logits.

    `logits = B + [score bias] + mask` (`synthesizer_mixing="none"`), `B + Q K^T s` (`"plus"`) or
    `sigmoid(a) B + (1 - sigmoid(a)) Q K^T s` (`"plus_alpha"`), with `B` from `synthesis` (a `SYNTHESIZERS`
    module), `s` the attention's score scaling (`head_dim ** -0.5`, or 1 with `scale_attention_scores=False`,
    where `q_proj`'s initialisation carries it as in T5). Projections: `q_proj` when the synthesis or the
    mixture uses queries, `k_proj` for the mixtures, `v_proj`, `o_proj` (biases when `config.attention_bias`);
    `mixing_logit` is the scalar `a` of `plus_alpha`.

    Args:
        config: an hfzoo config (`synthesizer_type`, `synthesizer_mixing`, `synthesizer_num_heads`,
            `synthesizer_head_dim`, `synthesizer_factorized_rank`, `max_position_embeddings`, `hidden_size`,
            `attention_bias`, `attention_probs_dropout_prob`, `scale_attention_scores`, `position_embedding_type`).
        layer_idx: the mixer's index among its stack's token mixers (its KV-cache layer).
        is_causal: the stack is causal (the synthesized matrix is masked to earlier positions).

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> `(batch_size, q_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.num_heads, self.head_dim = synthesizer_shape(config)
        self.max_length = config.max_position_embeddings
        self.mixing = config.synthesizer_mixing
        self.synthesis = SYNTHESIZERS[config.synthesizer_type](config, self.num_heads, self.head_dim)
        self.scaling = self.head_dim**-0.5 if config.scale_attention_scores else 1.0
        hidden, inner, bias = config.hidden_size, self.num_heads * self.head_dim, config.attention_bias
        self.q_proj = nn.Linear(hidden, inner, bias=bias) if self.uses_queries else None
        self.k_proj = nn.Linear(hidden, inner, bias=bias) if self.mixing != "none" else None
        self.v_proj = nn.Linear(hidden, inner, bias=bias)
        self.o_proj = nn.Linear(inner, hidden, bias=bias)
        if self.q_proj is not None and not config.scale_attention_scores:
            self.q_proj.init_std_scale = self.head_dim**-0.5  # as HfzooAttention (T5: scaling in the init)
        self.mixing_logit = nn.Parameter(torch.zeros(1)) if self.mixing == "plus_alpha" else None
        self.relative_attention_bias = build_layer_score_bias(config, bidirectional=not is_causal)

    @property
    def uses_queries(self) -> bool:
        """Whether the layer projects queries (dense synthesis, or a mixture with dot-product attention)."""
        return self.synthesis.uses_queries or self.mixing != "none"

    def init_parameters(self, initializer_range: float) -> None:
        """`mixing_logit` starts at 0 (equal weights; Mesh TensorFlow's `alpha`); called by `_init_weights`."""
        if self.mixing_logit is not None:
            init.zeros_(self.mixing_logit)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([v_proj], [o_proj])`: the value path and output that DeepNorm / Fixup initialise."""
        return [self.v_proj], [self.o_proj]

    def extra_repr(self) -> str:
        """Show the synthesis, mixing and shape in `print(model)`."""
        return (
            f"mixing={self.mixing!r}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_length={self.max_length}, causal={self.is_causal}"
        )

    def _heads(self, states: torch.Tensor) -> torch.Tensor:
        # (batch, len, heads * head_dim) -> (batch, heads, len, head_dim)
        return states.view(*states.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        padding_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix the positions of `hidden_states` by synthesized attention.

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: the backend's self-attention mask (`transformers.masking_utils`): additive float
                (eager), boolean (SDPA) or None.
            cache: a transformers `Cache` (causal stacks): values (and keys of the mixtures) of the
                earlier tokens, extended in place.
            padding_mask: unused (padding comes from `attention_mask`).
            position_embeddings: rotary `(cos, sin)` for the mixtures' queries and keys, or None.
            position_bias: a score bias `(batch_size or 1, num_heads, q_len, kv_len)` the stack shares, or None.
            **kwargs: ignored attention-backend options.

        Returns:
            `(output, weights)`: `(batch_size, q_len, hidden_size)` and the attention probabilities
            `(batch_size, num_heads, q_len, kv_len)`.

        Raises:
            ValueError: more tokens than `max_position_embeddings` (the synthesized matrices' size); a cache
                given to a bidirectional stack (PEFT prefix tuning: synthesized rows have no prefix columns).
        """
        batch_size, q_len, _ = hidden_states.shape
        queries = self._heads(self.q_proj(hidden_states)) if self.q_proj is not None else None
        values = self._heads(self.v_proj(hidden_states))
        keys = self._heads(self.k_proj(hidden_states)) if self.k_proj is not None else None
        if position_embeddings is not None and self.k_proj is not None:
            queries, keys = apply_rotary_pos_emb(queries, keys, *position_embeddings)
        if isinstance(cache, EncoderDecoderCache):
            cache = cache.self_attention_cache
        past_length = None  # tokens cached before this call, for the query positions (see `token_positions`)
        if cache is not None:
            if not self.is_causal:
                raise ValueError(
                    "a synthesizer in a bidirectional stack got a cache (PEFT prefix tuning?): its "
                    "synthesized rows have no columns for prefix keys"
                )
            past_length = cache.get_seq_length(self.layer_idx)
            past_length = past_length.clone() if isinstance(past_length, torch.Tensor) else past_length
            if keys is not None:
                keys, values = cache.update(keys, values, self.layer_idx)
            else:  # no keys: the values take the cache's key slot (whose length is the cache's length)
                values, _ = cache.update(values, values[..., :0], self.layer_idx)
        kv_len = values.shape[2]
        if kv_len > self.max_length:
            raise ValueError(
                f"sequence of {kv_len} tokens is longer than max_position_embeddings={self.max_length}, the size "
                f"of the synthesizer's {self.max_length} x {self.max_length} attention matrices"
            )
        query_positions = token_positions(q_len, kv_len, hidden_states.device, past_length)[0]
        logits = self.synthesis(queries, query_positions, kv_len).float()
        if self.mixing != "none":
            dot = torch.matmul(queries, keys.transpose(2, 3)).float() * self.scaling  # (batch, heads, q, kv)
            if self.mixing_logit is not None:
                alpha = torch.sigmoid(self.mixing_logit.float())
                logits, dot = alpha * logits, (1 - alpha) * dot
            logits = logits + dot
        if self.relative_attention_bias is not None:
            position_bias = self.relative_attention_bias(
                *token_positions(q_len, kv_len, hidden_states.device, past_length)
            )
        if position_bias is not None:
            logits = logits + position_bias.float()
        mask = additive_attention_mask(
            attention_mask, q_len, kv_len, self.is_causal, logits.dtype, logits.device, past_length
        )
        if mask is not None:
            logits = logits + mask
        # (batch or 1, heads, q_len, kv_len): random logits with no mask are the same for every sequence
        weights = F.softmax(logits, dim=-1).to(values.dtype).expand(batch_size, -1, -1, -1)
        weights = F.dropout(weights, p=self.config.attention_probs_dropout_prob, training=self.training)
        output = torch.matmul(weights, values).transpose(1, 2).reshape(batch_size, q_len, -1)
        return self.o_proj(output), weights

    @staticmethod
    def flops_per_token(config, layer_idx: int, is_causal: bool) -> tuple[int, int]:
        """Training-FLOP terms for `hfzoo.models.flops`: `(weights per token, FLOPs per (query, key) pair)`.

        Weights: the q (dense synthesis or a mixture), k (mixtures), v and o projections. Per pair: the
        weighted values (6 per head dimension, as attention), the dot products of the mixtures, and the
        synthesis's own (`flops_per_pair` of its `SYNTHESIZERS` class).
        """
        heads, head_dim = synthesizer_shape(config)
        synthesis = SYNTHESIZERS[config.synthesizer_type]
        mixture = config.synthesizer_mixing != "none"
        projections = 2 + (synthesis.uses_queries or mixture) + mixture
        per_pair = 6 * heads * head_dim * (1 + mixture) + synthesis.flops_per_pair(config, heads, head_dim)
        return projections * config.hidden_size * heads * head_dim, per_pair


def check_synthesizer_config(config) -> None:
    """Refuse bad synthesizer fields (the `check_config` of the `synthesizer` entry of `TOKEN_MIXERS`).

    Raises:
        ValueError: `synthesizer_type` / `synthesizer_mixing` not in `SYNTHESIZERS` / `SYNTHESIZER_MIXINGS`;
            a non-positive head count, head size or factorized rank; a position scheme the synthesizer cannot
            apply: Shaw's relative representations (not implemented here), rotary without dot products (no
            mixture) or with a head size other than `head_dim`, a score bias with a head count other than
            `num_attention_heads`. Each message names the field and what is allowed.
    """
    if config.synthesizer_type not in SYNTHESIZERS:
        raise ValueError(
            f"synthesizer_type={config.synthesizer_type!r} is not supported; "
            f"{choice_hint(config.synthesizer_type, SYNTHESIZERS)}"
        )
    if config.synthesizer_mixing not in SYNTHESIZER_MIXINGS:
        raise ValueError(
            f"synthesizer_mixing={config.synthesizer_mixing!r} is not supported; "
            f"{choice_hint(config.synthesizer_mixing, SYNTHESIZER_MIXINGS)}"
        )
    for name in ("synthesizer_num_heads", "synthesizer_head_dim"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be None or a positive integer, got {value!r}")
    rank = config.synthesizer_factorized_rank
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"synthesizer_factorized_rank must be a positive integer, got {rank!r}")
    heads, head_dim = synthesizer_shape(config)
    kind = config.position_embedding_type
    if kind == "shaw":
        raise ValueError(
            "position_embedding_type='shaw' is not supported by token_mixer='synthesizer'; use "
            "'relative_attention_bias', 'alibi', 'rotary' (with a mixture) or an absolute scheme"
        )
    if kind in ROTARY_POSITION_EMBEDDINGS and (config.synthesizer_mixing == "none" or head_dim != config.head_dim):
        raise ValueError(
            f"position_embedding_type={kind!r} rotates queries and keys, which token_mixer='synthesizer' has only "
            f"with synthesizer_mixing='plus' / 'plus_alpha' and synthesizer_head_dim equal to head_dim="
            f"{config.head_dim} (got synthesizer_mixing={config.synthesizer_mixing!r}, head size {head_dim})"
        )
    if kind in ATTENTION_SCORE_BIASES and heads != config.num_attention_heads:
        raise ValueError(
            f"position_embedding_type={kind!r} gives num_attention_heads={config.num_attention_heads} score biases, "
            f"but the synthesizer has synthesizer_num_heads={heads}; use another position scheme or equal heads"
        )


# `config.synthesizer_type`: how the logits B are synthesized (Tay et al. 2020 §3).
SYNTHESIZERS = {
    "dense": DenseSynthesis,  # §3.1
    "random": RandomSynthesis,  # §3.2
    "factorized_random": FactorizedRandomSynthesis,  # §3.3
}

# `config.synthesizer_mixing`: how B combines with dot-product attention (Tay et al. 2020 §3.4; Narang et al.'s
# "plus" and "plus alpha").
SYNTHESIZER_MIXINGS = {
    "none": "softmax(B)",
    "plus": "softmax(B + Q K^T)",
    "plus_alpha": "softmax(sigmoid(a) B + (1 - sigmoid(a)) Q K^T), a learned, initialised to 0",
}

#: The config fields only the synthesizer reads (its entry's `config_fields`).
SYNTHESIZER_FIELDS = (
    "synthesizer_type",
    "synthesizer_mixing",
    "synthesizer_num_heads",
    "synthesizer_head_dim",
    "synthesizer_factorized_rank",
)
