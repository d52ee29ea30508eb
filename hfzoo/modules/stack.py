"""A stack of Transformer layers with its embeddings: `HfzooStack`, the body shared by every hfzoo family.

`HfzooStack` is token embeddings (possibly shared with another stack), absolute positions, optional
token-type (segment) embeddings, `HfzooLayer`s and a final norm, and the forward pass over them. The
family's config describes each of its stacks with a `StackLayout` (depth, whether token mixing is causal,
whether the layers cross-attend to an encoder, which token mixer):

- decoder-only model: `HfzooDecoderModel`, one causal stack;
- encoder model: `HfzooEncoderModel`, one bidirectional stack (with token types);
- encoder-decoder: `HfzooEncoderDecoderStack`, a bidirectional stack and a causal stack with
  cross-attention, sharing embeddings.

`HfzooStack` is a mixin of those `PreTrainedModel`s (as transformers' `GenericForSequenceClassification`
is): the stack *is* the family's base model, so its checkpoints keep flat key names
(`model.embed_tokens`, `model.layers.N`, `model.norm`; `model.encoder.layers.N` in the encoder-decoder).

Block sharing (`config.block_sharing`, ALBERT: Lan et al. 2020 §3.1; options in `BLOCK_SHARING` at the
bottom) keeps the distinct `HfzooLayer` modules, each with its own KV-cache index, and ties every
parameter of layers 1..N-1 to layer 0's through the stack's `_tied_weights_keys`. So the KV cache has
one layer per application, gradient checkpointing wraps each application, checkpoints store layer 0
only, and DeepSpeed ZeRO-3 partitions each tensor once.

How a stack applies its layers is its layer stack (`config.layer_stack`; the encoder-decoder's
`decoder_layer_stack`), an entry of `LAYER_STACKS` at the bottom (the variation point of Mesh TensorFlow's
`layer_stack_cls`): `standard` runs them in order; `universal` applies a block of layers recurrently with
adaptive computation time (Universal Transformer, `hfzoo.modules.universal`); `funnel` pools the sequence
between blocks (Funnel Transformer, `hfzoo.modules.funnel`). An entry's module says which layers the stack
builds (`layer_plan`: the Universal Transformer builds its block once per recurrent step, tied like block
sharing, so each step owns its KV-cache layers) and runs them (`forward(stack, hidden_states, inputs)`).

Connections across a stack's layers (`hfzoo.modules.connections`): value residual learning
(`config.value_residual`, ResFormer, Zhou et al. 2024) and U-Net skips (`config.unet_skips`, modded-nanogpt),
applied by the standard layer stack; where they are defined is in the `LAYER_STACKS` and `TOKEN_MIXERS` entries,
checked by `check_layer_connections` when the config is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.utils import logging

from ..compat import cache_field
from .attention import TransparentAttention
from .connections import UNetSkips, ValueResidual
from .embeddings import build_token_embedding, check_attention_mask_values, out_of_range_id
from .evolved import EvolvedTransformerLayer
from .experts import is_moe_layer, token_padding_mask
from .funnel import FunnelLayerStack
from .layer import NORM_POSITIONS, HfzooLayer, layer_sublayers
from .mixers import TOKEN_MIXERS
from .norms import build_norm
from .positions import (
    ATTENTION_SCORE_BIASES,
    ROTARY_POSITION_EMBEDDINGS,
    build_position_embedding,
    build_stack_score_bias,
    score_bias,
)
from .universal import UniversalTransformerLayerStack

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class StackLayout:
    """One stack of a family as its config declares it (`stack_layouts()` of the family's config).

    Read by `HfzooStack` to build the stack and by the config validation (token mixers, sublayer pattern,
    KV-cache layers, Fixup's branch count).

    Args:
        name: `"encoder"` or `"decoder"`, the stack's name in `BLOCK_SHARING` (a decoder-only model's one
            stack is its decoder, an encoder model's its encoder).
        num_layers: the stack's depth N.
        num_layers_field: the config field that sets N (for error messages).
        is_causal: causal token mixing.
        has_cross_attention: each token mixer is followed by cross-attention to the encoder outputs.
        token_mixer: the stack's token mixer, a key of `hfzoo.modules.mixers.TOKEN_MIXERS`.
        token_mixer_field: the config field that sets it (for error messages).
        layer_stack: how the stack applies its layers, a key of `LAYER_STACKS`.
        layer_stack_field: the config field that sets it (for error messages).
        memory_layers: indices of the feed-forward sublayers (among the `num_layers` layers' ones; negative
            counts from the end) that are product key memories (`hfzoo.modules.memory`), or None.
        memory_layers_field: the config field that sets them (for error messages).
        per_token_outputs: heads read the stack's output at every position (the encoder family), rather than
            only cross-attention (the encoder-decoder's encoder): a funnel stack then up-samples its output.
    """

    name: str
    num_layers: int
    num_layers_field: str
    is_causal: bool
    has_cross_attention: bool
    token_mixer: str
    token_mixer_field: str = "token_mixer"
    layer_stack: str = "standard"
    layer_stack_field: str = "layer_stack"
    memory_layers: list[int] | None = None
    memory_layers_field: str = "memory_layers"
    per_token_outputs: bool = True

    @property
    def token_mixer_module(self) -> type[nn.Module] | None:
        """The class of the stack's token mixer (`TOKEN_MIXERS[token_mixer].module`), or None for an unknown name."""
        mixer = TOKEN_MIXERS.get(self.token_mixer)
        return None if mixer is None else mixer.module

    def block_sublayers(self, config) -> list[str]:
        """The sublayers of each of the `num_layers` layers (`hfzoo.modules.layer.layer_sublayers`).

        `config.sublayer_pattern` split into layers; with a token mixer that contains its feed-forward
        (`TokenMixer.feed_forward`, the Weighted Transformer) every layer is its mixer alone (`"s"`).
        """
        mixer = TOKEN_MIXERS.get(self.token_mixer)
        if mixer is not None and mixer.feed_forward:
            return ["s"] * self.num_layers
        return layer_sublayers(config.sublayer_pattern, self.num_layers)

    def layer_plan(self, config) -> list[int | None]:
        """For each layer the stack builds, the index of the `block_sublayers` layer it is (a copy of), or None.

        None is a layer of the layer stack's own (the funnel's up-sampling layers, `"sf"`). See `LAYER_STACKS`.
        """
        block = self.block_sublayers(config)
        return LAYER_STACKS[self.layer_stack].module.layer_plan(config, self, len(block))

    def sublayers(self, config) -> list[str]:
        """The sublayers of each layer the stack builds, in order (a layer stack may repeat or add layers)."""
        block = self.block_sublayers(config)
        return [block[j] if j is not None else "sf" for j in self.layer_plan(config)]

    def memory_positions(self, config) -> set[int]:
        """The feed-forward indices (in the block, non-negative) of the stack's product key memories.

        Raises:
            ValueError: an index that is not an integer, is outside the stack's feed-forward sublayers, or is
                repeated (the message names `memory_layers_field`).
        """
        if not self.memory_layers:
            return set()
        count = sum("f" in layer for layer in self.block_sublayers(config))
        positions = set()
        for index in self.memory_layers:
            if not isinstance(index, int) or isinstance(index, bool) or not -count <= index < count:
                raise ValueError(
                    f"{self.memory_layers_field}={self.memory_layers!r}: {index!r} is not the index of one of the "
                    f"{count} feed-forward sublayers of the {self.name} (negative indices count from the end)"
                )
            if index % count in positions:
                raise ValueError(f"{self.memory_layers_field}={self.memory_layers!r} names a layer twice")
            positions.add(index % count)
        return positions

    def feed_forward_kinds(self, config) -> list[str]:
        """The block (`hfzoo.modules.layer.FEED_FORWARD_BLOCKS` key) of each feed-forward sublayer the stack builds.

        A memory where `memory_layers` says; else experts on the sublayers `is_moe_layer` selects (counted over
        the built layers, as before); else dense. A copy of a block layer (Universal Transformer) has the
        original's; the layer stack's own layers (funnel up-sampling) are dense.
        """
        block = self.block_sublayers(config)
        memory = self.memory_positions(config)
        block_ffn = {}  # block layer index -> its feed-forward index in the block
        for j, layer in enumerate(block):
            if "f" in layer:
                block_ffn[j] = len(block_ffn)
        kinds = []
        for source in self.layer_plan(config):
            if source is None:
                kinds.append("dense")
            elif source in block_ffn:
                if block_ffn[source] in memory:
                    kinds.append("product_key_memory")
                else:
                    kinds.append("experts" if is_moe_layer(config, len(kinds)) else "dense")
        return kinds

    def tied_layers(self, config) -> list[int]:
        """For each built layer, the layer whose parameters it uses (itself when untied).

        Block sharing (`BLOCK_SHARING`) ties every layer to layer 0; otherwise a copy of a block layer
        (`layer_plan`, the Universal Transformer's steps) is tied to the first layer copying the same one.
        """
        plan = self.layer_plan(config)
        if self.name in BLOCK_SHARING[config.block_sharing]:
            return [0] * len(plan)
        first = {}
        return [i if source is None else first.setdefault(source, i) for i, source in enumerate(plan)]

    def cache_layers(self, config) -> int:
        """The stack's KV-cache layers: the `num_cache_layers` of each of its layers (`LAYER_TYPES`)."""
        layer_class = LAYER_TYPES[config.layer_type]
        return sum(layer_class.num_cache_layers(sublayers, self.is_causal) for sublayers in self.sublayers(config))


@dataclass
class HfzooStackOutput(BaseModelOutputWithPastAndCrossAttentions):
    """`BaseModelOutputWithPastAndCrossAttentions` plus the encoder outputs transparent attention reads.

    Args:
        layer_outputs: `(batch_size, num_layers + 1, seq_len, hidden_size)`: the embedding output, each layer's
            output and the final (normalised) output, stacked; set by the encoder of an encoder-decoder with
            `config.transparent_attention` (batch first, so `generate` expands it for beams), else None.
    """

    layer_outputs: torch.FloatTensor | None = None


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def check_stack_inputs(
    hidden_size: int,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    encoder_hidden_states: torch.Tensor | None,
    encoder_attention_mask: torch.Tensor | None,
    past_length: int | torch.Tensor,
) -> None:
    """Refuse inputs whose shapes disagree with each other, before any work (`HfzooStack.forward`).

    An attention mask of another length than the tokens' would otherwise be padded or cut by
    `transformers.masking_utils` (as in transformers' own models): a silently different result. Shapes only: no
    host sync, except comparing a static cache's length (a tensor), which is skipped under `torch.compile`.

    Args:
        hidden_size: the stack's model width.
        input_ids: must be `(batch_size, seq_len)`, or None.
        inputs_embeds: must be `(batch_size, seq_len, hidden_size)`, or None (exactly one of the two is given).
        attention_mask: a 2-D mask must be `(batch_size, past_len + seq_len)`; a 4-D one is taken as prepared.
        position_ids: must be `(batch_size or 1, seq_len)`, or None.
        token_type_ids: must be `(batch_size or 1, seq_len)`, or None.
        encoder_hidden_states: `(batch_size, src_len, hidden_size)`, or None.
        encoder_attention_mask: a 2-D mask must be `(batch_size, src_len)`.
        past_length: the positions the cache holds before these tokens (a prefix, earlier tokens), an int or a
            static cache's length tensor.

    Raises:
        ValueError: naming the input, its shape and the shape expected.
    """
    if input_ids is not None and input_ids.dim() != 2:
        hint = " (one sequence? add a batch dimension: input_ids[None])" if input_ids.dim() == 1 else ""
        raise ValueError(f"input_ids must be (batch_size, sequence_length), got shape {_shape(input_ids)}{hint}")
    if inputs_embeds is not None and (inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size):
        raise ValueError(
            f"inputs_embeds must be (batch_size, sequence_length, hidden_size={hidden_size}), got shape "
            f"{_shape(inputs_embeds)}"
        )
    batch_size, seq_length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    for name, ids in (("position_ids", position_ids), ("token_type_ids", token_type_ids)):
        if ids is not None and (ids.dim() != 2 or ids.shape[0] not in (1, batch_size) or ids.shape[1] != seq_length):
            raise ValueError(
                f"{name} must be (batch_size or 1, sequence_length) like the tokens ({batch_size}, {seq_length}), "
                f"got shape {_shape(ids)}"
            )
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() != 4:
        comparable = not (isinstance(past_length, torch.Tensor) and torch.compiler.is_compiling())
        if comparable and _shape(attention_mask) != (batch_size, int(past_length) + seq_length):
            cached = f" after {int(past_length)} cached positions (a prefix or earlier tokens)" if past_length else ""
            raise ValueError(
                f"attention_mask has shape {_shape(attention_mask)}, but the input is {batch_size} x {seq_length} "
                f"tokens{cached}: expected ({batch_size}, {int(past_length) + seq_length}), 1 for each token and 0 "
                f"for padding (or a prepared 4-D mask)"
            )
    if encoder_hidden_states is not None and isinstance(encoder_attention_mask, torch.Tensor):
        expected = _shape(encoder_hidden_states)[:2]
        if encoder_attention_mask.dim() != 4 and _shape(encoder_attention_mask) != expected:
            raise ValueError(
                f"the encoder's attention_mask has shape {_shape(encoder_attention_mask)}, but the encoder output "
                f"is {expected[0]} x {expected[1]} positions: expected {expected}"
            )


class HfzooStack:
    """Embeddings, `HfzooLayer`s and a final norm: the body of every hfzoo family.

    A mixin for an `HfzooPreTrainedModel` subclass, listed first among its bases
    (`class HfzooDecoderModel(HfzooStack, HfzooDecoderPreTrainedModel)`): its `__init__` initialises
    the `PreTrainedModel` with `config`, then builds the stack's modules on the model itself; the
    concrete class calls `post_init()`.

    Modules: `embed_tokens` (`hfzoo.modules.embeddings.TokenEmbedding`, or the one given, which may be
    shared with another stack), `embed_positions` (absolute positions, or None), `rotary_emb` (rotary,
    or None), `relative_attention_bias` (a score bias the scheme shares across the stack's layers,
    `hfzoo.modules.positions.build_stack_score_bias`; else None), `token_type_embeddings` (when
    `config.type_vocab_size > 0`, else None), `embed_norm` (a norm of the summed embeddings when
    `config.embedding_norm`, else None), `embed_dropout`, `layers` (`HfzooLayer`s, or the class of
    `config.layer_type` in `LAYER_TYPES`, e.g. the Evolved Transformer's cells),
    `norm` (the final norm when the norm placement has one, else an identity) and `transparent_attention`
    (`hfzoo.modules.attention.TransparentAttention`, in the cross-attending stack with
    `config.transparent_attention`, else None), `value_residual` (`hfzoo.modules.connections.ValueResidual` with
    `config.value_residual`, else None) and `unet_skips` (`hfzoo.modules.connections.UNetSkips` with
    `config.unet_skips`, else None). Flags: `is_causal`, `has_cross_attention`, `shares_layers`
    (`config.block_sharing` covers this stack) and `returns_layer_outputs` (the encoder side with
    `config.transparent_attention`: its output carries `layer_outputs`); `token_mixer_name` (the stack's
    `TOKEN_MIXERS` key, whose `mask_overlay` the self-attention mask takes).

    The layers follow `config.sublayer_pattern` and the layer stack (`StackLayout.sublayers`): each token
    mixer gets the next KV-cache layer index (`mixer_idx`, 0, 1, ... over the stack's token mixers, so a
    cache holds one layer per token mixer and the cross-attention after it; a layer type with more
    cache layers per layer takes as many, `num_cache_layers`) and each feed-forward the next
    feed-forward index and its block (`StackLayout.feed_forward_kinds`: dense, experts, product key memory).
    `layer_stack` (the `LAYER_STACKS` entry's module) applies them; `layer_sources[i]` is the layer whose
    parameters layer i uses (`StackLayout.tied_layers`: block sharing, the Universal Transformer's steps).

    Args:
        config: an hfzoo config.
        layout: the stack's `StackLayout` (depth, direction, cross-attention, token mixer).
        embed_tokens: the token embedding module to use (default: a new one, `build_token_embedding`).

    Raises:
        ValueError: tied layers (block sharing, Universal Transformer steps) whose parameters differ (a
            per-layer setting).
    """

    def __init__(self, config, layout: StackLayout, embed_tokens: nn.Module | None = None) -> None:
        super().__init__(config)
        self.embed_tokens = embed_tokens if embed_tokens is not None else build_token_embedding(config)
        self.is_causal = is_causal = layout.is_causal
        self.token_mixer_name = layout.token_mixer
        self.has_cross_attention = layout.has_cross_attention
        self.shares_layers = layout.name in BLOCK_SHARING[config.block_sharing]
        self.layer_stack = LAYER_STACKS[layout.layer_stack].module(config, layout)
        self.embed_positions = build_position_embedding(config)
        # Position schemes computed once per stack and handed to every layer's self-attention.
        rotary = ROTARY_POSITION_EMBEDDINGS.get(config.position_embedding_type)
        self.rotary_emb = rotary(config) if rotary is not None else None
        self.relative_attention_bias = build_stack_score_bias(config, bidirectional=not is_causal)
        # read at every forward: a plain attribute, not a config lookup (a guard under torch.compile, each call)
        self.position_scheme_has_score_bias = config.position_embedding_type in ATTENTION_SCORE_BIASES
        type_vocab_size = getattr(config, "type_vocab_size", 0)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, config.hidden_size) if type_vocab_size else None
        self.embed_norm = build_norm(config) if config.embedding_norm else None
        self.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
        layers, mixer_idx, ffn_idx = [], 0, 0
        layer_class = LAYER_TYPES[config.layer_type]
        kinds = layout.feed_forward_kinds(config)
        for i, sublayers in enumerate(layout.sublayers(config)):
            # the Transformer layer takes its feed-forward block's kind (dense, experts, product key memory)
            block = {"feed_forward": kinds[ffn_idx] if "f" in sublayers else None} if layer_class is HfzooLayer else {}
            layers.append(
                layer_class(
                    config,
                    i,
                    is_causal=is_causal,
                    has_cross_attention=layout.has_cross_attention,
                    sublayers=sublayers,
                    token_mixer=layout.token_mixer,
                    mixer_idx=mixer_idx,
                    ffn_idx=ffn_idx,
                    **block,
                )
            )
            mixer_idx += layer_class.num_cache_layers(sublayers, is_causal)
            ffn_idx += "f" in sublayers
        self.layers = nn.ModuleList(layers)
        self.norm = build_norm(config) if NORM_POSITIONS[config.norm_position].final_norm else nn.Identity()
        self.layer_sources = layout.tied_layers(config)
        for i, source in enumerate(self.layer_sources):
            shapes = [(name, p.shape) for name, p in self.layers[source].named_parameters()]
            if [(name, p.shape) for name, p in self.layers[i].named_parameters()] != shapes:
                raise ValueError(
                    f"block_sharing={config.block_sharing!r}, {layout.layer_stack_field}={layout.layer_stack!r}: "
                    f"layer {i} has different parameters than layer {source}, so one set of parameters cannot "
                    "serve both; use block_sharing='none' or settings that are the same in every layer"
                )
        # Transparent attention (Bapna et al. 2018): the decoder weighs every encoder output, which the encoder keeps.
        self.returns_layer_outputs = config.transparent_attention and not layout.has_cross_attention
        self.transparent_attention = None
        if config.transparent_attention and layout.has_cross_attention:
            encoder = next(other for other in config.stack_layouts() if not other.has_cross_attention)
            self.transparent_attention = TransparentAttention(config, len(encoder.sublayers(config)) + 1, mixer_idx)
        # Connections across the layers (hfzoo.modules.connections), applied by the standard layer stack.
        self.value_residual = ValueResidual(mixer_idx) if getattr(config, "value_residual", False) else None
        self.unet_skips = UNetSkips(len(layers)) if getattr(config, "unet_skips", False) else None

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """The layers' ties: `{"layers.i.<param>": "layers.j.<param>"}` for each layer i using layer j's parameters.

        Block sharing ties layers 1.. to layer 0; the Universal Transformer ties each step's copy of a layer to
        the first step's. Empty while the stack is being built, and when no layer is tied.
        """
        layers, sources = getattr(self, "layers", None), getattr(self, "layer_sources", None)
        if layers is None or sources is None:
            return {}
        ties = {}
        for i, source in enumerate(sources):
            if source != i:
                names = [name for name, _ in layers[source].named_parameters()]
                ties.update({f"layers.{i}.{name}": f"layers.{source}.{name}" for name in names})
        return ties

    def output_attention_mask(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The `(batch_size, out_len)` padding mask of the stack's outputs, from the input's `attention_mask`.

        The input's mask, unless the layer stack shortens the sequence (a funnel encoder that does not
        up-sample: its pooled mask, which the encoder-decoder's cross-attention uses).
        """
        return self.layer_stack.output_attention_mask(attention_mask)

    def _layer_cache(self, cache: Cache | None, use_cache: bool | None) -> Cache | None:
        """The cache the layers read and extend: the one given, a new one (`use_cache`, causal stacks), or None.

        Under gradient checkpointing in training mode with gradients enabled there is none:
        `GradientCheckpointingLayer` runs each layer again in the backward pass, which would extend a cache a
        second time, so transformers' models neither create one there nor pass one to their layers (the rule of
        transformers 5.24; `generate` from a model in training mode, without gradients, keeps its cache). hfzoo
        applies that rule here, once for the stack, whatever the installed release calls the argument. A given
        empty cache is dropped as transformers drops it; a cache that already holds positions (a PEFT prefix) is
        refused, because dropping it would silently change the result.

        Raises:
            ValueError: a cache holding positions under gradient checkpointing in training with gradients.
        """
        if cache is None and not (use_cache and self.is_causal):
            return None  # nothing to drop or create, with or without gradient checkpointing (a training loop's case)
        # `is_activation_checkpointing` walks every submodule: asked last, so that inference (generation) never pays
        # for it, nor guards on the whole module tree when its forward is compiled.
        if self.training and torch.is_grad_enabled() and self.is_activation_checkpointing:
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                held = self_cache.get_seq_length()
                if held:
                    raise ValueError(
                        f"gradient checkpointing recomputes each layer in the backward pass, which would extend the "
                        f"given cache of {held} positions (a PEFT prefix?) twice: disable gradient checkpointing "
                        f"(model.activation_checkpointing_disable()) to train with it"
                    )
                logger.warning_once("A cache is incompatible with gradient checkpointing in training: not using it.")
            return None
        if use_cache and cache is None and self.is_causal:
            # No config: the caches grow one layer per layer index, whatever the stack's depth.
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if self.has_cross_attention else DynamicCache()
        return cache

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        encoder_layer_outputs: torch.Tensor | None = None,
        **kwargs,
    ) -> HfzooStackOutput:
        """Embed the inputs and run the layers.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)` with 1 for tokens and 0 for padding, or a
                prepared 4-D mask.
            position_ids: `(batch_size, seq_len)` int64; default `past_len ... past_len + seq_len - 1`.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (stacks with token types; default 0).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            cache: a `Cache` (an `EncoderDecoderCache` for cross-attending stacks). Also how PEFT prefix
                tuning hands prefix keys/values to any stack, bidirectional ones included.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` for cross-attention.
            encoder_attention_mask: `(batch_size, src_len)` padding mask of the encoder outputs.
            use_cache: create a cache when none is given (causal stacks only).
            encoder_layer_outputs: `(batch_size, num_encoder_layers + 1, src_len, hidden_size)`, the encoder's
                `layer_outputs`; required by a stack with transparent attention, which ignores
                `encoder_hidden_states`.
            **kwargs: attention-backend options.

        Returns:
            `HfzooStackOutput` (a `BaseModelOutputWithPastAndCrossAttentions`) with `last_hidden_state`
            `(batch_size, seq_len, hidden_size)`, the cache (field `cache`; `past_key_values` before
            transformers 5.24) and, from an encoder feeding transparent attention, `layer_outputs`.

        Raises:
            ValueError: both or neither of `input_ids`/`inputs_embeds`; inputs whose shapes disagree, a mask of
                another length than the cached positions and tokens among them (`check_stack_inputs`); a 2-D mask
                holding a value other than 0 and 1 (`check_attention_mask_values`, eager mode); a token,
                learned position or token-type id outside its table (eager mode); a sequence longer than
                `max_position_embeddings` with absolute positions; cross-attention without encoder states;
                transparent attention without `encoder_layer_outputs`; a cache holding positions (a prefix)
                under gradient checkpointing in training (see `_layer_cache`).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        if self.has_cross_attention and encoder_hidden_states is None:
            raise ValueError("this stack cross-attends: encoder_hidden_states is required")
        cache = self._layer_cache(cache, use_cache)
        self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        past_length = self_cache.get_seq_length() if self_cache is not None else 0
        check_stack_inputs(
            self.config.hidden_size,
            input_ids,
            inputs_embeds,
            attention_mask,
            position_ids,
            token_type_ids,
            encoder_hidden_states,
            encoder_attention_mask,
            past_length,
        )
        # the encoder's mask (encoder_attention_mask) was checked when the encoder ran
        check_attention_mask_values(attention_mask)
        if position_ids is not None and hasattr(self.embed_positions, "check_position_ids"):
            self.embed_positions.check_position_ids(position_ids)  # a table of learned positions
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        seq_length = inputs_embeds.shape[1]
        if position_ids is None:
            # `past_length` is a tensor for a static cache: an offset, not a Python bound (no graph break).
            position_ids = (torch.arange(seq_length, device=inputs_embeds.device) + past_length)[None]

        hidden_states = self._embed(inputs_embeds, position_ids, token_type_ids, past_length)
        # A static cache hands every layer all of its slots as keys: the score bias spans them.
        max_cache_length = self_cache.get_max_length(0) if self_cache is not None else -1
        kv_length = max_cache_length if max_cache_length > 0 else past_length + seq_length
        position_inputs = self._position_inputs(position_ids, past_length, seq_length, kv_length)
        self_mask, cross_mask = self._masks(
            inputs_embeds, attention_mask, self_cache, position_ids, encoder_hidden_states, encoder_attention_mask
        )
        # for token mixers and expert routing; read from the 4-D mask `generate` prepares for a static cache
        padding_mask = token_padding_mask(attention_mask, seq_length, past_length)
        if padding_mask is not None:  # a 4-D mask may be broadcast over the batch
            padding_mask = padding_mask.expand(inputs_embeds.shape[0], -1)
        memories = None
        if self.transparent_attention is not None:
            if encoder_layer_outputs is None:
                raise ValueError(
                    "transparent_attention=True: the decoder's cross-attention reads every encoder output, so "
                    "encoder_layer_outputs is required (pass the encoder's output object as encoder_outputs: its "
                    "layer_outputs field holds them)"
                )
            memories = self.transparent_attention(encoder_layer_outputs)  # (batch, cross-attentions, src, hidden)
        layer_kwargs = dict(
            attention_mask=self_mask,
            cache=cache,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=cross_mask,
            padding_mask=padding_mask,
            **position_inputs,
            **kwargs,
        )
        layer_outputs = [hidden_states] if self.returns_layer_outputs else None
        inputs = StackInputs(layer_kwargs, attention_mask, padding_mask, position_ids, cache, memories, layer_outputs)
        hidden_states, _ = self.layer_stack(self, hidden_states, inputs)
        hidden_states = self.norm(hidden_states)
        if layer_outputs is not None:  # the last entry is the normalised output, as in Mesh TensorFlow
            layer_outputs = torch.stack([*layer_outputs, hidden_states], dim=1)  # (batch, layers + 1, seq, hidden)
        return HfzooStackOutput(last_hidden_state=hidden_states, **cache_field(cache), layer_outputs=layer_outputs)

    def _embed(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.LongTensor,
        token_type_ids: torch.LongTensor | None,
        past_length: int,
    ) -> torch.Tensor:
        """Token + absolute position + token-type embeddings, embedding norm and dropout: the first hidden states.

        Raises:
            ValueError: a sequence longer than `max_position_embeddings` with absolute positions.
        """
        hidden_states = inputs_embeds
        if self.embed_positions is not None:
            total = past_length + inputs_embeds.shape[1]
            # A static cache's length is a tensor: comparing it compiled would be a host sync (a graph break).
            checkable = not (isinstance(total, torch.Tensor) and torch.compiler.is_compiling())
            if checkable and total > self.config.max_position_embeddings:
                raise ValueError(
                    f"sequence of {total} tokens is longer than "
                    f"max_position_embeddings={self.config.max_position_embeddings}"
                )
            hidden_states = hidden_states + self.embed_positions(position_ids).to(hidden_states.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids).expand(inputs_embeds.shape[0], -1)
            elif (bad := out_of_range_id(token_type_ids, self.token_type_embeddings.num_embeddings)) is not None:
                raise ValueError(
                    f"token type id {bad} is outside [0, type_vocab_size={self.token_type_embeddings.num_embeddings})"
                )
            hidden_states = hidden_states + self.token_type_embeddings(token_type_ids)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(hidden_states)
        return self.embed_dropout(hidden_states)

    def _position_inputs(
        self, position_ids: torch.LongTensor, past_length: int, seq_length: int, kv_length: int
    ) -> dict:
        """Rotary angles (`position_embeddings`) and a shared score bias (`position_bias`), computed once per call.

        Every layer's token mixer receives them (cross-attention ignores them). The bias covers `kv_length`
        keys: `past_length + seq_length`, or all the slots of a static cache (the empty ones are masked); it is
        a dense tensor, or a `RelativeScoreBias` for `flex_attention` (`hfzoo.modules.positions.score_bias`).
        """
        position_inputs = {}
        if self.rotary_emb is not None:
            position_inputs["position_embeddings"] = self.rotary_emb(position_ids)
        if self.relative_attention_bias is not None:  # queries at past_length + i, keys at j
            position_inputs["position_bias"] = score_bias(
                self.relative_attention_bias,
                self.config,
                seq_length,
                kv_length,
                query_offset=past_length,
                device=position_ids.device,
            )
        return position_inputs

    def self_attention_mask(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        self_cache: Cache | None,
        position_ids: torch.LongTensor | None = None,
    ):
        """The backend-specific self-attention mask of the stack: causal or bidirectional, with the mixer's pattern.

        Built by `transformers.masking_utils` over the cache's keys (all the slots of a static cache, the empty
        ones masked) and intersected with the token mixer's own pattern when its `TOKEN_MIXERS` entry has a
        `mask_overlay` (a local window). A causal stack whose position scheme adds a score bias gets a mask even
        where SDPA could rely on `is_causal` alone (the bias travels in the mask). The generative heads hand
        this to `generate` as their `create_masks_for_generate`, so the 4-D mask it prepares for a static cache
        is the one the stack would build.

        Args:
            inputs_embeds: `(batch_size, q_len, ...)`: only its batch size, length, dtype and device are read.
            attention_mask: `(batch_size, past_len + q_len)` with 1 for tokens and 0 for padding, a prepared
                4-D mask (returned as is), or None.
            self_cache: the cache of the stack's token mixers (the self-attention half of an
                `EncoderDecoderCache`), or None.
            position_ids: `(batch_size or 1, q_len)` int64, or None.

        Returns:
            The mask for `config._attn_implementation` (a tensor, a flex `BlockMask`, or None when the backend
            needs none).
        """
        config = self.config
        overlay = TOKEN_MIXERS[self.token_mixer_name].mask_overlay
        mask_kwargs = {
            "config": config,
            "inputs_embeds": inputs_embeds,
            "attention_mask": attention_mask,
            "and_mask_function": overlay(config) if overlay is not None else None,
        }
        if self.is_causal:
            # A score bias travels in the mask, so SDPA must get a causal mask instead of its `is_causal` shortcut.
            return create_causal_mask(
                **mask_kwargs,
                **cache_field(self_cache),
                position_ids=position_ids,
                allow_is_causal_skip=not self.position_scheme_has_score_bias,
            )
        return create_bidirectional_mask(**mask_kwargs, **cache_field(self_cache))

    def _masks(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        self_cache: Cache | None,
        position_ids: torch.LongTensor,
        encoder_hidden_states: torch.Tensor | None,
        encoder_attention_mask: torch.Tensor | None,
    ) -> tuple:
        """The backend-specific self-attention mask (`self_attention_mask`) and cross-attention mask (or None)."""
        self_mask = self.self_attention_mask(inputs_embeds, attention_mask, self_cache, position_ids)
        cross_mask = None
        if self.has_cross_attention:
            cross_mask = create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=encoder_attention_mask,
                encoder_hidden_states=encoder_hidden_states,
            )
        return self_mask, cross_mask


