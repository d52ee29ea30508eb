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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

from .embeddings import TokenEmbedding
from .experts import token_padding_mask
from .layer import NORM_POSITIONS, HfzooLayer, layer_sublayers
from .norms import build_norm
from .positions import (
    ATTENTION_SCORE_BIASES,
    ROTARY_POSITION_EMBEDDINGS,
    build_position_embedding,
    build_stack_score_bias,
)


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
    """

    name: str
    num_layers: int
    num_layers_field: str
    is_causal: bool
    has_cross_attention: bool
    token_mixer: str
    token_mixer_field: str = "token_mixer"

    def sublayers(self, config) -> list[str]:
        """The sublayers of each layer (`hfzoo.modules.layer.layer_sublayers` of `config.sublayer_pattern`)."""
        return layer_sublayers(config.sublayer_pattern, self.num_layers)


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
    `config.embedding_norm`, else None), `embed_dropout`, `layers` (`HfzooLayer`s) and
    `norm` (the final norm when the norm placement has one, else an identity). Flags: `is_causal`,
    `has_cross_attention` and `shares_layers` (`config.block_sharing` covers this stack).

    The layers follow `config.sublayer_pattern` (`StackLayout.sublayers`): each token mixer gets the next
    KV-cache layer index (`mixer_idx`, 0, 1, ... over the stack's token mixers, so a cache holds one layer
    per token mixer and the cross-attention after it) and each feed-forward the next feed-forward index
    (which places the experts).

    Args:
        config: an hfzoo config.
        layout: the stack's `StackLayout` (depth, direction, cross-attention, token mixer).
        embed_tokens: the token embedding module to use (default: a new `TokenEmbedding`).

    Raises:
        ValueError: block sharing over layers whose parameters differ (a per-layer setting).
    """

    def __init__(self, config, layout: StackLayout, embed_tokens: nn.Module | None = None) -> None:
        super().__init__(config)
        self.embed_tokens = embed_tokens if embed_tokens is not None else TokenEmbedding(config)
        self.is_causal = is_causal = layout.is_causal
        self.has_cross_attention = layout.has_cross_attention
        self.shares_layers = layout.name in BLOCK_SHARING[config.block_sharing]
        self.embed_positions = build_position_embedding(config)
        # Position schemes computed once per stack and handed to every layer's self-attention.
        rotary = ROTARY_POSITION_EMBEDDINGS.get(config.position_embedding_type)
        self.rotary_emb = rotary(config) if rotary is not None else None
        self.relative_attention_bias = build_stack_score_bias(config, bidirectional=not is_causal)
        type_vocab_size = getattr(config, "type_vocab_size", 0)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, config.hidden_size) if type_vocab_size else None
        self.embed_norm = build_norm(config) if config.embedding_norm else None
        self.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
        layers, mixer_idx, ffn_idx = [], 0, 0
        for i, sublayers in enumerate(layout.sublayers(config)):
            layers.append(
                HfzooLayer(
                    config,
                    i,
                    is_causal=is_causal,
                    has_cross_attention=layout.has_cross_attention,
                    sublayers=sublayers,
                    token_mixer=layout.token_mixer,
                    mixer_idx=mixer_idx,
                    ffn_idx=ffn_idx,
                )
            )
            mixer_idx += "s" in sublayers
            ffn_idx += "f" in sublayers
        self.layers = nn.ModuleList(layers)
        self.norm = build_norm(config) if NORM_POSITIONS[config.norm_position].final_norm else nn.Identity()
        if self.shares_layers:
            first = [(name, p.shape) for name, p in self.layers[0].named_parameters()]
            for i, layer in enumerate(self.layers):
                if [(name, p.shape) for name, p in layer.named_parameters()] != first:
                    raise ValueError(
                        f"block_sharing={config.block_sharing!r}: layer {i} has different parameters than layer "
                        "0, so one set of parameters cannot serve every layer; use block_sharing='none'"
                    )

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """Block sharing's ties: `{"layers.i.<param>": "layers.0.<param>"}` for i >= 1, or `{}`.

        Empty while the stack is being built, and when `config.block_sharing` does not cover it.
        """
        layers = getattr(self, "layers", None)
        if not getattr(self, "shares_layers", False) or layers is None:
            return {}
        names = [name for name, _ in layers[0].named_parameters()]
        return {f"layers.{i}.{name}": f"layers.0.{name}" for i in range(1, len(layers)) for name in names}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """Embed the inputs and run the layers.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)` with 1 for tokens and 0 for padding, or a
                prepared 4-D mask.
            position_ids: `(batch_size, seq_len)` int64; default `past_len ... past_len + seq_len - 1`.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (stacks with token types; default 0).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            past_key_values: a `Cache` (an `EncoderDecoderCache` for cross-attending stacks). Also how
                PEFT prefix tuning hands prefix keys/values to any stack, bidirectional ones included.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` for cross-attention.
            encoder_attention_mask: `(batch_size, src_len)` padding mask of the encoder outputs.
            use_cache: create a cache when none is given (causal stacks only).
            **kwargs: attention-backend options.

        Returns:
            `BaseModelOutputWithPastAndCrossAttentions` with `last_hidden_state`
            `(batch_size, seq_len, hidden_size)` and `past_key_values`.

        Raises:
            ValueError: both or neither of `input_ids`/`inputs_embeds`; a sequence longer than
                `max_position_embeddings` with absolute positions; cross-attention without encoder states.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        if self.has_cross_attention and encoder_hidden_states is None:
            raise ValueError("this stack cross-attends: encoder_hidden_states is required")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None and self.is_causal:
            # No config: the caches grow one layer per layer index, whatever the stack's depth.
            past_key_values = (
                EncoderDecoderCache(DynamicCache(), DynamicCache()) if self.has_cross_attention else DynamicCache()
            )
        self_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        past_length = self_cache.get_seq_length() if self_cache is not None else 0
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
        padding_mask = token_padding_mask(attention_mask, seq_length)  # for token mixers and expert routing
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask=self_mask,
                past_key_values=past_key_values,
                encoder_hidden_states=encoder_hidden_states,
                encoder_attention_mask=cross_mask,
                padding_mask=padding_mask,
                **position_inputs,
                **kwargs,
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, past_key_values=past_key_values
        )

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
            hidden_states = hidden_states + self.token_type_embeddings(token_type_ids)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(hidden_states)
        return self.embed_dropout(hidden_states)

    def _position_inputs(
        self, position_ids: torch.LongTensor, past_length: int, seq_length: int, kv_length: int
    ) -> dict:
        """Rotary angles (`position_embeddings`) and a shared score bias (`position_bias`), computed once per call.

        Every layer's token mixer receives them (cross-attention ignores them). The bias covers `kv_length`
        keys: `past_length + seq_length`, or all the slots of a static cache (the empty ones are masked).
        """
        position_inputs = {}
        if self.rotary_emb is not None:
            position_inputs["position_embeddings"] = self.rotary_emb(position_ids)
        if self.relative_attention_bias is not None:
            key_positions = torch.arange(kv_length, device=position_ids.device)
            query_positions = torch.arange(seq_length, device=position_ids.device) + past_length
            position_inputs["position_bias"] = self.relative_attention_bias(query_positions, key_positions)
        return position_inputs

    def _masks(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        self_cache: Cache | None,
        position_ids: torch.LongTensor,
        encoder_hidden_states: torch.Tensor | None,
        encoder_attention_mask: torch.Tensor | None,
    ) -> tuple:
        """The backend-specific self-attention mask (causal or bidirectional) and cross-attention mask (or None)."""
        config = self.config
        mask_kwargs = {"config": config, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask}
        if self.is_causal:
            # A score bias travels in the mask, so SDPA must get a causal mask instead of its `is_causal` shortcut.
            self_mask = create_causal_mask(
                **mask_kwargs,
                past_key_values=self_cache,
                position_ids=position_ids,
                allow_is_causal_skip=config.position_embedding_type not in ATTENTION_SCORE_BIASES,
            )
        else:
            self_mask = create_bidirectional_mask(**mask_kwargs, past_key_values=self_cache)
        cross_mask = None
        if self.has_cross_attention:
            cross_mask = create_bidirectional_mask(
                config=config,
                inputs_embeds=inputs_embeds,
                attention_mask=encoder_attention_mask,
                encoder_hidden_states=encoder_hidden_states,
            )
        return self_mask, cross_mask


#: `config.block_sharing` -> the stacks whose layers share one set of parameters (ALBERT, Lan et al. 2020).
#: `encoder` and `decoder` exist for the encoder-decoder only (validated in `HfzooConfig`).
BLOCK_SHARING = {
    "none": (),
    "all": ("encoder", "decoder"),
    "encoder": ("encoder",),
    "decoder": ("decoder",),
}
