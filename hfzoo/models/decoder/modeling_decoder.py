"""The hfzoo decoder family: a stack of causal `HfzooLayer`s, a language-modelling head and task heads.

Built only from the shared blocks in `hfzoo/modules/` (one causal `stack`); the family-specific part
is the heads.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, MoeCausalLMOutputWithPast
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from ...modeling_utils import (
    HfzooGenerationMixin,
    HfzooPreTrainedModel,
    MoeQuestionAnsweringModelOutput,
    MoeSequenceClassifierOutputWithPast,
    MoeTokenClassifierOutput,
    sequence_classification_loss,
)
from ...modules.embeddings import build_vocab_projection, tied_embedding_keys
from ...modules.heads import check_answer_positions, check_classification_labels, last_token_pool
from ...modules.stack import HfzooStack
from .configuration_decoder import HfzooDecoderConfig


class HfzooDecoderPreTrainedModel(HfzooPreTrainedModel):
    """Base class of the decoder family's models (config class `HfzooDecoderConfig`)."""

    config_class = HfzooDecoderConfig
    config: HfzooDecoderConfig


class HfzooDecoderModel(HfzooStack, HfzooDecoderPreTrainedModel):
    """The bare decoder: one causal `hfzoo.modules.stack.HfzooStack` of `num_hidden_layers` layers.

    Token (+ position) embeddings, the layers and a final norm (an identity for placements without one,
    e.g. `norm_position="post"`, where each layer already ends with a norm). With `block_sharing="all"`
    every layer's parameters are tied to layer 0's.

    Args:
        config: an `HfzooDecoderConfig`.
    """

    accepts_loss_kwargs = False  # no loss

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config, config.stack_layouts()[0])
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Run the decoder.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions; default `past_len ... past_len + seq_len - 1`.
            cache: a transformers `Cache` from an earlier call (generation, prefix tuning); also accepted as
                `past_key_values`, its name before transformers 5.24.
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            use_cache: create and return a `DynamicCache` when none is given.
            **kwargs: those of `hfzoo.modeling_utils.PASSED_DOWN_KWARGS` (`output_hidden_states`,
                `output_attentions`, ...); `IGNORED_KWARGS` are dropped, others raise `TypeError`.

        Returns:
            `BaseModelOutputWithPast` with `last_hidden_state` `(batch_size, seq_len, hidden_size)`, the
            cache (field `cache`, or `past_key_values` before transformers 5.24), and optionally
            `hidden_states` / `attentions`.

        Raises:
            ValueError: both or neither of `input_ids` / `inputs_embeds`; a sequence longer than
                `max_position_embeddings` with absolute position embeddings (see `HfzooStack.forward`).
        """
        outputs = super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        # `router_logits` is added by `capture_outputs` when requested
        return BaseModelOutputWithPast(last_hidden_state=outputs.last_hidden_state, **self._carried(outputs))


class HfzooDecoderForCausalLM(HfzooDecoderPreTrainedModel, HfzooGenerationMixin):
    """Decoder with a language-modelling head: next-token prediction (causal LM), `generate()` ready.

    The head `lm_head` (`hfzoo.modules.embeddings.build_vocab_projection`) shares its weights with
    `model.embed_tokens` when `tie_word_embeddings=True` (Press & Wolf 2017), declared through
    `_tied_weights_keys` so that safetensors stores them once and DeepSpeed ZeRO-3 partitions them once.
    With `num_softmaxes > 1` or `adaptive_softmax_cutoffs` the `logits` are log-probabilities (a mixture of
    softmaxes; the adaptive softmax), and the loss their negative log-likelihood.

    Logits and loss: in training mode with `labels` the loss is computed from the hidden states in chunks
    of tokens (`hfzoo.modules.embeddings.chunked_linear_cross_entropy`) and `logits` is None, so the
    float32 scores of the whole batch and their gradient never exist (with GPT-2's vocabulary of 50,257
    they are 196 MiB per 1,024 tokens each); `skip_logits=False` asks for the logits anyway (then the loss
    is transformers' cross-entropy on them, as its `ForCausalLMLoss`; both paths are
    `HfzooPreTrainedModel._lm_loss`). In eval mode, or without labels, the logits are returned.

    Args:
        config: an `HfzooDecoderConfig`.
    """

    _forward_kwargs_read = frozenset({"shift_labels"})

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooDecoderModel(config)
        self.lm_head = build_vocab_projection(config, bias=False, tied=config.tie_word_embeddings)
        self.post_init()

    def _generating_stack(self):
        """The stack `generate` extends the cache of: `self.model`."""
        return self.model

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """`lm_head` -> `model.embed_tokens` when `tie_word_embeddings` (the layers' ties are `model`'s)."""
        if not self.config.tie_word_embeddings:
            return {}
        return tied_embedding_keys(self.config, "lm_head", "model.embed_tokens")

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        skip_logits: bool | None = None,
        **kwargs,
    ) -> MoeCausalLMOutputWithPast:
        """Compute next-token logits and, with `labels`, the mean cross-entropy loss (+ the experts' auxiliary loss).

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions (default: consecutive after the cache).
            cache: a transformers `Cache` from an earlier call (generation); also accepted as
                `past_key_values`, its name before transformers 5.24.
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            use_cache: create and return a `DynamicCache` when none is given.
            labels: `(batch_size, seq_len)` int64 token ids; shifted inside (position t predicts
                label t+1), -100 ignored.
            logits_to_keep: compute logits only for the last `logits_to_keep` positions (0 = all).
            skip_logits: compute the loss in chunks without returning logits; default: in training mode
                with labels (see the class docstring).
            **kwargs: `shift_labels` (`(batch_size, seq_len)` labels already aligned with the positions, instead
                of `labels`, as transformers' `ForCausalLMLoss` accepts; a keyword, not a named parameter, so that
                `Trainer` does not take it for a label column); those of
                `hfzoo.modeling_utils.PASSED_DOWN_KWARGS`, forwarded to the base model;
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the predicted tokens
                of the whole accumulated batch instead of taking this batch's mean; `output_router_logits`
                (default `config.output_router_logits`) returns the routers' logits. Others raise `TypeError`.

        Returns:
            `MoeCausalLMOutputWithPast` with `logits` `(batch_size, seq_len, vocab_size)` (float dtype of
            the model; None with `skip_logits`), `loss` (float32 scalar, nats per predicted token) when
            labels are given, and
            the cache. With experts (`config.num_experts > 0`): `aux_loss`, the float32 scalar
            `router_aux_loss_coef * load balancing + router_z_loss_coef * z-loss` included in `loss`
            (see `hfzoo.modules.experts.router_aux_losses`), and with `output_router_logits` the
            per-MoE-layer `router_logits` `(batch_size * seq_len, num_experts)`.
        """
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shift_labels = kwargs.pop("shift_labels", None)
        if labels is not None and shift_labels is None:  # position t predicts label t + 1
            shift_labels = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits, loss = self._lm_loss(
            outputs.last_hidden_state, shift_labels, num_items_in_batch, skip_logits, logits_to_keep
        )
        share = self._loss_share(shift_labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, return_router_logits=return_router_logits, loss_share=share
        )
        return MoeCausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **self._carried(outputs, "hidden_states", "attentions"),
            **moe,
        )


class HfzooDecoderForSequenceClassification(HfzooDecoderPreTrainedModel):
    """Decoder + linear `score` on the last non-padding token's state, as transformers' decoder classifiers do.

    Rows may be left- or right-padded (`config.pad_token_id` marks padding). Single-label, multi-label
    and regression losses follow `config.problem_type`, as in transformers' `GenericForSequenceClassification`
    (whose behaviour this reproduces, plus the experts' auxiliary loss).

    Args:
        config: an `HfzooDecoderConfig` (`num_labels`, `pad_token_id`).
    """

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooDecoderModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> MoeSequenceClassifierOutputWithPast:
        """Classify each sequence by the score of its last non-padding token.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)` padding mask.
            position_ids: `(batch_size, seq_len)` int64 positions.
            cache: a `Cache`, e.g. PEFT prefix tuning's prefix keys/values; also accepted as
                `past_key_values` (PEFT's name, and transformers' before 5.24).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids` (then the last
                position is classified).
            labels: `(batch_size,)` class ids, or float targets (regression / multi-label).
            use_cache: return the decoder's cache.
            **kwargs: forwarded to the decoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                decoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) normalises the loss over the whole accumulated batch;
                `output_router_logits` returns the routers' logits.

        Returns:
            `MoeSequenceClassifierOutputWithPast` (a `SequenceClassifierOutputWithPast`) with `logits`
            `(batch_size, num_labels)` and `loss`; with experts, `aux_loss` (included in `loss`).

        Raises:
            ValueError: an integer label outside `[0, num_labels)`; a batch of more than one row
                without `pad_token_id`.
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self.score(outputs.last_hidden_state)  # (batch, seq, num_labels)
        pooled_logits = last_token_pool(logits, input_ids, self.config.pad_token_id)
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(labels, pooled_logits, self.config, num_items_in_batch)
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, return_router_logits=return_router_logits, loss_share=share
        )
        return MoeSequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled_logits,
            **self._carried(outputs, "hidden_states", "attentions"),
            **moe,
        )


