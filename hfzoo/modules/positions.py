"""Position information, selected by `config.position_embedding_type`.

Each scheme hooks in at one of three points (registries at the bottom of this file):

- the embeddings (`ABSOLUTE_POSITION_EMBEDDINGS`: `learned`, `sinusoidal`), added to the token embeddings
  by the stack;
- the queries and keys (`ROTARY_POSITION_EMBEDDINGS`: `rotary`), rotated in `HfzooAttention` before the
  KV cache stores the keys;
- the attention scores: `ATTENTION_SCORE_BIASES` (`relative_attention_bias`, `alibi`) give an additive
  `(1, num_heads, q_len, kv_len)` bias that any backend taking an additive mask can use (eager, SDPA), or,
  for FlexAttention (`flex_attention`), a `RelativeScoreBias`: the same bias as a function of the relative
  position (T5's table clipped at its max distance, ALiBi's slopes) added by a `score_mod`, so no
  `(q_len, kv_len)` bias is materialized (`score_bias` picks the form from the backend);
  `RELATIVE_POSITION_REPRESENTATIONS` (`shaw`) also add position vectors to the values, which needs the
  attention probabilities, so it runs in hfzoo's eager attention only.

`POSITION_EMBEDDING_TYPES` lists every accepted value and `POSITION_ATTENTION_BACKENDS` the attention
backends each supports. Relative schemes measure distances in token indices (`past_len + i` for query
`i`, `j` for key `j`), as T5 does, so they need no `position_ids` and are invariant to padding on
either side; rotary reads `position_ids`, as Llama does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from .embeddings import out_of_range_id


class LearnedPositionalEmbedding(nn.Embedding):
    """Learned absolute position embeddings (Vaswani et al. 2017 §3.5; GPT-2's `wpe`, BERT's `position_embeddings`).

    A `(max_position_embeddings, hidden_size)` table indexed by position.

    Shapes:
        `position_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)`.

    Raises:
        IndexError: (from `nn.Embedding`) a position >= `max_position_embeddings`; the stack checks given
            `position_ids` first (`check_position_ids`).
    """

    def __init__(self, config) -> None:
        super().__init__(config.max_position_embeddings, config.hidden_size)

    def check_position_ids(self, position_ids: torch.Tensor) -> None:
        """Refuse position ids outside `[0, max_position_embeddings)` (eager mode: `out_of_range_id`).

        Args:
            position_ids: `(batch_size or 1, seq_len)` int64 positions given by the caller (the stack's default
                positions are bounded by its length check, so they cost no host sync here).

        Raises:
            ValueError: naming the position.
        """
        bad = out_of_range_id(position_ids, self.num_embeddings)
        if bad is not None:
            raise ValueError(
                f"position id {bad} is outside [0, max_position_embeddings={self.num_embeddings}): learned "
                f"positions have one embedding per position from 0"
            )


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal position encodings (Vaswani et al. 2017, §3.5).

    `PE(pos, 2i) = sin(pos / 10000^(2i / d))`, `PE(pos, 2i + 1) = cos(pos / 10000^(2i / d))` with
    `d = hidden_size`, computed on the fly in float32: no parameters and no buffers, so nothing to
    save, load, initialise or partition (DeepSpeed ZeRO-3).

    Shapes:
        `position_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)` float32.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Encode `position_ids` `(batch_size, seq_len)` as `(batch_size, seq_len, hidden_size)` sinusoids."""
        half = (self.hidden_size + 1) // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) * 2 / self.hidden_size
        angles = position_ids.float()[..., None] / (10000.0**exponent)  # (batch, seq, half)
        # Interleave sin (even features) and cos (odd features), then drop the extra one for odd sizes.
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., : self.hidden_size]


