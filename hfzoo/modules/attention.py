"""Multi-head attention through transformers' attention interface.

`HfzooAttention` projects queries, keys and values, updates a transformers `Cache` when one is given,
and calls the backend named by `config._attn_implementation` ("eager", "sdpa", "flash_attention_2",
"flex_attention", ... as registered in `transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS`).
`eager_attention_forward` below is the reference implementation every backend must agree with.

Position schemes that act inside attention (`hfzoo/modules/positions.py`) enter self-attention here:
rotary rotates the new queries and keys before the cache stores the keys; an additive score bias
(T5's relative bias, ALiBi) is folded into the additive mask, so eager and SDPA both apply it, or, with the
`flex_attention` backend, arrives as a `RelativeScoreBias` that `flex_score_bias_attention_forward` adds in
a FlexAttention `score_mod` (no `(q_len, kv_len)` bias tensor); Shaw's relative representations run
`shaw_attention_forward` (eager). Cross-attention uses no positions.

Two switches act on the queries, keys and scores of every `HfzooAttention` (self- and cross-attention):
QK-norm (`config.qk_norm`, `hfzoo.modules.norms.QK_NORMS`) normalises each head's new queries and keys over
`head_dim` right after their projections, so rotary rotates normalised vectors and the cache stores normalised
keys; `config.attn_logit_softcapping` caps the scaled scores `Q K^T * scaling` at `cap * tanh(. / cap)` before
the score bias and the mask are added (`hfzoo.modules.softcapping`; eager, FlexAttention, flash-attention).

Grouped-query attention (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from
Multi-Head Checkpoints"): with `config.num_key_value_heads` below `num_attention_heads`, `k_proj` and `v_proj`
project to `num_key_value_heads` heads, the KV cache stores those heads only, and each key/value head serves
`num_key_value_groups = num_attention_heads // num_key_value_heads` consecutive query heads. The backends get
the key/value heads as they are, as in transformers' Llama: the written-out forwards here repeat them
(transformers' `repeat_kv`), transformers' SDPA / flex / flash backends repeat them or use their native GQA
(they read `module.num_key_value_groups`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.integrations import flex_attention as transformers_flex
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import repeat_kv
from transformers.utils import is_torch_flex_attn_available

from .norms import build_qk_norm
from .positions import (
    FLEX_SCORE_BIAS_BACKENDS,
    RelativeScoreBias,
    apply_rotary_pos_emb,
    build_layer_score_bias,
    build_relative_positions,
    score_bias,
    token_positions,
)
from .softcapping import soft_cap, supports_attention_softcapping

if is_torch_flex_attn_available():
    from torch.nn.attention.flex_attention import BlockMask
else:  # pragma: no cover - torch without FlexAttention (before 2.5)
    BlockMask = None


def _repeat_key_value_heads(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat grouped key/value heads `(batch, num_kv_heads, kv_len, head_dim)` to the query's `num_heads`.

    Key/value head j serves query heads `j * groups ... (j + 1) * groups - 1` (transformers' `repeat_kv`, as Llama).

    Raises:
        ValueError: `num_kv_heads` does not divide the query's `num_heads`.
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads == kv_heads:
        return key, value
    if heads % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads cannot be shared evenly by {heads} query heads")
    return repeat_kv(key, heads // kv_heads), repeat_kv(value, heads // kv_heads)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out (Vaswani et al. 2017, §3.2.1, eq. 1).

    `softmax(soft_cap(Q K^T * scaling) + position_bias + mask) V`, softmax in float32; `soft_cap` is
    `softcap * tanh(. / softcap)` (Gemma 2 §2) with `softcap`, the identity without. Grouped key/value heads
    are repeated to the query heads first (transformers' `repeat_kv`).

    Args:
        module: the calling attention module (for `training`).
        query: `(batch_size, num_heads, q_len, head_dim)`.
        key: `(batch_size, num_kv_heads, kv_len, head_dim)`, `num_kv_heads` dividing `num_heads`.
        value: `(batch_size, num_kv_heads, kv_len, head_dim)`.
        attention_mask: additive float mask broadcastable to `(batch_size, num_heads, q_len, kv_len)`
            (0 where attending, the dtype's minimum where masked), as built by `transformers.masking_utils`
            for the eager backend; or None.
        scaling: multiplier of the scores, usually `head_dim ** -0.5`.
        dropout: dropout probability on the attention weights (applied only in training).
        position_bias: optional additive score bias `(batch_size or 1, num_heads, q_len, kv_len)`.
        softcap: the attention logit cap (`config.attn_logit_softcapping`), or None.
        **kwargs: ignored backend options.

    Returns:
        `(attn_output, attn_weights)`: `(batch_size, q_len, num_heads, head_dim)` and
        `(batch_size, num_heads, q_len, kv_len)`.
    """
    key, value = _repeat_key_value_heads(query, key, value)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, heads, q_len, kv_len)
    scores = soft_cap(scores, softcap)
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (batch, q_len, heads, head_dim)
    return output, weights