@dataclass
class StackInputs:
    """What a layer stack's `forward` receives besides the hidden states (prepared by `HfzooStack.forward`).

    Args:
        layer_kwargs: the keyword arguments of every `HfzooLayer` call: `attention_mask` (backend-specific
            self-attention mask), `cache`, `encoder_hidden_states`, `encoder_attention_mask`,
            `padding_mask`, the position inputs (`position_embeddings`, `position_bias`) and backend options.
        attention_mask: the stack's input mask as given: `(batch_size, past_len + seq_len)` (1 = token), a
            prepared 4-D mask, or None.
        padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.
        position_ids: `(batch_size or 1, seq_len)` int64.
        cache: the cache, or None.
        cross_attention_memories: with transparent attention (Bapna et al. 2018), what each cross-attention reads
            of the encoder: `(batch_size, num_cross_attentions, src_len, hidden_size)`, indexed by the
            cross-attention's `layer_idx`; else None (every cross-attention reads `encoder_hidden_states`).
        layer_outputs: a list the standard layer stack appends each layer's output to (but the last), for an
            encoder feeding transparent attention; else None.
    """

    layer_kwargs: dict[str, Any]
    attention_mask: torch.Tensor | None
    padding_mask: torch.Tensor | None
    position_ids: torch.Tensor
    cache: Cache | None
    cross_attention_memories: torch.Tensor | None = None
    layer_outputs: list[torch.Tensor] | None = None