def token_positions(
    q_len: int, kv_len: int, device: torch.device, past_length: int | torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices of the queries and keys.

    The queries are the `q_len` tokens after the `past_length` cached ones; without `past_length`, the last
    `q_len` of the `kv_len` keys (a dynamic cache, whose keys are exactly the tokens so far). A static cache
    hands every layer all of its `max_cache_len` slots as keys (the empty ones masked), so its queries do not
    end at `kv_len`: give its length before the update as `past_length`.

    Args:
        q_len: number of queries (new tokens).
        kv_len: number of keys (cached + new tokens, or a static cache's slots).
        device: device of the result.
        past_length: tokens in the cache before this call: an int, or a static cache's 0-d length tensor
            (an offset, so the positions stay tensors under `torch.compile`); None: `kv_len - q_len`.

    Returns:
        `(query_positions, key_positions)`: int64 `(q_len,)` = `past_length, ..., past_length + q_len - 1` and
        `(kv_len,)` = `0, ..., kv_len - 1`.
    """
    key_positions = torch.arange(kv_len, device=device)
    if past_length is None:
        return key_positions[kv_len - q_len :], key_positions
    return torch.arange(q_len, device=device) + past_length, key_positions


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings, RoPE (Su et al. 2021, "RoFormer", §3.4.2, eq. 34), on the full head_dim.

    Feature pairs `(i, i + head_dim / 2)` of each query and key are rotated by the angle
    `position * rope_theta^(-2i / head_dim)` (the "rotate half" layout of GPT-NeoX and Llama), so the
    score `q_m . k_n` depends on the positions only through `m - n`. Computed on the fly in float32:
    no parameters and no buffers. Reads `head_dim` and `rope_theta`.

    Shapes:
        `position_ids` `(batch_size or 1, seq_len)` int64 -> `(cos, sin)`, each
        `(batch_size or 1, seq_len, head_dim)` float32.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = float(config.rope_theta)

    @staticmethod
    def check_config(config) -> None:
        """Refuse an odd `head_dim` (rotary turns feature pairs).

        Raises:
            ValueError: naming `head_dim` and its value.
        """
        if config.head_dim % 2:
            raise ValueError(
                f"position_embedding_type={config.position_embedding_type!r} needs an even head_dim (it rotates "
                f"feature pairs), got head_dim={config.head_dim}"
            )

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosines and sines of the rotation angles for `position_ids` `(batch_size or 1, seq_len)`."""
        exponent = torch.arange(0, self.head_dim, 2, device=position_ids.device, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponent)  # (head_dim / 2,)
        angles = position_ids.float()[..., None] * inv_freq  # (batch, seq, head_dim / 2)
        angles = torch.cat([angles, angles], dim=-1)  # (batch, seq, head_dim)
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`[x1, x2] -> [-x2, x1]` on the last dimension (split in halves): a 90-degree turn of each feature pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by the angles of `RotaryEmbedding` (Su et al. 2021, eq. 34).

    Args:
        query: `(batch_size, num_heads, seq_len, head_dim)`.
        key: `(batch_size, num_heads, seq_len, head_dim)` (the new keys only; cached keys are already rotated).
        cos: `(batch_size or 1, seq_len, head_dim)`.
        sin: `(batch_size or 1, seq_len, head_dim)`.

    Returns:
        The rotated `(query, key)`, same shapes and dtypes as the inputs.
    """
    cos, sin = cos.unsqueeze(1).to(query.dtype), sin.unsqueeze(1).to(query.dtype)  # broadcast over heads
    return query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucket of a relative position `key_position - query_position` (Raffel et al. 2020, §2.1).

    Half the buckets (per direction when `bidirectional`) hold the exact distances `0 .. max_exact - 1`
    (`max_exact = buckets / 2`); the others cover distances up to `max_distance` in logarithmically
    growing ranges, and all larger distances share the last bucket. A causal stack
    (`bidirectional=False`) only sees keys at or before the query and maps later ones to bucket 0.

    Args:
        relative_position: int64 `(...)` = key position - query position.
        bidirectional: separate buckets for keys before and after the query (encoder).
        num_buckets: number of buckets (`relative_attention_num_buckets`).
        max_distance: distance from which all positions share one bucket (`relative_attention_max_distance`).

    Returns:
        int64 `(...)` bucket ids in `[0, num_buckets)`.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets  # keys after the query
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)  # keys before the query; later keys -> distance 0
    max_exact = num_buckets // 2
    # Logarithmic buckets between max_exact and max_distance (distance 0 would give log(0); `where` drops it).
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class RelativeAttentionBias(nn.Embedding):
    """T5's bucketed relative attention bias (Raffel et al. 2020, §2.1; Shaw et al. 2018 simplified to a scalar).

    A learned scalar per (bucket, head) is added to the attention scores: `score[h, i, j] +=
    weight[bucket(j - i), h]`. One table per stack shared by all its layers
    (`share_relative_attention_bias=True`, T5, Narang et al.'s "relative attention with shared bias")
    or one per layer. The weight is `(relative_attention_num_buckets, num_attention_heads)`, as T5's
    `relative_attention_bias`.

    Args:
        config: an hfzoo config (`relative_attention_num_buckets`, `relative_attention_max_distance`,
            `num_attention_heads`).
        bidirectional: bucket keys after the query separately (encoder) or not (causal stack).

    Shapes:
        `query_positions` `(q_len,)`, `key_positions` `(kv_len,)` int64 -> bias `(1, num_heads, q_len, kv_len)`
        in the weight's dtype.
    """

    def __init__(self, config, bidirectional: bool) -> None:
        super().__init__(config.relative_attention_num_buckets, config.num_attention_heads)
        self.bidirectional = bidirectional
        self.max_distance = config.relative_attention_max_distance

    @staticmethod
    def shared_across_layers(config) -> bool:
        """One table per stack (`share_relative_attention_bias=True`, T5) or one per layer's self-attention."""
        return config.share_relative_attention_bias

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Bias `(1, num_heads, q_len, kv_len)` for queries at `query_positions` and keys at `key_positions`."""
        relative = key_positions[None, :] - query_positions[:, None]  # (q_len, kv_len)
        bucket = relative_position_bucket(relative, self.bidirectional, self.num_embeddings, self.max_distance)
        return super().forward(bucket).permute(2, 0, 1).unsqueeze(0)  # (q, kv, heads) -> (1, heads, q, kv)

    def relative_score_bias(
        self,
        query_offset: int | torch.Tensor = 0,
        query_stride: int = 1,
        key_stride: int = 1,
        device: torch.device | None = None,
    ) -> RelativeScoreBias:
        """The bias as a `RelativeScoreBias` for FlexAttention: this table at `r = -max_distance .. max_distance`.

        Every `|r| >= max_distance` falls in the last bucket of its direction (the config keeps `max_distance`
        above the exact buckets), so the clipped table gives the same numbers as `forward` at every distance.
        Computed by `forward` (one query at position 0), so gradients reach `weight` and ZeRO-3 gathers it.

        Args:
            query_offset: position of query 0 relative to key 0 (int, or 0-d int64 tensor).
            query_stride: positions between consecutive queries.
            key_stride: positions between consecutive keys.
            device: device of the positions (default: the weight's).

        Returns:
            A `RelativeScoreBias` with `table` `(num_heads, 2 * max_distance + 1)` in the weight's dtype.
        """
        device = self.weight.device if device is None else device
        relative = torch.arange(-self.max_distance, self.max_distance + 1, device=device)
        table = self(torch.zeros(1, dtype=torch.long, device=device), relative)[0, :, 0, :].contiguous()
        return RelativeScoreBias(
            table=table,
            max_distance=self.max_distance,
            query_offset=query_offset,
            query_stride=query_stride,
            key_stride=key_stride,
        )

    def extra_repr(self) -> str:
        """Show the table size, direction and maximum distance in `print(model)`."""
        return f"{super().extra_repr()}, bidirectional={self.bidirectional}, max_distance={self.max_distance}"


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's head-specific slopes (Press et al. 2022, §3): the geometric sequence `2^(-8 h / n)`, h = 1..n.

    For a number of heads that is not a power of two, the slopes of the closest smaller power of two
    are followed by every other slope of the next power of two (the authors' reference code).

    Args:
        num_heads: number of attention heads.

    Returns:
        float32 `(num_heads,)`.
    """
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * h / closest) for h in range(1, closest + 1)]
    if closest < num_heads:
        slopes += [2 ** (-8 * h / (2 * closest)) for h in range(1, 2 * closest + 1, 2)][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


class AlibiBias(nn.Module):
    """Attention with linear biases, ALiBi (Press et al. 2022, "Train Short, Test Long", §3).

    `score[h, i, j] += -m_h * |i - j|` with the fixed slopes `m_h` of `alibi_slopes`; no parameters.
    For a causal stack (the paper's setting) only `j <= i` is unmasked, so this is the paper's
    `-m_h * (i - j)`; the symmetric distance extends it to bidirectional stacks (as MosaicBERT does).

    Args:
        config: an hfzoo config (`num_attention_heads`).
        bidirectional: unused (the distance is symmetric); the signature of `ATTENTION_SCORE_BIASES` entries.

    Shapes:
        `query_positions` `(q_len,)`, `key_positions` `(kv_len,)` int64 -> bias `(1, num_heads, q_len, kv_len)`
        float32.
    """

    def __init__(self, config, bidirectional: bool = True) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads

    @staticmethod
    def shared_across_layers(config) -> bool:
        """Always: the bias has no parameters, so the stack computes it once for all its layers."""
        return True

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
        """Bias `(1, num_heads, q_len, kv_len)` for queries at `query_positions` and keys at `key_positions`."""
        distance = (key_positions[None, :] - query_positions[:, None]).abs().float()  # (q_len, kv_len)
        slopes = alibi_slopes(self.num_heads).to(distance.device)
        return -(slopes[:, None, None] * distance).unsqueeze(0)

    def relative_score_bias(
        self,
        query_offset: int | torch.Tensor = 0,
        query_stride: int = 1,
        key_stride: int = 1,
        device: torch.device | None = None,
    ) -> RelativeScoreBias:
        """The bias as a `RelativeScoreBias` for FlexAttention: `score - m_h * |r|` with the slopes `m_h`.

        Args:
            query_offset: position of query 0 relative to key 0 (int, or 0-d int64 tensor).
            query_stride: positions between consecutive queries.
            key_stride: positions between consecutive keys.
            device: device of the slopes (default the CPU).

        Returns:
            A `RelativeScoreBias` with `slopes` float32 `(num_heads,)`.
        """
        return RelativeScoreBias(
            slopes=alibi_slopes(self.num_heads).to(device),
            query_offset=query_offset,
            query_stride=query_stride,
            key_stride=key_stride,
        )


class ShawRelativePositions(nn.Module):
    """Relative position representations (Shaw et al. 2018, §3, eqs. 3-5), with clipped distances.

    Learned vectors `a^K_{ij} = key_embeddings[clip(j - i, -k, k) + k]` and
    `a^V_{ij} = value_embeddings[clip(j - i, -k, k) + k]` of size head_dim, shared across heads (as in
    the paper) and owned by each layer's self-attention, which computes
    `e_ij = q_i . (k_j + a^K_ij) * scaling` and `z_i = sum_j p_ij (v_j + a^V_ij)` (see
    `hfzoo.modules.attention.shaw_attention_forward`). `k = max_relative_positions`.

    Shapes:
        `query_positions` `(q_len,)`, `key_positions` `(kv_len,)` int64 -> `(a_k, a_v)`, each
        `(q_len, kv_len, head_dim)` in the weights' dtype.
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.max_relative_positions = config.max_relative_positions
        self.key_embeddings = nn.Embedding(2 * config.max_relative_positions + 1, config.head_dim)
        self.value_embeddings = nn.Embedding(2 * config.max_relative_positions + 1, config.head_dim)

    def forward(self, query_positions: torch.Tensor, key_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value representations `(q_len, kv_len, head_dim)` of every (query, key) pair."""
        k = self.max_relative_positions
        index = (key_positions[None, :] - query_positions[:, None]).clamp(-k, k) + k  # (q_len, kv_len)
        return self.key_embeddings(index), self.value_embeddings(index)


@dataclass(frozen=True)
class RelativeScoreBias:
    """A score bias that depends on `r = key_position - query_position` only, in a form FlexAttention can add.

    The form the score biases of `ATTENTION_SCORE_BIASES` (T5's bucketed bias, Raffel et al. 2020 §2.1; ALiBi,
    Press et al. 2022 §3) take for FlexAttention (PyTorch's `torch.nn.attention.flex_attention`; "FlexAttention:
    The Flexibility of PyTorch with the Performance of FlashAttention", PyTorch blog, 2024): instead of the
    `(1, num_heads, q_len, kv_len)` tensor the eager and SDPA backends add to the scores, `score_mod` computes
    the bias of each score from the indices FlexAttention gives it,
    ```
    r = kv_idx * key_stride - (q_idx * query_stride + query_offset)
    bias[h](r) = table[h, clamp(r, -max_distance, max_distance) + max_distance] - slopes[h] * |r|
    ```
    (either term may be absent): T5's bias is a table over the relative positions up to its
    `max_distance` (beyond it every distance shares the last bucket, so clipping `r` changes nothing); ALiBi's
    is a slope per head. Both tensors have a size fixed by the config, never by the sequence length. With a
    KV cache, query `i` is at position `past_len + i` (`query_offset = past_len`); a funnel's pooled queries and
    keys are `query_stride` / `key_stride` positions apart.

    Gradients reach `table` through `score_mod` (FlexAttention differentiates the tensors a score_mod
    captures), and from it the learned weight of `RelativeAttentionBias`.

    Args:
        table: `(num_heads, 2 * max_distance + 1)` float, the bias at `r = -max_distance .. max_distance`, or None.
        slopes: `(num_heads,)` float32, the bias per unit of distance (subtracted), or None.
        max_distance: the largest `|r|` `table` holds (0 without a table).
        query_offset: position of query 0 relative to key 0 (int, or a 0-d int64 tensor for a static cache).
        query_stride: positions between consecutive queries.
        key_stride: positions between consecutive keys.

    Raises:
        ValueError: neither `table` nor `slopes` given.
    """

    table: torch.Tensor | None = None
    slopes: torch.Tensor | None = None
    max_distance: int = 0
    query_offset: int | torch.Tensor = 0
    query_stride: int = 1
    key_stride: int = 1

    def __post_init__(self) -> None:
        if self.table is None and self.slopes is None:
            raise ValueError("a RelativeScoreBias needs a table, slopes or both")

    @property
    def num_heads(self) -> int:
        """The number of heads the bias is defined for."""
        return (self.table if self.table is not None else self.slopes).shape[0]

    def score_mod(self, dtype: torch.dtype | None = None):
        """A FlexAttention `score_mod` adding the bias: `(score, batch_idx, head_idx, q_idx, kv_idx) -> score`.

        Args:
            dtype: the dtype `table` is cast to first (the queries' dtype, as eager casts the dense bias), or None.

        Returns:
            A function of FlexAttention's score_mod signature (`score` a scalar tensor, the indices int32 scalar
            tensors) returning `score + bias[head_idx](r)` (see the class docstring).
        """
        table = self.table if self.table is None or dtype is None else self.table.to(dtype)
        slopes, clip = self.slopes, self.max_distance
        # Their sizes come from the config: static for torch.compile, so that no recompilation for a new length
        # makes them symbolic (inductor's CPU FlexAttention kernel mis-names symbolic sizes of captured tensors).
        for captured in (table, slopes):
            if captured is not None and not torch.compiler.is_compiling():  # (marking is refused while tracing)
                torch._dynamo.mark_static(captured)
        query_offset, query_stride, key_stride = self.query_offset, self.query_stride, self.key_stride

        def add_relative_bias(score, batch_idx, head_idx, q_idx, kv_idx):
            relative = kv_idx * key_stride - (q_idx * query_stride + query_offset)
            if table is not None:
                score = score + table[head_idx, relative.clamp(-clip, clip) + clip]
            if slopes is not None:
                score = score - slopes[head_idx] * relative.abs()
            return score

        return add_relative_bias

    def dense(self, q_len: int, kv_len: int) -> torch.Tensor:
        """The same bias as a `(1, num_heads, q_len, kv_len)` tensor (what eager adds; for checks and fallbacks).

        Args:
            q_len: number of queries.
            kv_len: number of keys.

        Returns:
            `(1, num_heads, q_len, kv_len)` float (the table's dtype, float32 for slopes alone).
        """
        device = (self.table if self.table is not None else self.slopes).device
        q_idx = torch.arange(q_len, device=device)[:, None]
        kv_idx = torch.arange(kv_len, device=device)[None, :]
        relative = kv_idx * self.key_stride - (q_idx * self.query_stride + self.query_offset)  # (q_len, kv_len)
        bias = torch.zeros((), device=device)
        if self.table is not None:
            bias = self.table[:, relative.clamp(-self.max_distance, self.max_distance) + self.max_distance]
        if self.slopes is not None:
            bias = bias - self.slopes[:, None, None] * relative.abs()
        return bias.unsqueeze(0)

    def repeat_heads(self, times: int) -> RelativeScoreBias:
        """The bias for `times * num_heads` heads: each tensor repeated along heads (`torch.cat([bias] * times, 1)`)."""
        return dataclasses.replace(
            self,
            table=None if self.table is None else self.table.repeat(times, 1),
            slopes=None if self.slopes is None else self.slopes.repeat(times),
        )


def score_bias(
    bias: nn.Module,
    config,
    q_len: int,
    kv_len: int,
    query_offset: int | torch.Tensor = 0,
    query_stride: int = 1,
    key_stride: int = 1,
    device: torch.device | None = None,
) -> torch.Tensor | RelativeScoreBias:
    """A score-bias module's bias in the form the attention backend of `config` applies.

    Query `i` is at position `query_offset + query_stride * i`, key `j` at `key_stride * j` (the stack's queries
    follow `past_len` cached keys: `query_offset = past_len`). FlexAttention (`config._attn_implementation` in
    `FLEX_SCORE_BIAS_BACKENDS`) adds the bias in a `score_mod` and gets the module's `relative_score_bias`;
    every other backend (eager, SDPA) gets the dense `(1, num_heads, q_len, kv_len)` bias, folded into its
    additive mask. A learned bias comes out of the module's `forward` either way (DeepSpeed ZeRO-3 gathers its
    weight there).

    Args:
        bias: an `ATTENTION_SCORE_BIASES` module.
        config: the model's config (`_attn_implementation`).
        q_len: number of queries.
        kv_len: number of keys (cached keys included).
        query_offset: position of query 0 relative to key 0 (int, or 0-d int64 tensor).
        query_stride: positions between consecutive queries.
        key_stride: positions between consecutive keys.
        device: device of the positions (the queries' device; default the CPU).

    Returns:
        `(1, num_heads, q_len, kv_len)` tensor, or a `RelativeScoreBias` for `flex_attention`.
    """
    if config._attn_implementation in FLEX_SCORE_BIAS_BACKENDS:
        return bias.relative_score_bias(query_offset, query_stride, key_stride, device)
    query_positions = torch.arange(q_len, device=device) * query_stride + query_offset
    key_positions = torch.arange(kv_len, device=device) * key_stride
    return bias(query_positions, key_positions)


def repeat_score_bias_heads(bias: torch.Tensor | RelativeScoreBias | None, times: int):
    """A shared score bias for an attention with `times` as many heads (each head's bias repeated, in order).

    Args:
        bias: `(batch_size or 1, num_heads, q_len, kv_len)`, a `RelativeScoreBias`, or None.
        times: how many copies of the heads.

    Returns:
        `(batch_size or 1, times * num_heads, q_len, kv_len)`, a `RelativeScoreBias` of `times * num_heads`
        heads, or None.
    """
    if bias is None:
        return None
    if isinstance(bias, RelativeScoreBias):
        return bias.repeat_heads(times)
    return torch.cat([bias] * times, dim=1)


def build_position_embedding(config) -> nn.Module | None:
    """Build the absolute position embedding for `config.position_embedding_type`, or None if it adds none.

    Args:
        config: an hfzoo config (validated).

    Returns:
        A module mapping `position_ids` `(batch_size, seq_len)` to `(batch_size, seq_len, hidden_size)`
        (`learned`, `sinusoidal`), or None (`none`, and the schemes that act inside attention).
    """
    factory = ABSOLUTE_POSITION_EMBEDDINGS.get(config.position_embedding_type)
    return factory(config) if factory is not None else None


def build_stack_score_bias(config, bidirectional: bool) -> nn.Module | None:
    """The attention-score bias a stack computes once and hands to every layer's self-attention, or None.

    Whether a scheme's bias is shared by the layers of a stack is the scheme's own decision (the
    `shared_across_layers(config)` of its `ATTENTION_SCORE_BIASES` entry); this is the stack's half.

    Args:
        config: an hfzoo config (validated).
        bidirectional: the stack's self-attention is bidirectional (encoder) rather than causal.

    Returns:
        A module mapping `(query_positions, key_positions)` to a `(1, num_heads, q_len, kv_len)` bias,
        or None (no score bias, or one per layer).
    """
    bias = ATTENTION_SCORE_BIASES.get(config.position_embedding_type)
    if bias is None or not bias.shared_across_layers(config):
        return None
    return bias(config, bidirectional=bidirectional)


def build_layer_score_bias(config, bidirectional: bool) -> nn.Module | None:
    """The attention-score bias one layer's self-attention owns (the per-layer half of `build_stack_score_bias`).

    Args:
        config: an hfzoo config (validated).
        bidirectional: the self-attention is bidirectional rather than causal.

    Returns:
        A module as in `build_stack_score_bias`, or None (no score bias, or one shared by the stack).
    """
    bias = ATTENTION_SCORE_BIASES.get(config.position_embedding_type)
    if bias is None or bias.shared_across_layers(config):
        return None
    return bias(config, bidirectional=bidirectional)


def has_per_layer_score_bias(config) -> bool:
    """Whether each layer owns a score-bias table (so that the layers' parameters differ by design)."""
    bias = ATTENTION_SCORE_BIASES.get(config.position_embedding_type)
    return bias is not None and not bias.shared_across_layers(config)


def check_position_config(config) -> None:
    """Run the selected scheme's own checks of the config (the static `check_config` of its class, if any).

    Args:
        config: an hfzoo config whose `position_embedding_type` is a key of `POSITION_EMBEDDING_TYPES`.

    Raises:
        ValueError: from the scheme's check, naming the field.
    """
    kind = config.position_embedding_type
    for registry in (
        ABSOLUTE_POSITION_EMBEDDINGS,
        ROTARY_POSITION_EMBEDDINGS,
        ATTENTION_SCORE_BIASES,
        RELATIVE_POSITION_REPRESENTATIONS,
    ):
        check = getattr(registry.get(kind), "check_config", None)
        if check is not None:
            check(config)


def build_relative_positions(config) -> nn.Module | None:
    """The relative position representations one layer's self-attention owns (`shaw`), or None.

    Args:
        config: an hfzoo config (validated).

    Returns:
        A module mapping `(query_positions, key_positions)` to `(a_k, a_v)`, or None.
    """
    factory = RELATIVE_POSITION_REPRESENTATIONS.get(config.position_embedding_type)
    return factory(config) if factory is not None else None


# Added to the token embeddings (stack).
ABSOLUTE_POSITION_EMBEDDINGS = {
    "learned": LearnedPositionalEmbedding,
    "sinusoidal": SinusoidalPositionalEmbedding,
}

# Rotate queries and keys (attention, before the KV cache); the stack computes (cos, sin) once.
ROTARY_POSITION_EMBEDDINGS = {
    "rotary": RotaryEmbedding,
}

# Additive attention-score biases: classes `(config, bidirectional) -> module` whose static method
# `shared_across_layers(config)` says whether the stack computes the bias once for all its layers
# (`build_stack_score_bias`) or each layer's self-attention owns one (`build_layer_score_bias`), and whose method
# `relative_score_bias(query_offset, query_stride, key_stride, device)` gives the same bias as a `RelativeScoreBias`
# for FlexAttention's score_mod (`score_bias`): the bias must depend on `key_position - query_position` only.
ATTENTION_SCORE_BIASES = {
    "relative_attention_bias": RelativeAttentionBias,
    "alibi": AlibiBias,
}

# Position vectors added to keys and values inside attention (per layer; eager attention only).
RELATIVE_POSITION_REPRESENTATIONS = {
    "shaw": ShawRelativePositions,
}

# The schemes that act inside attention (queries/keys, scores, values): a token mixer without attention
# cannot apply them (`hfzoo.modules.mixers.TokenMixer.attention_positions`).
ATTENTION_POSITION_EMBEDDING_TYPES = (
    *ROTARY_POSITION_EMBEDDINGS,
    *ATTENTION_SCORE_BIASES,
    *RELATIVE_POSITION_REPRESENTATIONS,
)

POSITION_EMBEDDING_TYPES = ("none", *ABSOLUTE_POSITION_EMBEDDINGS, *ATTENTION_POSITION_EMBEDDING_TYPES)

# The config fields that only one scheme reads: the config refuses a non-default value of them when another
# scheme is selected (a silent no-op otherwise).
POSITION_SCHEME_FIELDS = {
    "relative_attention_bias": (
        "relative_attention_num_buckets",
        "relative_attention_max_distance",
        "share_relative_attention_bias",
    ),
    "shaw": ("max_relative_positions",),
    "rotary": ("rope_theta",),
}

# The backends that take a score bias as a `RelativeScoreBias` (added by a FlexAttention score_mod) rather than
# as a dense tensor in the additive mask (`score_bias`).
FLEX_SCORE_BIAS_BACKENDS = ("flex_attention",)

# The attention backends (`config._attn_implementation`) each scheme supports. Score biases travel in the
# additive float mask (eager, SDPA) or in a FlexAttention score_mod (`RelativeScoreBias`); flash-attention takes
# neither. Shaw's value term needs the attention probabilities, which only the eager path exposes.
_ALL_BACKENDS = ("eager", "sdpa", "flash_attention", "flex_attention")
POSITION_ATTENTION_BACKENDS = {
    "none": _ALL_BACKENDS,
    "learned": _ALL_BACKENDS,
    "sinusoidal": _ALL_BACKENDS,
    "rotary": _ALL_BACKENDS,
    "relative_attention_bias": ("eager", "sdpa", "flex_attention"),
    "alibi": ("eager", "sdpa", "flex_attention"),
    "shaw": ("eager",),
}