def shaw_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    relative_keys: torch.Tensor,
    relative_values: torch.Tensor,
    dropout: float = 0.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with relative position representations (Shaw et al. 2018, §3.1, eqs. 3-5), written out.

    `e_ij = q_i . (k_j + a^K_ij) * scaling + mask_ij`, `p = softmax(e)` (float32),
    `z_i = sum_j p_ij (v_j + a^V_ij)`.

    Args:
        module: the calling attention module (for `training`).
        query: `(batch_size, num_heads, q_len, head_dim)`.
        key: `(batch_size, num_kv_heads, kv_len, head_dim)` (grouped heads are repeated, `repeat_kv`).
        value: `(batch_size, num_kv_heads, kv_len, head_dim)`.
        attention_mask: additive float mask broadcastable to `(batch_size, num_heads, q_len, kv_len)`, or None.
        scaling: multiplier of the scores.
        relative_keys: `a^K`, `(q_len, kv_len, head_dim)`, shared across heads.
        relative_values: `a^V`, `(q_len, kv_len, head_dim)`, shared across heads.
        dropout: dropout probability on the attention weights (applied only in training).
        softcap: the attention logit cap applied to the scaled scores (Gemma 2 §2), or None.

    Returns:
        `(attn_output, attn_weights)`: `(batch_size, q_len, num_heads, head_dim)` and
        `(batch_size, num_heads, q_len, kv_len)`.
    """
    key, value = _repeat_key_value_heads(query, key, value)
    scores = torch.matmul(query, key.transpose(2, 3))  # (batch, heads, q_len, kv_len)
    scores = scores + torch.einsum("bhqd,qkd->bhqk", query, relative_keys.to(query.dtype))
    scores = soft_cap(scores * scaling, softcap)
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value) + torch.einsum("bhqk,qkd->bhqd", weights, relative_values.to(weights.dtype))
    return output.transpose(1, 2).contiguous(), weights  # (batch, q_len, heads, head_dim)


def flex_score_bias_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: BlockMask | torch.Tensor | None,
    scaling: float,
    position_bias: RelativeScoreBias,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention with a relative score bias, on FlexAttention (PyTorch, `flex_attention`).

    `softmax(Q K^T * scaling + bias + mask) V` as `eager_attention_forward` with the dense bias, but the bias is
    added per score by a `score_mod` (`RelativeScoreBias.score_mod`: T5's bucketed bias or ALiBi as functions of
    `kv_idx - q_idx` and the cache length) and the mask is transformers' `BlockMask`, so no `(q_len, kv_len)`
    tensor is built and the fused kernel runs (FlexAttention: PyTorch blog "FlexAttention: The Flexibility of
    PyTorch with the Performance of FlashAttention", 2024; `torch.nn.attention.flex_attention` docs).
    FlexAttention is called through transformers' `compile_friendly_flex_attention` (compiled once, as
    transformers' own flex path; not compiled again inside a compiled model). Gradients flow to the queries,
    keys, values and the bias table. A query whose keys are all masked (a padding row) gets a zero output,
    where eager averages the values: such rows are padding and never read by a real position.

    Args:
        module: the calling attention module (for `training`).
        query: `(batch_size, num_heads, q_len, head_dim)`.
        key: `(batch_size, num_kv_heads, kv_len, head_dim)` (grouped heads are repeated, `repeat_kv`).
        value: `(batch_size, num_kv_heads, kv_len, head_dim)`.
        attention_mask: the `BlockMask` `transformers.masking_utils` builds for `flex_attention`, an additive
            float mask broadcastable to `(batch_size, 1, q_len, kv_len)` (a prepared 4-D mask), or None.
        scaling: multiplier of the scores.
        position_bias: the score bias, `num_heads` heads (`hfzoo.modules.positions.RelativeScoreBias`).
        dropout: must be 0 (FlexAttention has no dropout on the attention weights).
        softcap: the attention logit cap, applied in the `score_mod` to the scaled score before the bias (as
            `eager_attention_forward`), or None.
        **kwargs: `kernel_options` (FlexAttention's); other backend options are ignored.

    Returns:
        `(attn_output, None)`: `(batch_size, q_len, num_heads, head_dim)` in the queries' dtype; FlexAttention
        returns no attention probabilities.

    Raises:
        ValueError: `dropout > 0`; a bias whose number of heads is not the queries'.
        NotImplementedError: (from PyTorch 2.13) a backward pass on the CPU: FlexAttention's CPU path is
            forward-only, so train on CUDA or use eager / SDPA on the CPU.
    """
    if dropout > 0:
        raise ValueError(
            "flex_attention has no attention dropout: set attention_probs_dropout_prob=0, run in eval mode, or use "
            "attn_implementation='sdpa' / 'eager'"
        )
    if position_bias.num_heads != query.shape[1]:
        raise ValueError(f"a score bias of {position_bias.num_heads} heads for {query.shape[1]} attention heads")
    key, value = _repeat_key_value_heads(query, key, value)
    block_mask = attention_mask if isinstance(attention_mask, BlockMask) else None
    bias_mod = position_bias.score_mod(query.dtype)
    if softcap is not None:
        relative_mod = bias_mod

        def bias_mod(score, batch_idx, head_idx, q_idx, kv_idx):
            return relative_mod(soft_cap(score, softcap), batch_idx, head_idx, q_idx, kv_idx)

    score_mod = bias_mod
    if attention_mask is not None and block_mask is None:  # a prepared additive mask: added per score as well
        additive = attention_mask[..., : key.shape[-2]]
        if additive.dtype == torch.bool:  # True = attend
            minimum = torch.finfo(query.dtype).min
            additive = torch.zeros_like(additive, dtype=query.dtype).masked_fill(~additive, minimum)
        additive = additive.to(query.dtype)

        def score_mod(score, batch_idx, head_idx, q_idx, kv_idx):
            row = batch_idx if additive.shape[0] > 1 else 0
            return bias_mod(score, batch_idx, head_idx, q_idx, kv_idx) + additive[row, 0, q_idx, kv_idx]

    output = transformers_flex.compile_friendly_flex_attention(
        query,
        key,
        value,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scaling,
        kernel_options=kwargs.get("kernel_options"),
        training=module.training,
    )
    return output.transpose(1, 2).contiguous(), None  # (batch, q_len, heads, head_dim)