class StandardLayerStack(nn.Module):
    """The Transformer's layer stack: every layer once, in order (`layer_stack="standard"`). No parameters.

    The protocol of a `LAYER_STACKS` module (`__init__(config, layout)`):

    - `layer_plan(config, layout, block_size) -> list[int | None]` (static): the layers the stack builds, as
      indices into its block of `layout.num_layers` layers (copies are tied to the first copy) or None for
      a standard `"sf"` layer of the layer stack's own;
    - `output_attention_mask(attention_mask)`: the padding mask of the stack's outputs;
    - `layer_lengths(config, layout, seq_len) -> (list[(q_len, kv_len)], out_len)` and
      `weights_per_token(config, layout)` (static): the sequence lengths each built layer runs at and the
      module's own matrix-product weights per input token, for `hfzoo.models.flops`;
    - `forward(stack, hidden_states, inputs) -> (hidden_states, extra)`: run `stack.layers` (the
      `HfzooStack`; `inputs` a `StackInputs`); `extra` is what the heads need from the stack (the Universal
      Transformer's ponder cost), or None.

    Args:
        config: an hfzoo config.
        layout: the stack's `StackLayout`.
    """

    def __init__(self, config, layout: StackLayout) -> None:
        super().__init__()

    @staticmethod
    def layer_plan(config, layout: StackLayout, block_size: int) -> list[int | None]:
        """The block's layers, each once."""
        return list(range(block_size))

    @staticmethod
    def output_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Every position is kept: the input's mask."""
        return attention_mask

    @staticmethod
    def layer_lengths(config, layout: StackLayout, seq_len: int) -> tuple[list[tuple[int, int]], int]:
        """Every layer runs at the input's length: `([(seq_len, seq_len)] * layers, seq_len)`."""
        return [(seq_len, seq_len)] * len(layout.layer_plan(config)), seq_len

    @staticmethod
    def weights_per_token(config, layout: StackLayout) -> int:
        """No weights of its own."""
        return 0

    def forward(self, stack, hidden_states: torch.Tensor, inputs: StackInputs) -> tuple[torch.Tensor, None]:
        """`hidden_states` `(batch_size, seq_len, hidden_size)` through every layer of `stack.layers`.

        With `inputs.cross_attention_memories`, each layer's cross-attention reads its own combination of the
        encoder outputs (transparent attention); with `inputs.layer_outputs`, the outputs of every layer but the
        last are appended to it. With `stack.value_residual`, each token mixer gets it as `value_residual`
        (bound to this pass's first values and its index); with `stack.unet_skips`, the outputs of the first
        `L // 2` layers are kept and added, weighted, to the inputs of their mirrors L-1-i
        (`hfzoo.modules.connections`).
        """
        memories, outputs = inputs.cross_attention_memories, inputs.layer_outputs
        num_layers = len(stack.layers)
        skips = []  # U-Net: outputs of the first half's layers, in order
        first_values = {}  # value residual: the first token mixer's values of this forward pass
        for i, layer in enumerate(stack.layers):
            layer_kwargs = inputs.layer_kwargs
            cross_attn = getattr(layer, "cross_attn", None)
            if memories is not None and cross_attn is not None:
                layer_kwargs = {**layer_kwargs, "encoder_hidden_states": memories[:, cross_attn.layer_idx]}
            self_attn = getattr(layer, "self_attn", None)
            if stack.value_residual is not None and self_attn is not None:
                mix = partial(stack.value_residual, first_values, self_attn.layer_idx)
                layer_kwargs = {**layer_kwargs, "value_residual": mix}
            source = UNetSkips.mirror(num_layers, i) if stack.unet_skips is not None else None
            if source is not None:
                hidden_states = stack.unet_skips(hidden_states, skips[source], source)
            hidden_states = layer(hidden_states, **layer_kwargs)
            if stack.unet_skips is not None and i < num_layers // 2:
                skips.append(hidden_states)
            if outputs is not None and i < num_layers - 1:
                outputs.append(hidden_states)
        return hidden_states, None


