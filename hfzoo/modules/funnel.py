"""The Funnel Transformer's encoder (Dai et al. 2020, "Funnel-Transformer"): sequence pooling between blocks.

`FunnelLayerStack` is the `"funnel"` entry of `hfzoo.modules.stack.LAYER_STACKS` (`config.layer_stack`),
defined for bidirectional stacks only: pooling mixes neighbouring positions, so it has no causal form. The
stack's `num_layers` layers form blocks (`config.funnel_block_sizes`); before each block but the first the
sequence is mean-pooled with stride 2, and the block's first layer lets the pooled queries attend to the
unpooled keys and values (Dai et al. §2.2, "pool-query-only"). Where heads read every position (the encoder
family: masked LM, token classification) the last block's output is up-sampled back to full length, the
first block's output is added, and `funnel_upsampling_layers` standard layers follow (Dai et al. §2.3, the
"decoder"). In the encoder-decoder the decoder cross-attends to the compressed encoder output, as in Narang
et al. 2021 (Mesh TensorFlow's `BitransformerFunnel`).

Positions: a pooled position stands at the first position of its window (0, 2, 4, ... after one pooling),
so score biases (T5's relative bias shared by the stack, ALiBi) keep measuring distances in tokens.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from .attention import HfzooAttention
from .mixers import TOKEN_MIXERS
from .positions import (
    RELATIVE_POSITION_REPRESENTATIONS,
    ROTARY_POSITION_EMBEDDINGS,
    has_per_layer_score_bias,
    score_bias,
)

#: Window and stride of the pooling between blocks (Dai et al. 2020 §2.2: stride 2).
POOLING_STRIDE = 2
#: Position schemes the funnel cannot pool: rotary (queries and keys rotated at one shared set of positions)
#: and the schemes each layer computes inside its attention from the sequence length alone (Shaw's
#: representations, a T5 bias per layer).
UNPOOLABLE_POSITIONS = "rotary embeddings, Shaw's relative positions and a relative bias per layer"


def funnel_block_sizes(config, num_layers: int) -> list[int]:
    """The number of layers of each funnel block.

    Args:
        config: an hfzoo config (`funnel_block_sizes`).
        num_layers: the stack's depth.

    Returns:
        `config.funnel_block_sizes`, or when None `min(3, num_layers)` blocks as equal as possible, the first
        ones larger (12 layers: `[4, 4, 4]`, Dai et al.'s "B4-4-4").
    """
    if config.funnel_block_sizes is not None:
        return list(config.funnel_block_sizes)
    blocks = min(3, num_layers)
    return [num_layers // blocks + (i < num_layers % blocks) for i in range(blocks)]


def mean_pool(hidden_states: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean-pool windows of `POOLING_STRIDE` positions over the real ones (Dai et al. 2020 §2.2).

    A window's output is the mean of its non-padding positions (so padding never changes a real output) and
    is real if any of them is; an odd length gets a last window of one position.

    Args:
        hidden_states: `(batch_size, seq_len, hidden_size)`.
        valid: `(batch_size, seq_len)` bool, False at padding.

    Returns:
        `(pooled, pooled_valid)`: `(batch_size, ceil(seq_len / 2), hidden_size)` and `(batch_size, ceil(seq_len / 2))`.
    """
    batch, length, hidden = hidden_states.shape
    pad = (-length) % POOLING_STRIDE
    if pad:
        hidden_states = nn.functional.pad(hidden_states, (0, 0, 0, pad))
        valid = nn.functional.pad(valid, (0, pad), value=False)
    windows = hidden_states.view(batch, -1, POOLING_STRIDE, hidden)
    weights = valid.view(batch, -1, POOLING_STRIDE)
    count = weights.sum(-1)
    pooled = (windows * weights[..., None].to(windows.dtype)).sum(2) / count.clamp(min=1)[..., None].to(windows.dtype)
    return pooled, count > 0


class FunnelLayerStack(nn.Module):
    """Runs a stack's layers as the Funnel Transformer's encoder (see the module docstring). No parameters.

    The stack builds its `num_layers` layers (the blocks, `funnel_block_sizes`) and, when its outputs are
    read per position (`StackLayout.per_token_outputs`), `funnel_upsampling_layers` more standard layers.

    Args:
        config: an hfzoo config (`funnel_block_sizes`, `funnel_upsampling_layers`).
        layout: the stack's `hfzoo.modules.stack.StackLayout`.

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> the same (up-sampled), or
        `(batch_size, ceil(seq_len / 2^(blocks - 1)), hidden_size)` (compressed, encoder-decoder).
    """

    #: the config fields only this layer stack reads (`hfzoo.modules.stack.LayerStack.config_fields`).
    config_fields = ("funnel_block_sizes", "funnel_upsampling_layers")

    def __init__(self, config, layout) -> None:
        super().__init__()
        self.config = config
        self.block_sizes = funnel_block_sizes(config, layout.num_layers)
        self.upsample = layout.per_token_outputs

    @staticmethod
    def layer_plan(config, layout, block_size: int) -> list[int | None]:
        """The blocks' layers, then (per-token outputs) `funnel_upsampling_layers` standard layers."""
        extra = config.funnel_upsampling_layers if layout.per_token_outputs else 0
        return list(range(block_size)) + [None] * extra

    @staticmethod
    def layer_lengths(config, layout, seq_len: int) -> tuple[list[tuple[int, int]], int]:
        """`(query length, key length)` of each built layer, and the output length (for the FLOPs count).

        Block b runs at `ceil(seq_len / 2^b)`; its first layer's keys and values are at the previous block's
        length; the up-sampling layers run at `seq_len`.
        """
        lengths, length = [], seq_len
        for block, size in enumerate(funnel_block_sizes(config, layout.num_layers)):
            previous = length
            if block > 0:
                length = -(-length // POOLING_STRIDE)
            lengths += [(length, previous)] + [(length, length)] * (size - 1)
        extra = len(layout.layer_plan(config)) - len(lengths)
        return lengths + [(seq_len, seq_len)] * extra, (seq_len if layout.per_token_outputs else length)

    @staticmethod
    def weights_per_token(config, layout) -> int:
        """No weights of its own (mean pooling and up-sampling by repetition)."""
        return 0

    def output_attention_mask(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The input's mask when up-sampling, else the mask of the compressed output (pooled once per block)."""
        if self.upsample or attention_mask is None:
            return attention_mask
        valid = attention_mask.bool()
        dummy = valid.new_zeros((*valid.shape, 1), dtype=torch.float32)
        for _ in self.block_sizes[1:]:
            dummy, valid = mean_pool(dummy, valid)
        return valid.to(attention_mask.dtype)

    def _layer_inputs(self, stack, inputs, queries, valid, query_stride, keys=None, key_valid=None, key_stride=None):
        """Layer keyword arguments for `queries` (pooled states) attending to themselves or to `keys`."""
        kwargs = dict(inputs.layer_kwargs)
        kv = queries if keys is None else keys
        kv_valid = valid if keys is None else key_valid
        mask_kwargs = {} if keys is None else {"encoder_hidden_states": keys}
        kwargs["attention_mask"] = create_bidirectional_mask(
            config=self.config, inputs_embeds=queries, attention_mask=kv_valid.long(), **mask_kwargs
        )
        kwargs["padding_mask"] = valid
        if stack.relative_attention_bias is not None:  # queries at query_stride * i, keys at key_stride * j
            kwargs["position_bias"] = score_bias(
                stack.relative_attention_bias,
                self.config,
                queries.shape[1],
                kv.shape[1],
                query_stride=query_stride,
                key_stride=key_stride or query_stride,
                device=queries.device,
            )
        if keys is not None:
            kwargs["key_value_states"] = keys
        return kwargs

    def forward(self, stack, hidden_states: torch.Tensor, inputs) -> tuple[torch.Tensor, None]:
        """Run the blocks with pooling between them, then up-sample if the stack's outputs are per token.

        Args:
            stack: the `HfzooStack` (its `layers` and shared score bias `relative_attention_bias`).
            hidden_states: `(batch_size, seq_len, hidden_size)` embedded inputs.
            inputs: the stack's `StackInputs`.

        Returns:
            `(hidden_states, None)`.

        Raises:
            ValueError: a cache (prefix tuning) or a prepared 4-D attention mask: the funnel pools the sequence
                and its 2-D padding mask, which neither has.
        """
        if inputs.cache is not None:
            raise ValueError("layer_stack='funnel' pools the sequence, so it takes no cache (prefix tuning)")
        if inputs.attention_mask is not None and inputs.attention_mask.dim() != 2:
            raise ValueError("layer_stack='funnel' needs a 2-D attention_mask (batch_size, seq_len) to pool")
        layers, index = stack.layers, 0
        valid = inputs.padding_mask
        if valid is None:
            valid = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        kwargs, stride, first_block = inputs.layer_kwargs, 1, None
        for block, size in enumerate(self.block_sizes):
            if block > 0:
                pooled, pooled_valid = mean_pool(hidden_states, valid)
                # The block's first layer: pooled queries attend to the unpooled keys and values (pool-query-only).
                first = self._layer_inputs(
                    stack, inputs, pooled, pooled_valid, stride * POOLING_STRIDE, hidden_states, valid, stride
                )
                if layers[index].self_attn is None:  # no token mixer in this layer: the pooled states go on
                    first = self._layer_inputs(stack, inputs, pooled, pooled_valid, stride * POOLING_STRIDE)
                hidden_states = layers[index](pooled, **first)
                index, size = index + 1, size - 1
                valid, stride = pooled_valid, stride * POOLING_STRIDE
                kwargs = self._layer_inputs(stack, inputs, hidden_states, valid, stride)
            for layer in layers[index : index + size]:
                hidden_states = layer(hidden_states, **kwargs)
            index += size
            if block == 0:
                first_block = hidden_states
        if not self.upsample:
            return hidden_states, None
        # Dai et al. §2.3: repeat each pooled position over its window, add the first block's (full-length) output.
        length = first_block.shape[1]
        hidden_states = hidden_states.repeat_interleave(stride, dim=1)[:, :length] + first_block
        for layer in layers[index:]:
            hidden_states = layer(hidden_states, **inputs.layer_kwargs)
        return hidden_states, None

    @staticmethod
    def check_config(config, layouts) -> None:
        """Refuse funnel settings the stacks cannot run (`ValueError` naming the field and what is allowed).

        Args:
            config: the hfzoo config being built.
            layouts: the `StackLayout`s of the stacks that use the funnel.
        """
        sizes = config.funnel_block_sizes
        if sizes is not None and (
            not isinstance(sizes, list | tuple)
            or not sizes
            or not all(isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in sizes)
        ):
            raise ValueError(f"funnel_block_sizes must be None or a non-empty list of positive integers, got {sizes!r}")
        upsampling = config.funnel_upsampling_layers
        if not isinstance(upsampling, int) or isinstance(upsampling, bool) or upsampling < 0:
            raise ValueError(f"funnel_upsampling_layers must be an integer >= 0, got {upsampling!r}")
        default = {f.name: f.default for f in dataclasses.fields(config)}["funnel_upsampling_layers"]
        for layout in layouts:
            if sizes is not None and sum(sizes) != layout.num_layers:
                raise ValueError(
                    f"funnel_block_sizes={sizes!r} has {sum(sizes)} layers, but the {layout.name} has "
                    f"{layout.num_layers_field}={layout.num_layers}"
                )
            if not layout.per_token_outputs and upsampling != default:
                raise ValueError(
                    f"funnel_upsampling_layers={upsampling!r}: the {layout.name} of {config.model_type} does not "
                    "up-sample (the decoder cross-attends to the compressed encoder output, Narang et al. 2021); "
                    f"leave it at its default {default!r}"
                )
            if not issubclass(TOKEN_MIXERS[layout.token_mixer].module, HfzooAttention):
                raise ValueError(
                    f"{layout.layer_stack_field}='funnel' lets pooled queries attend to unpooled keys and values, "
                    f"which {layout.token_mixer_field}={layout.token_mixer!r} does not do; use an attention mixer"
                )
        kind = config.position_embedding_type
        if (
            kind in ROTARY_POSITION_EMBEDDINGS
            or kind in RELATIVE_POSITION_REPRESENTATIONS
            or has_per_layer_score_bias(config)
        ):
            raise ValueError(
                f"position_embedding_type={kind!r} (share_relative_attention_bias="
                f"{config.share_relative_attention_bias}) cannot be pooled by layer_stack='funnel' "
                f"({UNPOOLABLE_POSITIONS}); use none, learned, sinusoidal, alibi or a shared relative_attention_bias"
            )
        if config.num_experts > 0:
            raise ValueError(
                f"num_experts={config.num_experts} with layer_stack='funnel': the experts' auxiliary losses are "
                "computed over one sequence length per stack, which pooling changes; use num_experts=0"
            )
