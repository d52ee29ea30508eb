"""The hfzoo encoder-decoder family: a bidirectional encoder stack, a causal decoder stack with cross-attention.

The model has three vocabulary matrices, each tied or not (Narang et al. 2021, "embedding" rows):
the encoder input `model.shared` (= `model.encoder.embed_tokens`), the decoder input
`model.decoder.embed_tokens` (the same module as `model.shared` when `tie_encoder_decoder_embeddings`,
as in Vaswani et al. 2017 §3.4 and T5) and the output projection `lm_head` (tied to the decoder input
when `tie_word_embeddings`). Generation uses transformers' `EncoderDecoderCache`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutput,
    Seq2SeqMoEModelOutput,
)
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ...compat import cache_field, output_cache
from ...modeling_utils import (
    HfzooGenerationMixin,
    HfzooPreTrainedModel,
    MoeTokenClassifierOutput,
    Seq2SeqMoELMOutput,
    Seq2SeqMoEQuestionAnsweringModelOutput,
    Seq2SeqMoESequenceClassifierOutput,
    sequence_classification_loss,
)
from ...modules.attention import HfzooAttention
from ...modules.embeddings import (
    build_token_embedding,
    build_vocab_projection,
    model_value_checks_enabled,
    tied_embedding_keys,
)
from ...modules.experts import HfzooRouter
from ...modules.heads import (
    SequenceClassificationHead,
    check_answer_positions,
    check_classification_labels,
    last_eos_pool,
)
from ...modules.stack import LAYER_TYPES, HfzooStack, HfzooStackOutput
from ...modules.universal import UniversalTransformerLayerStack
from .configuration_encoder_decoder import HfzooEncoderDecoderConfig

#: The fields of `Seq2SeqMoEModelOutput` that the encoder-decoder's heads return as the model gave them.
SEQ2SEQ_CARRIED_FIELDS = (
    "decoder_hidden_states",
    "decoder_attentions",
    "cross_attentions",
    "encoder_last_hidden_state",
    "encoder_hidden_states",
    "encoder_attentions",
)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: `[start, y_0, ..., y_{n-2}]`, with -100 replaced by padding (as T5 does).

    Args:
        labels: `(batch_size, tgt_len)` int64 target ids (-100 = ignored).
        pad_token_id: id written where a label is -100.
        decoder_start_token_id: the first decoder input.

    Returns:
        `(batch_size, tgt_len)` int64 decoder input ids.

    Raises:
        ValueError: `pad_token_id` or `decoder_start_token_id` is None.
    """
    if decoder_start_token_id is None or pad_token_id is None:
        raise ValueError("decoder_start_token_id and pad_token_id must be set to shift labels into decoder inputs")
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_token_id)


def split_prefix_cache(cache: Cache, num_encoder_layers: int) -> tuple[DynamicCache, EncoderDecoderCache]:
    """Split a prefix for both stacks (encoder layers first, then decoder layers) into one cache per stack.

    Prefix tuning (Li & Liang 2021, §4.2: "we prepend prefixes for both encoder and decoder") gives
    every self-attention layer of both stacks learned keys/values. PEFT hands a model one cache; hfzoo's
    encoder-decoder accepts one holding `num_hidden_layers + num_decoder_layers` layers and routes
    the first `num_hidden_layers` to the encoder and the rest to the decoder.

    Args:
        cache: a cache whose layer `i` holds keys/values `(batch_size, num_heads, prefix_len, head_dim)`.
        num_encoder_layers: number of encoder layers (the first layers of `cache`).

    Returns:
        `(encoder_cache, decoder_cache)`: a `DynamicCache` for the encoder and an `EncoderDecoderCache`
        (self-attention prefix, empty cross-attention cache) for the decoder, layers re-indexed from 0.
    """
    encoder, decoder = DynamicCache(), DynamicCache()
    for index, layer in enumerate(cache.layers):
        target, target_index = (encoder, index) if index < num_encoder_layers else (decoder, index - num_encoder_layers)
        target.update(layer.keys, layer.values, target_index)
    return encoder, EncoderDecoderCache(decoder, DynamicCache())