@dataclass(frozen=True)
class LayerStack:
    """A `LAYER_STACKS` entry: a layer-stack module and where it is defined (read by the config validation).

    Args:
        module: the class, built as `module(config, layout)` on each stack using it (protocol:
            `StandardLayerStack`).
        causal: defined in a causal stack (decoder, decoder side of the encoder-decoder).
        bidirectional: defined in a bidirectional stack.
        kv_cache: supports incremental decoding with a KV cache in a causal stack.
        config_fields: config fields only this layer stack reads; refused at a non-default value when no
            stack uses it.
        check_config: called as `check_config(config, [layout])` for each stack using the entry when the config
            is built (before the stack's layers are checked), to refuse bad values with a `ValueError` naming the
            field; or None.
        extra_output: the name under which the module's second output (`forward`'s `extra`) is recorded for
            the heads' auxiliary losses (`HfzooPreTrainedModel._can_record_outputs`), or None.
        layer_connections: the module applies value residual learning and U-Net skips (`config.value_residual`,
            `config.unet_skips`, `hfzoo.modules.connections`); if False they are refused with `reason`.
        reason: why the connections are undefined for this layer stack (ends the config's refusal).
    """

    module: type[nn.Module]
    causal: bool = True
    bidirectional: bool = True
    kv_cache: bool = True
    config_fields: tuple[str, ...] = ()
    check_config: Callable[[Any, list[StackLayout]], None] | None = None
    extra_output: str | None = None
    layer_connections: bool = False
    reason: str = ""


