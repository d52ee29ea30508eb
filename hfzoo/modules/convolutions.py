"""Lightweight and dynamic convolutions: Wu et al. 2019, "Pay Less Attention with Lightweight and Dynamic Convolutions".

Two token mixers that replace self-attention with a depthwise convolution over time whose kernel is
softmax-normalized over its width and shared by the channels of each of H heads: a *lightweight*
convolution learns one kernel per head (§3, eq. 2-3); a *dynamic* convolution predicts the kernels at
every position from that position's input alone (§4, eq. 4). Both are the `TOKEN_MIXERS` entries
`lightweight_convolution` and `dynamic_convolution` (`hfzoo.modules.mixers`), built as each layer's
`self_attn`. In the encoder-decoder, cross-attention stays attention (Wu et al. §5: "we keep the
encoder-decoder attention").

The block (Wu et al. Fig. 2b; fairseq's `LightConvEncoderLayer`): an input projection d -> 2d followed by
a GLU, the convolution, and the output projection d -> d. With `conv_pointwise_projection=True` a
pointwise d -> d projection follows the depthwise convolution (the two halves of a depthwise-separable
convolution), as in the implementation Narang et al. 2021 used (Mesh TensorFlow's `LocalConvAttnBlock`),
which gives each block the 4 d^2 weights of self-attention. Config fields: `conv_kernel_size` (per
layer), `conv_num_heads` (H), `conv_weight_dropout` (DropConnect on the normalized kernels),
`conv_pointwise_projection`.

In a causal stack the kernel covers the current and the k - 1 previous positions (left padding, as
fairseq's `padding_l = k - 1`); in a bidirectional one it is centred. Incremental decoding keeps each
layer's convolution inputs in the KV cache (its `keys`, `(batch_size, 1, seq_len, hidden_size)`; the
`values` are empty), of which the last k - 1 are read at each step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.cache_utils import Cache, EncoderDecoderCache

#: Wu et al. 2019's kernel widths for the WMT models (fairseq's `encoder_kernel_size_list`,
#: "3, 7, 15, 31 x 4"): layer i gets entry i, and layers past the list get its last entry.
WU_KERNEL_SIZES = (3, 7, 15, 31)


def conv_kernel_width(config, layer_idx: int) -> int:
    """The convolution kernel width of a stack's token-mixer layer `layer_idx` (`config.conv_kernel_size`).

    Args:
        config: an hfzoo config (`conv_kernel_size`: an int for every layer, a list with one width per
            token-mixer layer, or None for Wu et al.'s 3, 7, 15, 31, 31, ...).
        layer_idx: the layer's index among its stack's token mixers.

    Returns:
        The width in tokens.
    """
    sizes = config.conv_kernel_size
    if sizes is None:
        return WU_KERNEL_SIZES[min(layer_idx, len(WU_KERNEL_SIZES) - 1)]
    return sizes if isinstance(sizes, int) else sizes[layer_idx]


def update_cached_window(
    cache: Cache, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, reach: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append a layer's new inputs to the cache and read back the new positions and the `reach` before them.

    A dynamic cache returns exactly the tokens so far; a static cache returns all its `max_cache_len` slots, the
    ones after the current length empty. So the window is read by position, `past_length - reach ...
    past_length + q_len - 1` (`past_length`: the cache's length before the update, a tensor for a static cache),
    with zeros before the start of the sequence: the same values from both caches, without a graph break.

    Args:
        cache: the stack's token-mixer cache (not an `EncoderDecoderCache`).
        keys: `(batch_size, 1, q_len, width)`: the new inputs, stored as the layer's keys.
        values: `(batch_size, 1, q_len, value_width)`: stored as its values (may be 0 wide).
        layer_idx: the cache layer.
        reach: how many positions before the new ones to read.

    Returns:
        `(keys, values)`, each `(batch_size, reach + q_len, width)`: zero where the position is before 0 (a static
        cache); from a dynamic cache `(batch_size, min(reach, past_length) + q_len, width)`, the positions so far.
    """
    q_len = keys.shape[2]
    past_length = cache.get_seq_length(layer_idx)
    if isinstance(past_length, torch.Tensor):
        # Before the update, which increments a static cache's length tensor in place.
        past_length = past_length.clone()
    else:
        # A dynamic cache's length is known here: read no positions before the sequence's start (the old window).
        reach = min(reach, past_length)
    all_keys, all_values = cache.update(keys, values, layer_idx)
    positions = torch.arange(-reach, q_len, device=keys.device) + past_length  # (reach + q_len,)
    before_start = (positions < 0)[None, :, None]
    index = positions.clamp(min=0)
    window = [t[:, 0].index_select(1, index).masked_fill(before_start, 0) for t in (all_keys, all_values)]
    return window[0], window[1]


def self_attention_cache(cache: Cache | None) -> Cache | None:
    """The cache of a stack's token mixers: the self-attention half of an `EncoderDecoderCache`, or the cache itself."""
    if isinstance(cache, EncoderDecoderCache):
        return cache.self_attention_cache
    return cache


def depthwise_convolution(padded: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """A depthwise convolution with head-shared kernels over "valid" positions (Wu et al. 2019, eq. 2).

    `output[b, i, c] = sum_j kernel[(b, i,) h(c), j] * padded[b, i + j, c]`, where channel c belongs to head
    `h(c) = c // (hidden_size // num_heads)`. A kernel shared over positions (lightweight) is one grouped
    `F.conv1d` (one group per channel, the head's kernel repeated over its channels). Kernels that differ per
    position (dynamic) are k shifted multiply-adds (a loop over the kernel taps, not over tokens) accumulated in
    float32: backward keeps only views of `padded`, not k copies.

    Args:
        padded: `(batch_size, q_len + k - 1, hidden_size)`, the inputs zero-padded as the direction requires.
        kernel: `(num_heads, k)` (one kernel per head, lightweight) or `(batch_size, q_len, num_heads, k)` (one
            per head and output position, dynamic), already normalized.

    Returns:
        `(batch_size, q_len, hidden_size)` in `padded`'s dtype.
    """
    batch_size, length, hidden = padded.shape
    heads, width = kernel.shape[-2:]
    q_len = length - width + 1
    kernel = kernel.to(padded.dtype)
    if kernel.dim() == 2:  # (hidden, 1, k): channel c convolved with its head's kernel
        weight = kernel.repeat_interleave(hidden // heads, dim=0)[:, None, :]
        return F.conv1d(padded.transpose(1, 2), weight, groups=hidden).transpose(1, 2).to(padded.dtype)
    output = padded.new_zeros(batch_size, q_len, heads, hidden // heads, dtype=torch.float32)
    for j in range(width):
        # (batch, q_len, heads, hidden // heads) * (batch, q_len, heads, 1)
        output = output + padded[:, j : j + q_len].view(batch_size, q_len, heads, -1) * kernel[..., j, None]
    return output.view(batch_size, q_len, hidden).to(padded.dtype)


class DepthwiseConvolution(nn.Module):
    """Wu et al. 2019's convolution block, the base of `LightweightConvolution` and `DynamicConvolution`.

    `o_proj(pointwise(conv(GLU(in_proj(x)))))`: `in_proj` maps d -> 2d and the GLU (Dauphin et al. 2017)
    halves it back to d; `conv` is the subclass's softmax-normalized depthwise convolution with `num_heads`
    kernels of width `kernel_size`, each shared by `hidden_size // num_heads` adjacent channels; `pointwise`
    (`conv_pointwise_projection`) is an optional d -> d projection; `o_proj` maps d -> d. Projections carry
    biases when `config.attention_bias`. Padding positions are zeroed before the convolution (as fairseq), so
    no real position depends on padding.

    Args:
        config: an hfzoo config (`hidden_size`, `num_attention_heads`, `conv_num_heads`,
            `conv_kernel_size`, `conv_weight_dropout`, `conv_pointwise_projection`, `attention_bias`).
        layer_idx: the mixer's index among its stack's token mixers: its kernel width
            (`conv_kernel_width`) and its KV-cache layer.
        is_causal: the stack is causal (the kernel covers the current and previous positions only).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> `(batch_size, seq_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.num_heads = config.conv_num_heads or config.num_attention_heads
        self.kernel_size = conv_kernel_width(config, layer_idx)
        # fairseq: padding_l = k - 1 in the decoder, k // 2 (odd k) or (k - 1) // 2 (even k) in the encoder
        self.padding_left = self.kernel_size - 1 if is_causal else (self.kernel_size - 1) // 2
        self.weight_dropout = config.conv_weight_dropout
        bias = config.attention_bias
        self.in_proj = nn.Linear(hidden, 2 * hidden, bias=bias)
        self.pointwise = nn.Linear(hidden, hidden, bias=bias) if config.conv_pointwise_projection else None
        self.o_proj = nn.Linear(hidden, hidden, bias=bias)

    def residual_branch_projections(self) -> tuple[list[nn.Linear], list[nn.Linear]]:
        """`([in_proj, pointwise], [o_proj])`: the value path and output that DeepNorm / Fixup initialise."""
        return [p for p in (self.in_proj, self.pointwise) if p is not None], [self.o_proj]

    def extra_repr(self) -> str:
        """Show the kernel width, heads and direction in `print(model)`."""
        return f"kernel_size={self.kernel_size}, num_heads={self.num_heads}, causal={self.is_causal}"

    def normalized_kernel(self, kernel: torch.Tensor) -> torch.Tensor:
        """Softmax over the kernel width (Wu et al. eq. 3) in float32, then DropConnect in training (§3).

        Args:
            kernel: `(..., num_heads, kernel_size)` raw weights.

        Returns:
            The normalized kernel, same shape, in `kernel`'s dtype.
        """
        weights = F.softmax(kernel, dim=-1, dtype=torch.float32).to(kernel.dtype)
        return F.dropout(weights, p=self.weight_dropout, training=self.training)

    def convolve(self, padded: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """The depthwise convolution of the subclass over a zero-padded input ("valid" positions only).

        Args:
            padded: `(batch_size, q_len + kernel_size - 1, hidden_size)`, the inputs output i sees are
                `padded[:, i : i + kernel_size]`.
            queries: `(batch_size, q_len, hidden_size)`, the inputs at the output positions (the dynamic
                convolution predicts its kernels from them).

        Returns:
            `(batch_size, q_len, hidden_size)`.
        """
        raise NotImplementedError

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        padding_mask: torch.Tensor | None = None,
        position_embeddings=None,
        position_bias=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """Mix the positions of `hidden_states` by the convolution block.

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: unused (padding comes from `padding_mask`, causality from the kernel's support).
            cache: a transformers `Cache` (causal stacks): the layer's earlier convolution inputs,
                extended in place with the new ones.
            padding_mask: `(batch_size, q_len)` bool, False at padding, or None.
            position_embeddings: unused (a convolution has no attention-level positions).
            position_bias: unused.
            **kwargs: ignored attention-backend options.

        Returns:
            `(output, None)`: `(batch_size, q_len, hidden_size)` and no attention weights.

        Raises:
            ValueError: a cache given to a bidirectional stack (e.g. PEFT prefix tuning): a convolution has
                no keys and values for a prefix.
        """
        batch_size, q_len, hidden = hidden_states.shape
        inputs = F.glu(self.in_proj(hidden_states), dim=-1)  # (batch, q_len, hidden)
        if padding_mask is not None:
            inputs = inputs.masked_fill(~padding_mask[..., None], 0.0)
        cache = self_attention_cache(cache)
        width = self.kernel_size
        if cache is not None and not self.is_causal:
            raise ValueError(
                f"{type(self).__name__} in a bidirectional stack got a cache (PEFT prefix tuning?): "
                "a convolution has no keys and values to prepend a prefix to"
            )
        if cache is not None:
            # The cache keeps every input of this layer, (batch, 1, past + q_len, hidden); the new outputs read
            # the last q_len + k - 1 of them, zero before the start of the sequence.
            empty = inputs.new_zeros(batch_size, 1, q_len, 0)
            window, _ = update_cached_window(cache, inputs[:, None], empty, self.layer_idx, width - 1)
            padded = F.pad(window, (0, 0, q_len + width - 1 - window.shape[1], 0))
        else:
            padded = F.pad(inputs, (0, 0, self.padding_left, width - 1 - self.padding_left))
        output = self.convolve(padded, inputs)
        if self.pointwise is not None:
            output = self.pointwise(output)
        return self.o_proj(output), None

    @staticmethod
    def flops_per_token(config, layer_idx: int, is_causal: bool) -> tuple[int, int]:
        """Training-FLOP terms of one block, for `hfzoo.models.flops` (Kaplan et al. 2020 convention).

        Args:
            config: an hfzoo config.
            layer_idx: the mixer's index among its stack's token mixers.
            is_causal: the stack is causal.

        Returns:
            `(weights, flops_per_pair)`: the matrix-product weights one token passes through (the block's
            projections; the depthwise convolution's k multiply-adds per channel are elementwise work, not
            counted), and the FLOPs per (query, key) pair (0: a convolution's cost is linear in the length).
        """
        raise NotImplementedError


def _block_weights(config) -> int:
    hidden = config.hidden_size
    return 2 * hidden * hidden + hidden * hidden * (2 if config.conv_pointwise_projection else 1)


class LightweightConvolution(DepthwiseConvolution):
    """Lightweight convolution (Wu et al. 2019, §3, eq. 2-3): one learned kernel per head, shared over positions.

    `LightConv(X, W_h, i, c) = sum_j softmax(W_h)_j X[i + j - padding_left, c]` for each channel c of head h.
    `weight` is `(num_heads, kernel_size)`, initialised normal(0, `initializer_range`) by `init_parameters`
    (a near-uniform kernel after the softmax).
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__(config, layer_idx, is_causal)
        self.weight = nn.Parameter(torch.empty(self.num_heads, self.kernel_size))

    def init_parameters(self, initializer_range: float) -> None:
        """Initialise `weight` from normal(0, `initializer_range`) (called by the models' `_init_weights`)."""
        init.normal_(self.weight, mean=0.0, std=initializer_range)

    def convolve(self, padded: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """See `DepthwiseConvolution.convolve`; one kernel per head for every position."""
        return depthwise_convolution(padded, self.normalized_kernel(self.weight))

    @staticmethod
    def flops_per_token(config, layer_idx: int, is_causal: bool) -> tuple[int, int]:
        """See `DepthwiseConvolution.flops_per_token`."""
        return _block_weights(config), 0


class DynamicConvolution(DepthwiseConvolution):
    """Dynamic convolution (Wu et al. 2019, §4, eq. 4): kernels predicted from the current position's input.

    `DynamicConv(X, i, c) = LightConv(X, f(X_i)_h, i, c)` with `f(X_i) = weight_proj(X_i)`, a linear map
    d -> num_heads * kernel_size (biases when `config.attention_bias`), softmax-normalized over the width.
    The kernels come from the convolution's input (after the GLU), as in fairseq's `DynamicConv1dTBC`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__(config, layer_idx, is_causal)
        self.weight_proj = nn.Linear(config.hidden_size, self.num_heads * self.kernel_size, bias=config.attention_bias)

    def convolve(self, padded: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """See `DepthwiseConvolution.convolve`; a kernel per head and output position."""
        batch_size, q_len, _ = queries.shape
        heads, width = self.num_heads, self.kernel_size
        kernel = self.weight_proj(queries).view(batch_size, q_len, heads, width)
        return depthwise_convolution(padded, self.normalized_kernel(kernel))

    @staticmethod
    def flops_per_token(config, layer_idx: int, is_causal: bool) -> tuple[int, int]:
        """See `DepthwiseConvolution.flops_per_token`; adds the kernel prediction d x (num_heads * k)."""
        width = conv_kernel_width(config, layer_idx)
        heads = config.conv_num_heads or config.num_attention_heads
        hidden = config.hidden_size
        return _block_weights(config) + hidden * heads * width, 0


def check_convolution_config(config) -> None:
    """Refuse bad values of the convolution fields (the `check_config` of both `TOKEN_MIXERS` entries).

    Raises:
        ValueError: `conv_num_heads` not a positive divisor of `hidden_size` (nor, when None,
            `num_attention_heads`); a `conv_kernel_size` that is not a positive width or a list of them
            with one width per token-mixer layer of each convolution stack; `conv_weight_dropout` outside
            [0, 1); a non-boolean `conv_pointwise_projection`. Each message names the field.
    """
    heads_field = "conv_num_heads" if config.conv_num_heads is not None else "num_attention_heads"
    heads = getattr(config, heads_field)
    if not isinstance(heads, int) or heads < 1 or config.hidden_size % heads:
        raise ValueError(
            f"{heads_field}={heads!r} must be a positive divisor of hidden_size={config.hidden_size}: each of the "
            "convolution's heads shares its kernel over hidden_size // heads channels"
        )
    sizes = config.conv_kernel_size
    if sizes is not None:
        widths = [sizes] if isinstance(sizes, int) else sizes
        if not isinstance(widths, list) or not widths or any(not isinstance(k, int) or k < 1 for k in widths):
            raise ValueError(
                f"conv_kernel_size={sizes!r} must be a positive width (tokens), a list of them (one per layer) "
                "or None (Wu et al.'s 3, 7, 15, 31, ...)"
            )
        if isinstance(sizes, list):
            for layout in config.stack_layouts():
                mixers = sum("s" in layer for layer in layout.sublayers(config))
                module = layout.token_mixer_module
                uses_convolution = module is not None and issubclass(module, DepthwiseConvolution)
                if uses_convolution and len(sizes) != mixers:
                    raise ValueError(
                        f"conv_kernel_size has {len(sizes)} widths, but the {layout.name} has {mixers} "
                        f"convolution layers; give one width per layer (or a single int for all)"
                    )
    dropout = config.conv_weight_dropout
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"conv_weight_dropout must be in [0, 1), got {dropout!r}")
    if not isinstance(config.conv_pointwise_projection, bool):
        raise ValueError(f"conv_pointwise_projection must be True or False, got {config.conv_pointwise_projection!r}")


#: The config fields the convolution mixers read (the `config_fields` of both `TOKEN_MIXERS` entries).
CONVOLUTION_FIELDS = ("conv_kernel_size", "conv_num_heads", "conv_weight_dropout", "conv_pointwise_projection")