def both_stacks_prefix(cache: Cache | None, config) -> Cache | None:
    """The cache holding a prefix for both stacks (see `split_prefix_cache`) in `cache`, or None.

    PEFT hands the prefix over as one cache of `num_hidden_layers + num_decoder_layers` layers: a
    `DynamicCache` (sequence classification), or for `SEQ_2_SEQ_LM` an `EncoderDecoderCache` whose
    self-attention cache holds those layers and whose cross-attention cache is empty. A generation cache
    holds `num_decoder_layers` self-attention layers, so it is never taken for one.

    Args:
        cache: the cache given to the model, or None.
        config: the model's `HfzooEncoderDecoderConfig`.

    Returns:
        The cache of `num_hidden_layers + num_decoder_layers` prefix layers, or None.
    """
    # The layer count first: it tells a generation cache (a static one included) apart without reading any
    # tensor, so compiled generation does not branch on data here.
    prefix = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    layers = getattr(prefix, "layers", None)
    if layers is None or len(layers) != config.num_hidden_layers + config.num_decoder_layers:
        return None
    if isinstance(cache, EncoderDecoderCache) and cache.cross_attention_cache.get_seq_length() > 0:
        return None
    return prefix if prefix.get_seq_length() > 0 else None


def with_prefix_columns(attention_mask: torch.Tensor | None, prefix_length: int, source_length: int):
    """The encoder's padding mask with `prefix_length` ones in front, unless it has them already (or is None).

    PEFT's sequence classification passes a mask covering prefix + source, its `SEQ_2_SEQ_LM` model one
    covering only the source; the encoder's keys are always prefix + source.

    Args:
        attention_mask: `(batch_size, source_length)` or `(batch_size, prefix_length + source_length)`, or None.
        prefix_length: prefix positions (tokens).
        source_length: source positions (tokens).

    Returns:
        `(batch_size, prefix_length + source_length)` mask, or None.
    """
    if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape[1] != source_length:
        return attention_mask
    ones = attention_mask.new_ones(attention_mask.shape[0], prefix_length)
    return torch.cat([ones, attention_mask], dim=1)


class HfzooEncoderDecoderPreTrainedModel(HfzooPreTrainedModel):
    """Base class of the encoder-decoder family's models (config class `HfzooEncoderDecoderConfig`)."""

    config_class = HfzooEncoderDecoderConfig
    config: HfzooEncoderDecoderConfig
    _can_record_outputs = {
        "hidden_states": list(LAYER_TYPES.values()),  # HfzooLayer, or another layer type's class
        "attentions": OutputRecorder(HfzooAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(HfzooAttention, index=1, layer_name="cross_attn"),
        "router_logits": OutputRecorder(HfzooRouter, index=0),
        "ponder_cost": OutputRecorder(UniversalTransformerLayerStack, index=1),
    }


class HfzooEncoderDecoderStack(HfzooStack, HfzooEncoderDecoderPreTrainedModel):
    """One side of the encoder-decoder, a `hfzoo.modules.stack.HfzooStack`: the encoder or the decoder.

    The encoder has `num_hidden_layers` bidirectional layers; the decoder `num_decoder_layers` causal
    layers with cross-attention. With `block_sharing` "all" or this side's name, the layers' parameters
    are tied to layer 0's.

    Args:
        config: an `HfzooEncoderDecoderConfig`.
        embed_tokens: this side's token embedding module (possibly the shared one).
        is_decoder: build the decoder side instead of the encoder side.
    """

    accepts_loss_kwargs = False  # no loss

    def __init__(self, config: HfzooEncoderDecoderConfig, embed_tokens: nn.Module, is_decoder: bool) -> None:
        encoder, decoder = config.stack_layouts()
        super().__init__(config, decoder if is_decoder else encoder, embed_tokens=embed_tokens)
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        encoder_layer_outputs: torch.Tensor | None = None,
        **kwargs,
    ) -> HfzooStackOutput:
        """Run this side; arguments and returns as `hfzoo.modules.stack.HfzooStack.forward`."""
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=use_cache if self.is_causal else None,
            encoder_layer_outputs=encoder_layer_outputs,
            **kwargs,
        )