#: `config.layer_stack` (and the encoder-decoder's `decoder_layer_stack`) -> how a stack applies its layers.
LAYER_STACKS = {
    "standard": LayerStack(StandardLayerStack, layer_connections=True),  # Vaswani et al. 2017
    # Dehghani et al. 2019: one block applied recurrently, ACT halting (Graves 2016); tensor2tensor's reference
    "universal": LayerStack(
        UniversalTransformerLayerStack,
        config_fields=UniversalTransformerLayerStack.config_fields,
        check_config=UniversalTransformerLayerStack.check_config,
        extra_output="ponder_cost",
        reason="it applies one block recurrently, each position halting after its own number of steps, so "
        "there is no fixed first layer whose values to share nor a fixed depth to mirror the layers around",
    ),
    # Dai et al. 2020: pooling between blocks (stride 2), up-sampling for per-token outputs; no causal form
    "funnel": LayerStack(
        FunnelLayerStack,
        causal=False,
        config_fields=FunnelLayerStack.config_fields,
        check_config=FunnelLayerStack.check_config,
        reason="it pools the sequence between blocks, so the first layer's values and the first half's outputs "
        "are longer than the later layers they would be added to",
    ),
}

#: `config.block_sharing` -> the stacks whose layers share one set of parameters (ALBERT, Lan et al. 2020).
#: `encoder` and `decoder` exist for the encoder-decoder only (validated in `HfzooConfig`).
BLOCK_SHARING = {
    "none": (),
    "all": ("encoder", "decoder"),
    "encoder": ("encoder",),
    "decoder": ("decoder",),
}

