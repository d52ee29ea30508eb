"""A stack of Transformer layers with its embeddings: the body shared by every hfzoo family.

`TransformerStack` is token embeddings (possibly shared with another stack), absolute positions,
optional token-type (segment) embeddings, `num_layers` `HfzooLayer`s and a final norm. The family
decides only whether self-attention is causal and whether the layers cross-attend to an encoder:

- decoder-only model: one causal stack;
- encoder model: one bidirectional stack (with token types);
- encoder-decoder: a bidirectional stack and a causal stack with cross-attention, sharing embeddings.

Block sharing (`config.block_sharing`, ALBERT: Lan et al. 2020 §3.1; options in `BLOCK_SHARING` at the
bottom) keeps `num_layers` distinct `HfzooLayer` modules, each with its own `layer_idx`, and ties every
parameter of layers 1..N-1 to layer 0's through the model's `_tied_weights_keys`
(`shared_layer_tied_keys`). So the KV cache has one layer per application, gradient checkpointing wraps
each application, checkpoints store layer 0 only, and DeepSpeed ZeRO-3 partitions each tensor once.

`stack_forward` is the one forward pass; the base models of the decoder and encoder families call it
on themselves (they carry the same attributes), so their checkpoints keep flat key names
(`model.embed_tokens`, `model.layers.N`, `model.norm`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

from .experts import token_padding_mask
from .layer import NORM_POSITIONS, HfzooLayer
from .norms import build_norm
from .positions import (
    ATTENTION_SCORE_BIASES,
    ROTARY_POSITION_EMBEDDINGS,
    build_position_embedding,
    build_stack_score_bias,
    token_positions,
)


def build_stack_modules(
    module: nn.Module, config, num_layers: int, is_causal: bool, has_cross_attention: bool = False
) -> None:
    """Create a stack's submodules on `module`: positions, token types, dropout, layers, final norm.

    Sets `embed_positions` (absolute positions, or None), `rotary_emb` (rotary, or None),
    `relative_attention_bias` (a score bias the scheme shares across the stack's layers,
    `hfzoo.modules.positions.build_stack_score_bias`; else None), `token_type_embeddings` (when
    `config.type_vocab_size > 0`, else None), `embed_dropout`, `layers` (`num_layers` `HfzooLayer`s) and
    `norm` (the final norm when the norm placement has one, else an identity), `embed_norm` (a norm
    of the summed embeddings when `config.embedding_norm`, else None), plus the flags `is_causal`,
    `has_cross_attention` and `shares_layers` (`config.block_sharing` covers this stack; the model then declares
    `shared_layer_tied_keys`). Token embeddings (`hfzoo.modules.embeddings.TokenEmbedding`) are set by
    the caller (they may be shared).

    Args:
        module: the model or stack to populate.
        config: an hfzoo config.
        num_layers: number of layers.
        is_causal: causal self-attention.
        has_cross_attention: layers attend to encoder outputs.

    Raises:
        ValueError: block sharing over layers whose parameters differ (a per-layer setting).
    """
    module.is_causal = is_causal
    module.has_cross_attention = has_cross_attention
    # The encoder-decoder's causal stack is its "decoder"; a single-stack family's stack counts as both.
    module.shares_layers = ("decoder" if is_causal else "encoder") in BLOCK_SHARING[config.block_sharing]
    module.embed_positions = build_position_embedding(config)
    # Position schemes computed once per stack and handed to every layer's self-attention.
    kind = config.position_embedding_type
    rotary = ROTARY_POSITION_EMBEDDINGS.get(kind)
    module.rotary_emb = rotary(config) if rotary is not None else None
    module.relative_attention_bias = build_stack_score_bias(config, bidirectional=not is_causal)
    type_vocab_size = getattr(config, "type_vocab_size", 0)
    module.token_type_embeddings = nn.Embedding(type_vocab_size, config.hidden_size) if type_vocab_size else None
    module.embed_norm = build_norm(config) if config.embedding_norm else None
    module.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
    module.layers = nn.ModuleList(
        [HfzooLayer(config, i, is_causal=is_causal, has_cross_attention=has_cross_attention) for i in range(num_layers)]
    )
    module.norm = build_norm(config) if NORM_POSITIONS[config.norm_position].final_norm else nn.Identity()
    if module.shares_layers:
        first = [(name, p.shape) for name, p in module.layers[0].named_parameters()]
        for i, layer in enumerate(module.layers):
            if [(name, p.shape) for name, p in layer.named_parameters()] != first:
                raise ValueError(
                    f"block_sharing={config.block_sharing!r}: layer {i} has different parameters than layer 0, "
                    "so one set of parameters cannot serve every layer; use block_sharing='none'"
                )


def shared_layer_tied_keys(module: nn.Module) -> dict[str, str]:
    """`_tied_weights_keys` entries tying every layer of a block-sharing stack to its layer 0.

    Args:
        module: a stack built by `build_stack_modules` (or a model still being built: then `{}`).

    Returns:
        `{"layers.i.<param>": "layers.0.<param>"}` for i >= 1 and every parameter of layer 0, or `{}`
        when the stack does not share its layers.
    """
    layers = getattr(module, "layers", None)
    if not getattr(module, "shares_layers", False) or layers is None:
        return {}
    names = [name for name, _ in layers[0].named_parameters()]
    return {f"layers.{i}.{name}": f"layers.0.{name}" for i in range(1, len(layers)) for name in names}


def stack_forward(
    module: nn.Module,
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
    """Embed the inputs and run the layers of a stack built by `build_stack_modules`.

    Args:
        module: the stack (has `config`, `embed_tokens` and the attributes of `build_stack_modules`).
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
    config = module.config
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids or inputs_embeds")
    if module.has_cross_attention and encoder_hidden_states is None:
        raise ValueError("this stack cross-attends: encoder_hidden_states is required")
    if inputs_embeds is None:
        inputs_embeds = module.embed_tokens(input_ids)
    if use_cache and past_key_values is None and module.is_causal:
        # No config: the caches grow one layer per layer index, whatever the stack's depth.
        past_key_values = (
            EncoderDecoderCache(DynamicCache(), DynamicCache()) if module.has_cross_attention else DynamicCache()
        )
    self_cache = (
        past_key_values.self_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else past_key_values
    )
    past_length = self_cache.get_seq_length() if self_cache is not None else 0
    seq_length = inputs_embeds.shape[1]
    if position_ids is None:
        position_ids = torch.arange(past_length, past_length + seq_length, device=inputs_embeds.device)[None]

    hidden_states = inputs_embeds
    if module.embed_positions is not None:
        if past_length + seq_length > config.max_position_embeddings:
            raise ValueError(
                f"sequence of {past_length + seq_length} tokens is longer than "
                f"max_position_embeddings={config.max_position_embeddings}"
            )
        hidden_states = hidden_states + module.embed_positions(position_ids).to(hidden_states.dtype)
    if module.token_type_embeddings is not None:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(position_ids).expand(inputs_embeds.shape[0], -1)
        hidden_states = hidden_states + module.token_type_embeddings(token_type_ids)
    if module.embed_norm is not None:
        hidden_states = module.embed_norm(hidden_states)
    hidden_states = module.embed_dropout(hidden_states)

    # Rotary angles and a shared score bias, computed once for all layers (self-attention only).
    position_kwargs = {}
    if module.rotary_emb is not None:
        position_kwargs["position_embeddings"] = module.rotary_emb(position_ids)
    if module.relative_attention_bias is not None:
        positions = token_positions(seq_length, past_length + seq_length, inputs_embeds.device)
        position_kwargs["position_bias"] = module.relative_attention_bias(*positions)

    mask_kwargs = {"config": config, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask}
    if module.is_causal:
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
    if module.has_cross_attention:
        cross_mask = create_bidirectional_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
    padding_mask = token_padding_mask(attention_mask, seq_length)  # for mixture-of-experts routing
    for layer in module.layers:
        hidden_states = layer(
            hidden_states,
            attention_mask=self_mask,
            past_key_values=past_key_values,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=cross_mask,
            padding_mask=padding_mask,
            **position_kwargs,
            **kwargs,
        )
    hidden_states = module.norm(hidden_states)
    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, past_key_values=past_key_values)


#: `config.block_sharing` -> the stacks whose layers share one set of parameters (ALBERT, Lan et al. 2020).
#: `encoder` and `decoder` exist for the encoder-decoder only (validated in `HfzooConfig`).
BLOCK_SHARING = {
    "none": (),
    "all": ("encoder", "decoder"),
    "encoder": ("encoder",),
    "decoder": ("decoder",),
}