class HfzooDecoderForTokenClassification(HfzooDecoderPreTrainedModel):
    """Decoder + a per-token linear classifier `score`, as transformers' `LlamaForTokenClassification`.

    Each token is classified from its causal state (it sees itself and the tokens before it). The head is
    `dropout` (`classifier_dropout`, or `hidden_dropout_prob` when that is None) then `score` (`hidden_size` ->
    `num_labels`, with a bias), named as in transformers' decoder token classifiers
    (`GenericForTokenClassification`), so that PEFT's `TOKEN_CLS` task trains and saves `score` beside the
    adapter.

    Args:
        config: an `HfzooDecoderConfig` (`num_labels`, `classifier_dropout`).
    """

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooDecoderModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> MoeTokenClassifierOutput:
        """Classify each token.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions.
            cache: a `Cache`, e.g. PEFT prefix tuning's prefix keys/values; also accepted as `past_key_values`
                (PEFT's name, and transformers' before 5.24). No cache is returned: none is built unless
                `use_cache=True` is given.
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            labels: `(batch_size, seq_len)` int64 class ids, -100 for ignored positions.
            **kwargs: forwarded to the decoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                decoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the labelled positions of the
                whole accumulated batch; `output_router_logits` returns the routers' logits.

        Returns:
            `MoeTokenClassifierOutput` (a `TokenClassifierOutput`) with `logits` `(batch_size, seq_len,
            num_labels)` and the mean cross-entropy `loss` over labelled positions; with experts, `aux_loss`
            (included in `loss`).

        Raises:
            ValueError: a label outside `[0, num_labels)` other than -100.
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        kwargs.setdefault("use_cache", False)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self.score(self.dropout(outputs.last_hidden_state))
        return self._token_classification_output(
            logits, labels, outputs, attention_mask, return_router_logits, num_items_in_batch
        )


class HfzooDecoderForQuestionAnswering(HfzooDecoderPreTrainedModel):
    """Decoder + a span-extraction head: a start and an end logit per token, as `LlamaForQuestionAnswering`.

    The head is one linear layer `qa_outputs` of `hidden_size` -> 2 (start, end), named and shaped as in
    transformers' decoder span heads (`GenericForQuestionAnswering`), on each token's causal state; PEFT's
    `QUESTION_ANS` task trains and saves it beside the adapter. It has two outputs whatever `config.num_labels`
    is. The loss is transformers' `ForQuestionAnsweringLoss` in float32 (the encoder's span head,
    `HfzooEncoderForQuestionAnswering`, has the same; Devlin et al. 2019 §4.2 define the span scores).

    Args:
        config: an `HfzooDecoderConfig`.
    """

    def __init__(self, config: HfzooDecoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooDecoderModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs,
    ) -> MoeQuestionAnsweringModelOutput:
        """Score every token as the start and as the end of the answer span.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids, question then context (or give `inputs_embeds`).
            attention_mask: `(batch_size, past_len + seq_len)`, 1 for tokens and 0 for padding.
            position_ids: `(batch_size, seq_len)` int64 positions.
            cache: a `Cache`, e.g. PEFT prefix tuning's prefix keys/values; also accepted as `past_key_values`.
                No cache is returned: none is built unless `use_cache=True` is given.
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            start_positions: `(batch_size,)` int64 index of the answer's first token; at or beyond `seq_len`:
                left out of the loss (an answer truncated away).
            end_positions: `(batch_size,)` int64 index of the answer's last token (same convention).
            **kwargs: forwarded to the decoder (the keyword contract of `HfzooPreTrainedModel`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed losses by it instead of averaging
                over the rows; `output_router_logits` returns the routers' logits.

        Returns:
            `MoeQuestionAnsweringModelOutput` (a `QuestionAnsweringModelOutput`) with `start_logits` and
            `end_logits`, each `(batch_size, seq_len)` in the model's dtype, and, given both positions, the float32
            `loss` `(start_loss + end_loss) / 2`; with experts, `aux_loss` (included in `loss`).

        Raises:
            ValueError: a negative start or end position (`check_answer_positions`).
        """
        check_answer_positions(start_positions, "start_positions")
        check_answer_positions(end_positions, "end_positions")
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        kwargs.setdefault("use_cache", False)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
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
        )