#: `config.layer_type` -> the class of every layer of the stacks (built as `cls(config, layer_idx, is_causal=...,
#: has_cross_attention=..., sublayers=..., token_mixer=..., mixer_idx=..., ffn_idx=...)`, with a static
#: `num_cache_layers(sublayers, is_causal)` and optionally a static `check_config(config)` run when the config is
#: built).
LAYER_TYPES = {
    "transformer": HfzooLayer,  # token mixer, (cross-attention,) feed-forward; `sublayer_pattern`
    "evolved_transformer": EvolvedTransformerLayer,  # So et al. 2019's searched encoder / decoder cells
}


def check_layer_connections(config, layout: StackLayout) -> None:
    """Refuse value residual learning / U-Net skips (`hfzoo.modules.connections`) where a stack does not define them.

    Called by the config validation for each stack, after its layer stack and token mixer are checked.
    Value residual learning needs the standard layer stack (a `LAYER_STACKS` entry with `layer_connections`),
    Transformer layers (`layer_type="transformer"`: the Evolved Transformer's cells have several branches per
    layer), a token mixer with values (`TokenMixer.values`) and at least two token mixers (the first gives its
    values, the others mix them in). U-Net skips need the standard layer stack and at least two layers. Block
    sharing keeps both: the first application gives the values and the weights belong to the stack.

    Args:
        config: an hfzoo config.
        layout: one of its `StackLayout`s.

    Raises:
        ValueError: a non-boolean value, or a switch set where the stack does not define it (naming the field, the
            value and what is allowed).
    """
    for field in ("value_residual", "unet_skips"):
        if not isinstance(getattr(config, field), bool):
            raise ValueError(f"{field} must be True or False, got {getattr(config, field)!r}")
    entry = LAYER_STACKS[layout.layer_stack]
    switches = [field for field in ("value_residual", "unet_skips") if getattr(config, field)]
    if switches and not entry.layer_connections:
        allowed = [name for name, other in LAYER_STACKS.items() if other.layer_connections]
        raise ValueError(
            f"{switches[0]}=True is not defined for {layout.layer_stack_field}={layout.layer_stack!r} "
            f"({entry.reason}); use {layout.layer_stack_field} in {allowed} or {switches[0]}=False"
        )
    sublayers = layout.sublayers(config)
    if config.value_residual:
        if LAYER_TYPES[config.layer_type] is not HfzooLayer:
            raise ValueError(
                f"value_residual=True is not defined for layer_type={config.layer_type!r} (its cells have several "
                "branches per layer, not one token mixer's values); use layer_type='transformer' or "
                "value_residual=False"
            )
        if not TOKEN_MIXERS[layout.token_mixer].values:
            allowed = [name for name, mixer in TOKEN_MIXERS.items() if mixer.values]
            raise ValueError(
                f"value_residual=True mixes the first token mixer's values into the later ones', but "
                f"{layout.token_mixer_field}={layout.token_mixer!r} has no per-head values to mix; choose "
                f"{layout.token_mixer_field} in {allowed} or value_residual=False"
            )
        mixers = sum("s" in layer for layer in sublayers)
        if mixers < 2:
            raise ValueError(
                f"value_residual=True needs at least 2 token mixers in the {layout.name} (the first gives its values "
                f"to the later ones), but {layout.num_layers_field}={layout.num_layers} with "
                f"sublayer_pattern={config.sublayer_pattern!r} gives it {mixers}; use more layers or "
                "value_residual=False"
            )
    if config.unet_skips and len(sublayers) < 2:
        raise ValueError(
            f"unet_skips=True connects layer i of the first half to layer L-1-i of the second, but the {layout.name} "
            f"has {len(sublayers)} layer ({layout.num_layers_field}={layout.num_layers}); use at least 2 layers or "
            "unet_skips=False"
        )