class HfzooEncoderDecoderModel(HfzooEncoderDecoderPreTrainedModel):
    """The bare encoder-decoder (Vaswani et al. 2017): `shared` embeddings, `encoder`, `decoder`.

    `shared` is the encoder's input embedding; the decoder uses it too when
    `config.tie_encoder_decoder_embeddings`, else its own `decoder.embed_tokens`.

    Args:
        config: an `HfzooEncoderDecoderConfig`.
    """

    accepts_loss_kwargs = False  # no loss

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.shared = build_token_embedding(config)
        decoder_embeddings = self.shared if config.tie_encoder_decoder_embeddings else build_token_embedding(config)
        self.encoder = HfzooEncoderDecoderStack(config, self.shared, is_decoder=False)
        self.decoder = HfzooEncoderDecoderStack(config, decoder_embeddings, is_decoder=True)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """`encoder.embed_tokens` -> `shared`, and `decoder.embed_tokens` -> `shared` when tied."""
        keys = tied_embedding_keys(self.config, "encoder.embed_tokens", "shared")
        if self.config.tie_encoder_decoder_embeddings:
            keys.update(tied_embedding_keys(self.config, "decoder.embed_tokens", "shared"))
        return keys

    def get_input_embeddings(self) -> nn.Module:
        """Return the encoder's (shared) token embeddings."""
        return self.shared

    def set_input_embeddings(self, new_embeddings: nn.Module) -> None:
        """Replace the shared token embeddings (in the decoder too when `tie_encoder_decoder_embeddings`)."""
        self.shared = new_embeddings
        self.encoder.embed_tokens = new_embeddings
        if self.config.tie_encoder_decoder_embeddings:
            self.decoder.embed_tokens = new_embeddings

    def get_encoder(self, modality=None) -> HfzooEncoderDecoderStack:
        """Return the encoder stack (used by `generate` to encode once)."""
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqMoEModelOutput:
        """Encode the source (unless `encoder_outputs` are given) and decode the target.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids.
            attention_mask: `(batch_size, src_len)` source padding mask (1 = token).
            decoder_input_ids: `(batch_size, tgt_len)` int64 decoder inputs.
            decoder_attention_mask: `(batch_size, past_len + tgt_len)` decoder padding mask.
            encoder_outputs: precomputed encoder outputs (generation), `last_hidden_state` first.
            cache: an `EncoderDecoderCache` (generation, decoder prefix), or a prefix for both stacks: a
                cache of `num_hidden_layers + num_decoder_layers` layers (see `split_prefix_cache`;
                `attention_mask` then covers prefix + source tokens). Also accepted as `past_key_values`.
            inputs_embeds: `(batch_size, src_len, hidden_size)` instead of `input_ids`.
            decoder_inputs_embeds: `(batch_size, tgt_len, hidden_size)` instead of `decoder_input_ids`.
            decoder_position_ids: `(batch_size, tgt_len)` decoder positions.
            use_cache: return the decoder's cache.
            **kwargs: those of `hfzoo.modeling_utils.PASSED_DOWN_KWARGS` (`output_hidden_states`,
                `output_attentions`, ...); `IGNORED_KWARGS` are dropped, others raise `TypeError`.

        Returns:
            `Seq2SeqMoEModelOutput` (decoder `last_hidden_state` `(batch_size, tgt_len, hidden_size)`,
            `encoder_last_hidden_state` `(batch_size, src_len, hidden_size)`, caches, optional states,
            and with `output_router_logits` the `encoder_router_logits` / `decoder_router_logits`).
        """
        encoder_prefix = None
        prefix = both_stacks_prefix(cache, self.config)
        if prefix is not None:  # with `encoder_outputs` (generation) the encoder ran with its prefix already
            encoder_prefix, cache = split_prefix_cache(prefix, self.config.num_hidden_layers)
        if encoder_outputs is None:
            if encoder_prefix is not None:
                source_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
                attention_mask = with_prefix_columns(attention_mask, encoder_prefix.get_seq_length(), source_length)
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                cache=encoder_prefix,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, ModelOutput):  # a tuple; an output object keeps its layer_outputs
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        # The mask of the encoder's outputs (pooled by a funnel encoder, which returns the compressed sequence).
        attention_mask = self.encoder.output_attention_mask(attention_mask)
        source_length = encoder_outputs.last_hidden_state.shape[1]
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] > source_length:
            attention_mask = attention_mask[:, -source_length:]  # cross-attention sees the source, not the prefix
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            cache=cache,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            encoder_layer_outputs=encoder_outputs.get("layer_outputs"),  # transparent attention
            use_cache=use_cache,
            **kwargs,
        )
        outputs = Seq2SeqMoEModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **cache_field(output_cache(decoder_outputs)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            decoder_router_logits=decoder_outputs.get("router_logits"),
            encoder_router_logits=encoder_outputs.get("router_logits"),
        )
        for side, side_outputs in (("encoder", encoder_outputs), ("decoder", decoder_outputs)):
            if side_outputs.get("ponder_cost") is not None:  # Universal Transformer with ACT, when requested
                outputs[f"{side}_ponder_cost"] = side_outputs["ponder_cost"]
        return outputs


