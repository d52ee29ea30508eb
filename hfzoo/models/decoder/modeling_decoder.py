"""The hfzoo decoder family: a stack of causal `HfzooLayer`s and a language-modelling head.

Built only from the shared blocks in `hfzoo/modules/`; the family-specific part is the causal mask
(`transformers.masking_utils.create_causal_mask`) and the heads.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ...modeling_utils import HfzooPreTrainedModel
from ...modules.layer import HfzooLayer
from ...modules.norms import build_norm
from ...modules.positions import build_position_embedding
from .configuration_decoder import HfzooDecoderConfig


class HfzooDecoderPreTrainedModel(HfzooPreTrainedModel):
    """Base class of the decoder family's models (config class `HfzooDecoderConfig`)."""

    config_class = HfzooDecoderConfig
    config: HfzooDecoderConfig


class HfzooDecoderModel(HfzooDecoderPreTrainedModel):
    """The bare decoder: token (+ position) embeddings, `num_hidden_layers` causal layers, final norm.

    The final norm exists with `norm_position="pre"` (as in GPT-2) and is an identity with `"post"`
    (each post-LN layer already ends with a norm).

    Args:
        config: an `HfzooDecoderConfig`.
    """

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = build_position_embedding(config)
        self.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(
            [HfzooLayer(config, layer_idx, is_causal=True) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = build_norm(config) if config.norm_position == "pre" else nn.Identity()
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Run the decoder.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions; default `past_len ... past_len + seq_len - 1`.
            past_key_values: a transformers `Cache` from an earlier call (generation).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            use_cache: create and return a `DynamicCache` when none is given.
            **kwargs: `output_hidden_states`, `output_attentions`, attention-backend options.

        Returns:
            `BaseModelOutputWithPast` with `last_hidden_state` `(batch_size, seq_len, hidden_size)`,
            `past_key_values`, and optionally `hidden_states` / `attentions`.

        Raises:
            ValueError: both or neither of `input_ids` / `inputs_embeds`; a sequence longer than
                `max_position_embeddings` with absolute position embeddings.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        seq_length = inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past_length, past_length + seq_length, device=inputs_embeds.device)[None]

        hidden_states = inputs_embeds
        if self.embed_positions is not None:
            if past_length + seq_length > self.config.max_position_embeddings:
                raise ValueError(
                    f"sequence of {past_length + seq_length} tokens is longer than max_position_embeddings="
                    f"{self.config.max_position_embeddings}"
                )
            hidden_states = hidden_states + self.embed_positions(position_ids)
        hidden_states = self.embed_dropout(hidden_states)

        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=mask, past_key_values=past_key_values, **kwargs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=past_key_values)


class HfzooDecoderForCausalLM(HfzooDecoderPreTrainedModel, GenerationMixin):
    """Decoder with a language-modelling head: next-token prediction (causal LM), `generate()` ready.

    The head `lm_head` shares its weight with `model.embed_tokens` when `tie_word_embeddings=True`
    (Press & Wolf 2017), declared through `_tied_weights_keys` so that safetensors stores it once and
    DeepSpeed ZeRO-3 partitions it once.

    Args:
        config: an `HfzooDecoderConfig`.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooDecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Compute next-token logits and, with `labels`, the mean cross-entropy loss.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions (default: consecutive after the cache).
            past_key_values: a transformers `Cache` from an earlier call (generation).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            use_cache: create and return a `DynamicCache` when none is given.
            labels: `(batch_size, seq_len)` int64 token ids; shifted inside (position t predicts
                label t+1), -100 ignored. `num_items_in_batch` in kwargs normalises the summed loss
                over a whole accumulated batch instead of this micro-batch.
            logits_to_keep: compute logits only for the last `logits_to_keep` positions (0 = all).
            **kwargs: forwarded to the base model and the loss.

        Returns:
            `CausalLMOutputWithPast` with `logits` `(batch_size, seq_len, vocab_size)` (float dtype of
            the model), `loss` (scalar, nats per predicted token) when labels are given, and
            `past_key_values`.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