def add_bias_to_mask(
    attention_mask: torch.Tensor | None, position_bias: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Fold an additive score bias into the attention mask, giving one additive float mask.

    Backends that take an additive float mask (eager, SDPA's `attn_mask`) then apply the bias. Masked
    positions keep the dtype's minimum (the bias is added to it, which leaves it at the minimum).

    Args:
        attention_mask: a boolean mask (True = attend, SDPA's format), an additive float mask (eager's
            format), each broadcastable to `(batch_size, 1, q_len, kv_len)`, or None (attend everywhere).
        position_bias: `(batch_size or 1, num_heads, q_len, kv_len)`.
        dtype: dtype of the result (the queries' dtype: SDPA requires the mask to match it).

    Returns:
        `(batch_size or 1, num_heads, q_len, kv_len)` additive mask of `dtype`.
    """
    bias = position_bias.to(dtype)
    if attention_mask is None:
        return bias
    kv_len = bias.shape[-1]
    attention_mask = attention_mask[..., :kv_len]
    if attention_mask.dtype == torch.bool:
        return bias.masked_fill(~attention_mask, torch.finfo(dtype).min)
    return (bias + attention_mask.to(dtype)).clamp(min=torch.finfo(dtype).min)


def _linear_holding(weight: torch.Tensor, bias: torch.Tensor | None, requires_grad: bool) -> nn.Linear:
    """A new `nn.Linear` whose parameters are copies of `weight` `(out, in)` and `bias` `(out,)` (or no bias)."""
    linear = nn.Linear(
        weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear.requires_grad_(requires_grad)


def has_fused_qkv_projections(model: nn.Module) -> bool:
    """Whether any `HfzooAttention` of `model` holds a fused `qkv_proj` (`HfzooAttention.fuse_qkv_projections`)."""
    return any(isinstance(m, HfzooAttention) and m.qkv_proj is not None for m in model.modules())


def key_value_heads(config) -> int:
    """`config.num_key_value_heads` (grouped-query attention), or `num_attention_heads` where a config has none."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


class HfzooAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2) with a pluggable backend and KV cache.

    Self-attention, or cross-attention to encoder outputs when `is_cross_attention`. Reads
    `hidden_size`, `num_attention_heads`, `num_key_value_heads` (grouped-query attention: `k_proj` and `v_proj`
    project to that many heads, each shared by `num_attention_heads // num_key_value_heads` query heads; the
    cache stores them), `head_dim` (T5's d_kv; defaults to
    `hidden_size // num_attention_heads`), `attention_bias`, `attention_probs_dropout_prob`,
    `scale_attention_scores` (scores times `head_dim ** -0.5`, or unscaled as T5) and
    `position_embedding_type`: self-attention owns a `relative_attention_bias` (a score bias the scheme
    keeps per layer, e.g. T5's with `share_relative_attention_bias=False`) or `relative_positions` (Shaw).
    With `qk_norm` it owns `q_norm` and `k_norm` (QK-norm over `head_dim`, `hfzoo.modules.norms.QK_NORMS`);
    `attn_logit_softcapping` caps its scores (`hfzoo.modules.softcapping`).
    The projections are named `q_proj`, `k_proj`, `v_proj`, `o_proj` (PEFT's usual `target_modules`). For
    inference, `fuse_qkv_projections` replaces the first three by one `qkv_proj` (one matrix product instead of
    three per token: what a compiled decoding step with CUDA graphs still pays per kernel); `unfuse_qkv_projections`
    restores them.

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer, used to address the `Cache`.
        is_causal: whether the attention is causal (decoder self-attention); the mask itself comes
            from the model, this flag lets SDPA/flash backends use their causal kernels when no mask
            is needed.
        is_cross_attention: keys/values come from `key_value_states` (encoder outputs).

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> `(batch_size, q_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool, is_cross_attention: bool = False) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal and not is_cross_attention
        self.is_cross_attention = is_cross_attention
        # read at every forward: a plain attribute, not a config lookup (a guard under torch.compile, each call)
        self.attn_logit_softcapping = getattr(config, "attn_logit_softcapping", None)
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = key_value_heads(config)
        # read by transformers' SDPA / flex backends (repeat_kv or their native GQA), as Llama's attention
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.head_dim = config.head_dim
        # Without scaling (T5), the 1/sqrt(head_dim) is folded into q_proj's initialisation (see HfzooPreTrainedModel).
        self.scaling = self.head_dim**-0.5 if config.scale_attention_scores else 1.0
        inner = self.num_heads * self.head_dim
        kv_inner = self.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_inner, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_inner, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)
        self.qkv_proj = None  # q_proj, k_proj and v_proj stacked, after `fuse_qkv_projections`
        if not config.scale_attention_scores:
            self.q_proj.init_std_scale = self.head_dim**-0.5  # read by HfzooPreTrainedModel._init_weights
        # QK-norm (config.qk_norm): one norm over head_dim for the queries, one for the keys, shared by the heads.
        self.q_norm, self.k_norm = build_qk_norm(config), build_qk_norm(config)
        # Per-layer position modules of self-attention (shared ones live on the stack and arrive as arguments);
        # which ones a layer owns is decided in `hfzoo.modules.positions`.
        self.relative_attention_bias = self.relative_positions = None
        if not is_cross_attention:
            self.relative_attention_bias = build_layer_score_bias(config, bidirectional=not is_causal)
            self.relative_positions = build_relative_positions(config)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([v_proj], [o_proj])`: the value path and output DeepNorm / Fixup initialise (`hfzoo.modules.layer`)."""
        return [self.v_proj], [self.o_proj]

    def restrict_attention_mask(
        self,
        attention_mask: torch.Tensor | None,
        query: torch.Tensor,
        key: torch.Tensor,
        padding_mask: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """This layer's self-attention mask: the stack's, unchanged (a subclass with a per-layer pattern restricts it).

        Args:
            attention_mask: the stack's backend-specific mask (see `forward`).
            query: `(batch_size, num_heads, q_len, head_dim)`.
            key: `(batch_size, num_heads, kv_len, head_dim)` (cached keys included).
            padding_mask: `(batch_size, q_len)` bool, False at padding, or None.

        Returns:
            The mask handed to the attention backend (here `attention_mask` itself).
        """
        return attention_mask

    @staticmethod
    def mixer_weights(config) -> int:
        """Matrix-product weights one token passes through in a self-attention sublayer: q, k, v, o.

        `2 (num_attention_heads + num_key_value_heads) head_dim hidden_size` (q and o at the query heads, k and v
        at the key/value heads). Read by `hfzoo.models.flops` (each weight costs 6 training FLOPs per token).
        """
        heads = config.num_attention_heads + key_value_heads(config)
        return 2 * config.hidden_size * heads * config.head_dim

    @staticmethod
    def attention_pairs(config, seq_len: int) -> int:
        """(query, key) pairs whose scores a self-attention sublayer computes over `seq_len` tokens: `seq_len ** 2`.

        Read by `hfzoo.models.flops` (12 d_attn training FLOPs per pair; causal masking not discounted, as PaLM).
        """
        return seq_len * seq_len

    @staticmethod
    def _qk_norm(norm: nn.Module | None, states: torch.Tensor) -> torch.Tensor:
        """QK-norm of queries or keys `(batch_size, num_heads, seq_len, head_dim)` over `head_dim` (None: unchanged)."""
        return states if norm is None else norm(states)

    def _qkv_sizes(self) -> list[int]:
        """Output features of the query, key and value projections: the row blocks of `qkv_proj`."""
        kv_inner = self.num_key_value_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv_inner, kv_inner]

    def _projection(self, index: int, states: torch.Tensor) -> torch.Tensor:
        """Query (0), key (1) or value (2) projection of `states` `(..., hidden_size)`, fused or not."""
        if self.qkv_proj is None:
            return (self.q_proj, self.k_proj, self.v_proj)[index](states)
        start = sum(self._qkv_sizes()[:index])
        rows = slice(start, start + self._qkv_sizes()[index])
        bias = None if self.qkv_proj.bias is None else self.qkv_proj.bias[rows]
        return nn.functional.linear(states, self.qkv_proj.weight[rows], bias)

    def _heads(self, projected: torch.Tensor, num_heads: int) -> torch.Tensor:
        """`(batch_size, seq_len, num_heads * head_dim)` -> `(batch_size, num_heads, seq_len, head_dim)`."""
        return projected.view(*projected.shape[:-1], num_heads, self.head_dim).transpose(1, 2)

    def _project_query(self, states: torch.Tensor) -> torch.Tensor:
        """Queries of `states` `(batch_size, q_len, hidden_size)`: `(batch_size, num_heads, q_len, head_dim)`."""
        return self._heads(self._projection(0, states), self.num_heads)

    def _project_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # (batch, kv_len, hidden) -> (batch, kv_heads, kv_len, head_dim)
        key, value = self._projection(1, states), self._projection(2, states)
        return self._heads(key, self.num_key_value_heads), self._heads(value, self.num_key_value_heads)

    def _project_query_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of self-attention over `states` (`_project_query`, `_project_key_value`).

        One matrix product after `fuse_qkv_projections`, three before.
        """
        if self.qkv_proj is None:
            return self._project_query(states), *self._project_key_value(states)
        query, key, value = self.qkv_proj(states).split(self._qkv_sizes(), dim=-1)
        kv_heads = self.num_key_value_heads
        return self._heads(query, self.num_heads), self._heads(key, kv_heads), self._heads(value, kv_heads)

    def fuse_qkv_projections(self) -> bool:
        """Replace `q_proj`, `k_proj` and `v_proj` by one `nn.Linear` `qkv_proj` holding their rows, for inference.

        `qkv_proj.weight` is `(num_heads + 2 num_key_value_heads) head_dim x hidden_size` (queries, keys, values
        stacked, as GPT-2's `c_attn` transposed); the outputs are those of the three projections (up to the
        rounding of one matrix product instead of three). The parameters are new tensors with the same values,
        dtype, device and `requires_grad`: an optimizer made before does not see them. Cross-attention keeps its
        projections (its keys and values come from other states). Undone by `unfuse_qkv_projections`;
        `HfzooPreTrainedModel.save_pretrained` refuses a fused model.

        Returns:
            True when fused now; False for cross-attention or a module already fused.

        Raises:
            ValueError: a projection that is not a plain `nn.Linear` (e.g. wrapped by a PEFT adapter).
        """
        if self.qkv_proj is not None or self.is_cross_attention:
            return False
        projections = (self.q_proj, self.k_proj, self.v_proj)
        wrapped = [f"{type(p).__module__}.{type(p).__qualname__}" for p in projections if type(p) is not nn.Linear]
        if wrapped:
            raise ValueError(
                f"cannot fuse the query, key and value projections of layer {self.layer_idx}: they must be plain "
                f"nn.Linear, got {wrapped} (merge or remove adapters first, e.g. PEFT's merge_and_unload())"
            )
        weight = torch.cat([p.weight.detach() for p in projections])
        bias = None if self.q_proj.bias is None else torch.cat([p.bias.detach() for p in projections])
        fused = _linear_holding(weight, bias, self.q_proj.weight.requires_grad)
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj = fused
        self._move_modules_first(["qkv_proj"])
        return True

    def _move_modules_first(self, names: list[str]) -> None:
        """Put the submodules `names` first, in that order (where the projections were: `state_dict` order)."""
        modules = dict(self._modules)
        self._modules.clear()
        self._modules.update({name: modules.pop(name) for name in names})
        self._modules.update(modules)

    def unfuse_qkv_projections(self) -> bool:
        """Undo `fuse_qkv_projections`: `q_proj`, `k_proj` and `v_proj` again, with `qkv_proj`'s rows.

        Returns:
            True when unfused now; False when the module was not fused.
        """
        if self.qkv_proj is None:
            return False
        fused = self.qkv_proj
        weights = fused.weight.detach().split(self._qkv_sizes())
        biases = (None,) * 3 if fused.bias is None else fused.bias.detach().split(self._qkv_sizes())
        for name, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
            setattr(self, name, _linear_holding(weight, bias, fused.weight.requires_grad))
        if not self.config.scale_attention_scores:
            self.q_proj.init_std_scale = self.head_dim**-0.5
        del self.qkv_proj
        self.qkv_proj = None
        self._move_modules_first(["q_proj", "k_proj", "v_proj"])
        return True

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        key_value_states: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | RelativeScoreBias | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` to itself (plus cached keys/values) or to `key_value_states`.

        `o_proj` of the heads' outputs (`attend`), concatenated.

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: see `attend`.
            cache: see `attend`.
            key_value_states: see `attend`.
            position_embeddings: see `attend`.
            position_bias: see `attend`.
            padding_mask: see `attend`.
            **kwargs: forwarded to the attention backend.

        Returns:
            `(attn_output, attn_weights)`: `(batch_size, q_len, hidden_size)` and the attention
            probabilities `(batch_size, num_heads, q_len, kv_len)` (None for fused backends).

        Raises:
            ValueError: as `attend`.
        """
        output, weights = self.attend(
            hidden_states,
            attention_mask=attention_mask,
            cache=cache,
            key_value_states=key_value_states,
            position_embeddings=position_embeddings,
            position_bias=position_bias,
            padding_mask=padding_mask,
            **kwargs,
        )
        output = output.reshape(*output.shape[:2], -1).contiguous()  # (batch, q_len, heads * head_dim)
        return self.o_proj(output), weights

    def attend(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        key_value_states: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_bias: torch.Tensor | RelativeScoreBias | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The heads' outputs before the output projection `o_proj` (Vaswani et al. 2017, §3.2.2).

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: the backend-specific mask from `transformers.masking_utils` (None when the
                backend can rely on `is_causal` alone).
            cache: a transformers `Cache`, updated in place. For an `EncoderDecoderCache`,
                self-attention uses its `self_attention_cache`; cross-attention stores the encoder's
                keys/values in its `cross_attention_cache` once and reuses them at later steps.
            key_value_states: `(batch_size, kv_len, hidden_size)` encoder outputs (cross-attention); in
                self-attention, the states keys and values come from when the queries `hidden_states` are a
                pooled copy of them (the Funnel Transformer's pool-query-only attention, Dai et al. 2020
                §2.2; no cache, and the score bias given as `position_bias`), else None.
            position_embeddings: rotary `(cos, sin)`, each `(batch_size or 1, q_len, head_dim)`, from the
                stack's `RotaryEmbedding` (self-attention only; ignored by cross-attention).
            position_bias: additive score bias `(batch_size or 1, num_heads, q_len, kv_len)` shared by the
                stack's layers (T5 shared bias, ALiBi; ignored by cross-attention), or, with `flex_attention`,
                the same bias as a `hfzoo.modules.positions.RelativeScoreBias` (`score_bias` picks the form).
            padding_mask: `(batch_size, q_len)` bool, False at padding, or None; the stack's `attention_mask`
                already masks padding, so only `restrict_attention_mask` reads it (a subclass's pattern).
            **kwargs: forwarded to the attention backend, except `value_residual`: a callable mapping this
                self-attention's new values `(batch_size, num_heads, q_len, head_dim)` to the values it uses
                (`hfzoo.modules.connections.ValueResidual`; ignored by cross-attention).

        Returns:
            `(head_outputs, attn_weights)`: `(batch_size, q_len, num_heads, head_dim)` and the attention
            probabilities `(batch_size, num_heads, q_len, kv_len)` (None for fused backends).

        Raises:
            ValueError: a cross-attention module called without `key_value_states`; self-attention given
                both `key_value_states` and a cache; a dense `position_bias` tensor with `flex_attention`;
                attention dropout with a score bias on `flex_attention` (`flex_score_bias_attention_forward`);
                `attn_logit_softcapping` with a backend that cannot apply it (SDPA; `hfzoo.modules.softcapping`).
        """
        # ResFormer (Zhou et al. 2024): mixes the stack's first values into self-attention's (connections.py)
        value_residual = kwargs.pop("value_residual", None)
        q_len = hidden_states.shape[1]
        past_length = None  # tokens cached before this call (self-attention with a cache), for the query positions
        key = value = None  # self-attention over `hidden_states`: projected with the queries (one product when fused)
        if self.is_cross_attention or key_value_states is not None:
            query = self._project_query(hidden_states)  # (batch, q_len, hidden) -> (batch, heads, q_len, head_dim)
        else:
            query, key, value = self._project_query_key_value(hidden_states)
        query = self._qk_norm(self.q_norm, query)
        if self.is_cross_attention:
            if key_value_states is None:
                raise ValueError("cross-attention needs key_value_states (the encoder outputs)")
            cross_cache = cache.cross_attention_cache if isinstance(cache, EncoderDecoderCache) else None
            if cross_cache is not None and cache.is_updated.get(self.layer_idx):
                key, value = cross_cache.layers[self.layer_idx].keys, cross_cache.layers[self.layer_idx].values
            else:
                key, value = self._project_key_value(key_value_states)
                key = self._qk_norm(self.k_norm, key)  # the cross cache stores normalised keys
                if cross_cache is not None:
                    key, value = cross_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        elif key_value_states is not None:  # pooled queries attend to the unpooled states (funnel)
            if cache is not None:
                raise ValueError("self-attention from pooled queries (key_value_states) takes no cache")
            key, value = self._project_key_value(key_value_states)
            key = self._qk_norm(self.k_norm, key)
        else:
            if value_residual is not None:  # before the cache stores them: the cache holds the mixed values
                value = value_residual(value)
            key = self._qk_norm(self.k_norm, key)  # before rotary and the cache: the cache stores normalised keys
            if position_embeddings is not None:
                query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
            self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
            if self_cache is not None:
                # Before the update: a static cache's length is a tensor the update increments in place.
                past_length = self_cache.get_seq_length(self.layer_idx)
                past_length = past_length.clone() if isinstance(past_length, torch.Tensor) else past_length
                key, value = self_cache.update(key, value, self.layer_idx)
            attention_mask = self.restrict_attention_mask(attention_mask, query, key, padding_mask)
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        softcap = self.attn_logit_softcapping
        if softcap is not None and not supports_attention_softcapping(self.config._attn_implementation):
            raise ValueError(
                f"attn_logit_softcapping={softcap!r} needs an attention backend that applies a tanh to the scores "
                f"(eager, flex_attention, flash_attention); the '{self.config._attn_implementation}' backend cannot"
            )
        cap = {} if softcap is None else {"softcap": softcap}  # transformers' keyword (eager, flex, flash)
        kv_len = key.shape[-2]
        if self.is_cross_attention:
            position_bias = None
        elif self.relative_attention_bias is not None:  # the queries follow the cached tokens
            query_offset = kv_len - q_len if past_length is None else past_length
            position_bias = score_bias(
                self.relative_attention_bias, self.config, q_len, kv_len, query_offset, device=query.device
            )
        if isinstance(position_bias, RelativeScoreBias):
            output, weights = flex_score_bias_attention_forward(
                self, query, key, value, attention_mask, self.scaling, position_bias, dropout, **cap, **kwargs
            )
        elif self.relative_positions is not None:
            relative_keys, relative_values = self.relative_positions(
                *token_positions(q_len, kv_len, query.device, past_length)
            )
            output, weights = shaw_attention_forward(
                self, query, key, value, attention_mask, self.scaling, relative_keys, relative_values, dropout, softcap
            )
        else:
            if position_bias is not None:
                if self.config._attn_implementation in FLEX_SCORE_BIAS_BACKENDS:
                    raise ValueError(
                        "flex_attention adds a score bias in its score_mod: give it as a "
                        "hfzoo.modules.positions.RelativeScoreBias (hfzoo.modules.positions.score_bias), not as a "
                        f"dense {tuple(position_bias.shape)} tensor"
                    )
                attention_mask = add_bias_to_mask(attention_mask, position_bias, query.dtype)
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
            output, weights = attention(
                self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **cap, **kwargs
            )
        return output, weights  # (batch, q_len, heads, head_dim)


class TransparentAttention(nn.Linear):
    """Transparent attention (Bapna et al. 2018, §3): what each decoder cross-attention reads of the encoder.

    Bapna et al. 2018, "Training Deeper Neural Machine Translation Models with Transparent Attention".
    Instead of the encoder's last output, cross-attention j attends to
    ```
    z_j = sum_i s_ij h_i,    s_.j = softmax_i(W_j.)
    ```
    over the encoder's embedding output `h_0`, its layer outputs `h_1 .. h_{N-1}` and its final (normalised)
    output `h_N`; `W` (this module's `weight`, `(num_cross_attentions, num_encoder_outputs)`) holds one vector
    of N + 1 logits per cross-attention of the decoder (one per decoder layer). Mesh TensorFlow's
    `TransparentEncDecAttention` (which Narang et al. 2021 used) stacks the same encoder outputs and
    initialises `W` with standard deviation `(N + 1) ** -0.5`, as here (through `init_std_scale`, read by
    `HfzooPreTrainedModel._init_weights`); its optional dropout on `W` is not applied. The softmax is taken
    in float32.

    Subclassing `nn.Linear` gives `W` transformers' initialisation and keeps it owned by the module whose
    `forward` reads it (DeepSpeed ZeRO-3 gathers per module); it is not applied as a linear map.

    Args:
        config: an hfzoo config (`initializer_range`).
        num_encoder_outputs: N + 1, the encoder's layers plus its embedding output.
        num_cross_attentions: the decoder's cross-attention sublayers.

    Shapes:
        `encoder_layer_outputs` `(batch_size, num_encoder_outputs, src_len, hidden_size)` ->
        `(batch_size, num_cross_attentions, src_len, hidden_size)`.
    """

    def __init__(self, config, num_encoder_outputs: int, num_cross_attentions: int) -> None:
        super().__init__(num_encoder_outputs, num_cross_attentions, bias=False)
        self.init_std_scale = num_encoder_outputs**-0.5 / config.initializer_range

    def forward(self, encoder_layer_outputs: torch.Tensor) -> torch.Tensor:
        """Combine the encoder outputs `(batch_size, N + 1, src_len, hidden_size)` once per cross-attention.

        Raises:
            ValueError: the number of encoder outputs is not `in_features`.
        """
        if encoder_layer_outputs.shape[1] != self.in_features:
            raise ValueError(
                f"transparent attention expects {self.in_features} encoder outputs (embeddings + layers), got "
                f"{encoder_layer_outputs.shape[1]}"
            )
        weights = torch.softmax(self.weight.float(), dim=-1).to(encoder_layer_outputs.dtype)  # (M, N + 1)
        return torch.einsum("mn,bnsd->bmsd", weights, encoder_layer_outputs)