#: Weights of an encoder-decoder checkpoint that its token classifier leaves out when loading from it: the decoder
#: stack and the heads on it (the language model's, the sequence classifier's, the span head's).
DECODER_SIDE_KEYS = [r"(^|\.)decoder\.", r"^lm_head\.", r"^classifier\.(dense|out_proj)\.", r"^qa_outputs\."]


class HfzooEncoderDecoderEncoderModel(HfzooEncoderDecoderPreTrainedModel):
    """The encoder side of the encoder-decoder alone, as transformers' `T5EncoderModel`: `shared` and `encoder`.

    Loads from any checkpoint of the family (a pretrained `HfzooEncoderDecoderForConditionalGeneration`, ...),
    leaving the decoder and every head out without a warning (`DECODER_SIDE_KEYS`, and `classifier.`): the source's
    bidirectional states for feature extraction, a text encoder, or a per-token head
    (`HfzooEncoderDecoderForTokenClassification`).

    Args:
        config: an `HfzooEncoderDecoderConfig` (its decoder fields are kept, unused, so that the folder converts
            and loads as the whole model again).
    """

    accepts_loss_kwargs = False  # no loss
    _keys_to_ignore_on_load_unexpected = [*DECODER_SIDE_KEYS, r"^classifier\."]

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.shared = build_token_embedding(config)
        self.encoder = HfzooEncoderDecoderStack(config, self.shared, is_decoder=False)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """`encoder.embed_tokens` -> `shared`."""
        return tied_embedding_keys(self.config, "encoder.embed_tokens", "shared")

    def get_input_embeddings(self) -> nn.Module:
        """Return the encoder's (shared) token embeddings."""
        return self.shared

    def set_input_embeddings(self, new_embeddings: nn.Module) -> None:
        """Replace the shared token embeddings."""
        self.shared = new_embeddings
        self.encoder.embed_tokens = new_embeddings

    def get_encoder(self, modality=None) -> HfzooEncoderDecoderStack:
        """Return the encoder stack."""
        return self.encoder

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> HfzooStackOutput:
        """Encode the source.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, src_len)` source padding mask (1 = token).
            inputs_embeds: `(batch_size, src_len, hidden_size)` instead of `input_ids`.
            cache: a prefix for the encoder's layers (PEFT prefix tuning): a cache of `num_hidden_layers` layers (as
                `hfzoo.finetuning.adapters.prefix_num_layers` sizes it for the token classifier), or one for both
                stacks (`num_hidden_layers + num_decoder_layers` layers), whose encoder layers are used;
                `attention_mask` may cover prefix + source tokens. Also accepted as `past_key_values`.
            **kwargs: those of `hfzoo.modeling_utils.PASSED_DOWN_KWARGS` (`output_hidden_states`,
                `output_attentions`, ...); `IGNORED_KWARGS` are dropped, others raise `TypeError`.

        Returns:
            `HfzooStackOutput` (a `BaseModelOutput`) with `last_hidden_state` `(batch_size, src_len, hidden_size)`
            (after the encoder's final norm), and the states, attentions and routers' logits asked for.

        Raises:
            ValueError: see `hfzoo.modules.stack.HfzooStack.forward`.
        """
        prefix = both_stacks_prefix(cache, self.config)
        if prefix is not None:
            cache, _ = split_prefix_cache(prefix, self.config.num_hidden_layers)
        if cache is not None and cache.get_seq_length() > 0:
            source_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
            attention_mask = with_prefix_columns(attention_mask, cache.get_seq_length(), source_length)
        return self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache, **kwargs
        )


class HfzooEncoderDecoderForConditionalGeneration(HfzooEncoderDecoderPreTrainedModel, HfzooGenerationMixin):
    """Encoder-decoder with a language-modelling head: T5-style text-to-text (Raffel et al. 2020).

    `labels` are shifted right behind `decoder_start_token_id` to make the decoder inputs when none
    are given. With `tie_word_embeddings`, `lm_head` (`hfzoo.modules.embeddings.build_vocab_projection`)
    shares the decoder's input embedding (`model.shared` when `tie_encoder_decoder_embeddings`). With
    `num_softmaxes > 1` or `adaptive_softmax_cutoffs` the `logits` are log-probabilities (a mixture of
    softmaxes; the adaptive softmax), and the loss their negative log-likelihood.

    In training mode with `labels` the loss is computed in chunks of target tokens from the decoder's
    hidden states and `logits` is None (as `HfzooDecoderForCausalLM`; `skip_logits=False` asks for them).
    `resize_token_embeddings` resizes all three vocabulary matrices, tied or not.

    Args:
        config: an `HfzooEncoderDecoderConfig`.
    """

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooEncoderDecoderModel(config)
        self.lm_head = build_vocab_projection(config, bias=False, tied=config.tie_word_embeddings)
        self.post_init()

    def _generating_stack(self):
        """The stack `generate` extends the cache of: `self.model.decoder`."""
        return self.model.decoder

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """`lm_head` -> the decoder's input embedding when `tie_word_embeddings` (other ties are `model`'s)."""
        if not self.config.tie_word_embeddings:
            return {}
        source = "model.shared" if self.config.tie_encoder_decoder_embeddings else "model.decoder.embed_tokens"
        return tied_embedding_keys(self.config, "lm_head", source)

    def get_encoder(self, modality=None) -> HfzooEncoderDecoderStack:
        """Return the encoder stack (used by `generate`)."""
        return self.model.encoder

    def _prepare_text_encoder_decoder_kwargs_for_generation(
        self, inputs_tensor: torch.Tensor, model_kwargs: dict, model_input_name: str | None, generation_config
    ) -> dict:
        """Run the encoder before `generate`'s first step, with its prefix under PEFT's prefix tuning.

        transformers encodes the source once, before the decoder's first step, where PEFT's prefix is not yet
        given. Under PEFT's prefix tuning (`HfzooGenerationMixin._prefix_tuning_wrapper`) the encoder takes its
        share of the prefix (`split_prefix_cache` of PEFT's `get_prompt`), as in PEFT's forward pass;
        otherwise this is transformers' method.

        Args:
            inputs_tensor: `(batch_size, src_len)` source token ids (or embeddings).
            model_kwargs: `generate`'s model keyword arguments (`attention_mask`: the source's padding mask).
            model_input_name: the name of `inputs_tensor` (`input_ids` / `inputs_embeds`), or None.
            generation_config: the generation config (`output_attentions`, `output_hidden_states`).

        Returns:
            `model_kwargs` with `encoder_outputs`.
        """
        wrapper = self._prefix_tuning_wrapper()
        if wrapper is None:
            return super()._prepare_text_encoder_decoder_kwargs_for_generation(
                inputs_tensor, model_kwargs, model_input_name, generation_config
            )
        prefix = both_stacks_prefix(wrapper.get_prompt(inputs_tensor.shape[0]), self.config)
        if prefix is None:  # a prefix for the decoder only: nothing for the encoder
            return super()._prepare_text_encoder_decoder_kwargs_for_generation(
                inputs_tensor, model_kwargs, model_input_name, generation_config
            )
        encoder_prefix, _ = split_prefix_cache(prefix, self.config.num_hidden_layers)
        model_input_name = model_input_name or self.main_input_name
        mask = with_prefix_columns(
            model_kwargs.get("attention_mask"), encoder_prefix.get_seq_length(), inputs_tensor.shape[1]
        )
        model_kwargs["encoder_outputs"] = self.get_encoder()(
            **{model_input_name: inputs_tensor},
            attention_mask=mask,
            cache=encoder_prefix,
            output_attentions=generation_config.output_attentions,
            output_hidden_states=generation_config.output_hidden_states,
            return_dict=True,
        )
        return model_kwargs

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Shift `labels` right into decoder inputs (used by `DataCollatorForSeq2Seq`)."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        skip_logits: bool | None = None,
        **kwargs,
    ) -> Seq2SeqMoELMOutput:
        """Compute target-token logits and, with `labels`, the mean cross-entropy loss.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids.
            attention_mask: `(batch_size, src_len)` source padding mask (1 = token).
            decoder_input_ids: `(batch_size, tgt_len)` int64 decoder inputs (default: `labels` shifted right).
            decoder_attention_mask: `(batch_size, past_len + tgt_len)` decoder padding mask.
            encoder_outputs: precomputed encoder outputs (generation), `last_hidden_state` first.
            cache: an `EncoderDecoderCache` (generation, prefix tuning); also accepted as `past_key_values`.
            inputs_embeds: `(batch_size, src_len, hidden_size)` instead of `input_ids`.
            decoder_inputs_embeds: `(batch_size, tgt_len, hidden_size)` instead of `decoder_input_ids`.
            use_cache: return the decoder's cache.
            labels: `(batch_size, tgt_len)` int64 target ids (-100 ignored); position t's logits
                predict label t (the decoder inputs are the labels shifted right).
            skip_logits: compute the loss in chunks without returning logits; default: in training mode
                with labels.
            **kwargs: forwarded to the model (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                model, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the target tokens of the whole
                accumulated batch.

        Returns:
            `Seq2SeqMoELMOutput` (a `Seq2SeqMoEOutput`) with `logits` `(batch_size, tgt_len, vocab_size)`
            (None with `skip_logits`) and `loss` (float32, nats per target token). With experts, plus
            `aux_loss` (included in `loss`), its parts `encoder_aux_loss` / `decoder_aux_loss` /
            `encoder_z_loss` / `decoder_z_loss` (the encoder's are None when `encoder_outputs` are given),
            and with `output_router_logits`, `encoder_router_logits` / `decoder_router_logits`.
        """
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None and decoder_input_ids is None and decoder_inputs_embeds is None:
            decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        # unshifted targets: position t's logits predict label t (the decoder inputs are the labels shifted right)
        logits, loss = self._lm_loss(outputs.last_hidden_state, labels, num_items_in_batch, skip_logits)
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, decoder_attention_mask, return_router_logits, loss_share=share
        )
        return Seq2SeqMoELMOutput(
            loss=loss,
            logits=logits,
            **self._carried(outputs, *SEQ2SEQ_CARRIED_FIELDS),
            **moe,
        )


class HfzooEncoderDecoderForSequenceClassification(HfzooEncoderDecoderPreTrainedModel):
    """Encoder-decoder + classifier on the decoder's state at the last end-of-sequence token (as BART does).

    The decoder reads the source itself (decoder inputs = source shifted right when not given), and
    its state at the position of the source's final `eos_token_id` is classified.

    Args:
        config: an `HfzooEncoderDecoderConfig` (`num_labels`, `problem_type`, `eos_token_id`).
    """

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooEncoderDecoderModel(config)
        self.classifier = SequenceClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> Seq2SeqMoESequenceClassifierOutput:
        """Classify each source sequence.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids, each ending with `eos_token_id`.
            attention_mask: `(batch_size, src_len)` source padding mask.
            decoder_input_ids: `(batch_size, src_len)` decoder inputs (default: `input_ids` shifted right).
            decoder_attention_mask: decoder padding mask (default: `attention_mask`).
            labels: class ids `(batch_size,)`, or float targets (regression / multi-label).
            cache: PEFT prefix tuning's prefix for both stacks (see `split_prefix_cache`; `attention_mask`
                then covers prefix + source tokens), or None; also accepted as `past_key_values`.
            **kwargs: forwarded to the model (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                model, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) normalises the loss over the whole accumulated batch.

        Returns:
            `Seq2SeqMoESequenceClassifierOutput` (a `Seq2SeqSequenceClassifierOutput`) with `logits`
            `(batch_size, num_labels)` and `loss`; with experts, the fields of `Seq2SeqMoELMOutput`'s
            auxiliary losses (`aux_loss` included in `loss`).

        Raises:
            ValueError: a label outside `[0, num_labels)`; rows without an `eos_token_id` when pooling (both
                checked outside `caller_checked_ids()` only).
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(
                input_ids, self.config.pad_token_id, self.config.decoder_start_token_id
            )
            decoder_attention_mask = attention_mask
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        # As BART: the decoder reads the source shifted right, so its state at the position of the source's
        # last eos has seen the whole sequence; that state is classified.
        # a host-device sync on a GPU: skipped inside caller_checked_ids() (the GLUE loop checks its data first)
        if model_value_checks_enabled() and not input_ids.eq(self.config.eos_token_id).any(dim=-1).all():
            raise ValueError("every sequence needs an eos_token_id for encoder-decoder sequence classification")
        logits = self.classifier(last_eos_pool(hidden, input_ids, self.config.eos_token_id))
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(labels, logits, self.config, num_items_in_batch)
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, decoder_attention_mask, return_router_logits, loss_share=share
        )
        return Seq2SeqMoESequenceClassifierOutput(
            loss=loss,
            logits=logits,
            **self._carried(outputs, *SEQ2SEQ_CARRIED_FIELDS),
            **moe,
        )


class HfzooEncoderDecoderForQuestionAnswering(HfzooEncoderDecoderPreTrainedModel):
    """Encoder-decoder + a span-extraction head on the decoder's states, as transformers' `T5ForQuestionAnswering`.

    The decoder reads the source itself (decoder inputs = source shifted right when not given, as in
    `HfzooEncoderDecoderForSequenceClassification`), so its state at a position has seen the source up to that
    token through its own causal attention and the whole source through cross-attention; `qa_outputs`
    (`hidden_size` -> 2, start and end) scores each position as the start and as the end of the answer span
    (Devlin et al. 2019 §4.2's span scores). The loss is transformers' `ForQuestionAnsweringLoss` in float32, as
    the other families' span heads.

    Args:
        config: an `HfzooEncoderDecoderConfig`.
    """

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooEncoderDecoderModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> Seq2SeqMoEQuestionAnsweringModelOutput:
        """Score every source position as the start and as the end of the answer span.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids, question and context.
            attention_mask: `(batch_size, src_len)` source padding mask.
            decoder_input_ids: `(batch_size, src_len)` decoder inputs (default: `input_ids` shifted right behind
                `decoder_start_token_id`).
            decoder_attention_mask: decoder padding mask (default: none, as `T5ForQuestionAnswering`: the decoder
                reads the shifted source causally, so with right padding no real position sees a padding token;
                pad sources on the right).
            start_positions: `(batch_size,)` int64 index of the answer's first token; at or beyond the sequence
                length: left out of the loss (an answer truncated away).
            end_positions: `(batch_size,)` int64 index of the answer's last token (same convention).
            cache: PEFT prefix tuning's prefix for both stacks (see `split_prefix_cache`; `attention_mask` then
                covers prefix + source tokens), or None; also accepted as `past_key_values`.
            **kwargs: forwarded to the model (the keyword contract of `HfzooPreTrainedModel`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed losses by it instead of averaging
                over the rows; `output_router_logits` returns the routers' logits.

        Returns:
            `Seq2SeqMoEQuestionAnsweringModelOutput` (a `Seq2SeqQuestionAnsweringModelOutput`) with `start_logits`
            and `end_logits`, each `(batch_size, tgt_len)` in the model's dtype, and, given both positions, the
            float32 `loss` `(start_loss + end_loss) / 2`; with experts, the auxiliary losses of
            `Seq2SeqMoELMOutput` (`aux_loss` included in `loss`).

        Raises:
            ValueError: a negative start or end position (`check_answer_positions`).
        """
        check_answer_positions(start_positions, "start_positions")
        check_answer_positions(end_positions, "end_positions")
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if decoder_input_ids is None:  # as T5ForQuestionAnswering: no decoder mask unless given
            decoder_input_ids = shift_tokens_right(
                input_ids, self.config.pad_token_id, self.config.decoder_start_token_id
            )
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        return self._question_answering_output(
            self.qa_outputs(outputs.last_hidden_state),
            start_positions,
            end_positions,
            outputs,
            attention_mask,
            return_router_logits,
            num_items_in_batch,
            decoder_attention_mask=decoder_attention_mask,
            output_class=Seq2SeqMoEQuestionAnsweringModelOutput,
            carried=self._carried(outputs, *SEQ2SEQ_CARRIED_FIELDS),
        )


class HfzooEncoderDecoderForTokenClassification(HfzooEncoderDecoderPreTrainedModel):
    """The encoder side + a per-token linear classifier, as transformers' `T5ForTokenClassification`.

    Each source token is classified from the encoder's bidirectional state (`HfzooEncoderDecoderEncoderModel`: no
    decoder), after dropout (`classifier_dropout`, None: `hidden_dropout_prob`), as the encoder family's
    `HfzooEncoderForTokenClassification` (Devlin et al. 2019 §5.3's tagging). Loads from any checkpoint of the
    family, leaving its decoder and heads out (`DECODER_SIDE_KEYS`).

    Args:
        config: an `HfzooEncoderDecoderConfig` (`num_labels`, `classifier_dropout`).
    """

    _keys_to_ignore_on_load_unexpected = DECODER_SIDE_KEYS

    def __init__(self, config: HfzooEncoderDecoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooEncoderDecoderEncoderModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> MoeTokenClassifierOutput:
        """Classify each source token.

        Args:
            input_ids: `(batch_size, src_len)` int64 source ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, src_len)` source padding mask (1 = token).
            inputs_embeds: `(batch_size, src_len, hidden_size)` instead of `input_ids`.
            labels: `(batch_size, src_len)` int64 class ids, -100 for ignored positions.
            cache: PEFT prefix tuning's prefix (see `HfzooEncoderDecoderEncoderModel.forward`), or None; also
                accepted as `past_key_values`.
            **kwargs: forwarded to the encoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                encoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the labelled positions of the
                whole accumulated batch.

        Returns:
            `MoeTokenClassifierOutput` (a `TokenClassifierOutput`) with `logits` `(batch_size, src_len,
            num_labels)` and the mean cross-entropy `loss` over labelled positions; with experts, `aux_loss`
            (included in `loss`) and, with `output_router_logits`, `router_logits`.

        Raises:
            ValueError: a label outside `[0, num_labels)` other than -100.
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        return self._token_classification_output(
            logits, labels, outputs, attention_mask, return_router_logits, num_items_in_batch
        )
