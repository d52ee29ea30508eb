"""The hfzoo encoder family: a bidirectional stack with masked-LM, classification and question-answering heads."""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from ...modeling_utils import (
    HfzooPreTrainedModel,
    MoeMaskedLMOutput,
    MoeQuestionAnsweringModelOutput,
    MoeSequenceClassifierOutput,
    MoeTokenClassifierOutput,
    sequence_classification_loss,
)
from ...modules.embeddings import VocabProjection, tied_embedding_keys
from ...modules.heads import (
    MaskedLMHead,
    SequenceClassificationHead,
    check_answer_positions,
    check_classification_labels,
)
from ...modules.stack import HfzooStack
from .configuration_encoder import HfzooEncoderConfig


class HfzooEncoderPreTrainedModel(HfzooPreTrainedModel):
    """Base class of the encoder family's models (config class `HfzooEncoderConfig`)."""

    config_class = HfzooEncoderConfig
    config: HfzooEncoderConfig


class HfzooEncoderModel(HfzooStack, HfzooEncoderPreTrainedModel):
    """The bare encoder: one bidirectional `hfzoo.modules.stack.HfzooStack` (with token-type embeddings).

    Every token attends to every non-padding token (Devlin et al. 2019). Accepts a `cache` (or
    `past_key_values`) so that PEFT prefix tuning can prepend learned keys/values to each layer.

    Args:
        config: an `HfzooEncoderConfig`.
    """

    accepts_loss_kwargs = False  # no loss

    def __init__(self, config: HfzooEncoderConfig) -> None:
        super().__init__(config, config.stack_layouts()[0])
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """Encode a batch.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, seq_len)`, 1 for tokens and 0 for padding (plus prefix
                length when `cache` holds a prefix).
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (default 0).
            position_ids: `(batch_size, seq_len)` int64 positions (default 0..seq_len-1).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            cache: a `Cache` of prefix keys/values (prefix tuning), or None; also accepted as
                `past_key_values` (PEFT's name, and transformers' before 5.24).
            **kwargs: those of `hfzoo.modeling_utils.PASSED_DOWN_KWARGS` (`output_hidden_states`,
                `output_attentions`, ...); `IGNORED_KWARGS` are dropped, others raise `TypeError`.

        Returns:
            `BaseModelOutputWithPastAndCrossAttentions` with `last_hidden_state`
            `(batch_size, seq_len, hidden_size)`.

        Raises:
            ValueError: see `hfzoo.modules.stack.HfzooStack.forward`.
        """
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            **kwargs,
        )


class HfzooEncoderForMaskedLM(HfzooEncoderPreTrainedModel):
    """Encoder with BERT's masked-LM head (Devlin et al. 2019, §3.1, "Task #1: Masked LM").

    `lm_head.decoder.weight` is tied to `model.embed_tokens.weight` when `tie_word_embeddings`; the output
    embeddings (`get_output_embeddings`, resized by `resize_token_embeddings`) are `lm_head.decoder`.

    In training mode with `labels` the loss is computed in chunks of tokens from the transformed hidden
    states and `logits` is None (as `HfzooDecoderForCausalLM`; `skip_logits=False` asks for them).

    Args:
        config: an `HfzooEncoderConfig`.
    """

    def __init__(self, config: HfzooEncoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooEncoderModel(config)
        self.lm_head = MaskedLMHead(config)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """`lm_head.decoder` -> `model.embed_tokens` when `tie_word_embeddings`."""
        if not self.config.tie_word_embeddings:
            return {}
        return tied_embedding_keys(self.config, "lm_head.decoder", "model.embed_tokens")

    def get_output_embeddings(self) -> VocabProjection:
        """Return the masked-LM head's vocabulary projection `lm_head.decoder` (BERT: `cls.predictions.decoder`)."""
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        """Replace the vocabulary projection of the masked-LM head."""
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        skip_logits: bool | None = None,
        **kwargs,
    ) -> MoeMaskedLMOutput:
        """Predict the original token at every position; with `labels`, the mean masked-LM loss.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, seq_len)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (default 0).
            position_ids: `(batch_size, seq_len)` int64 positions (default 0..seq_len-1).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            labels: `(batch_size, seq_len)` int64 original ids at masked positions, -100 elsewhere.
            skip_logits: compute the loss in chunks without returning logits; default: in training mode
                with labels.
            **kwargs: forwarded to the encoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                encoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the labelled positions of the
                whole accumulated batch.

        Returns:
            `MoeMaskedLMOutput` (a `MaskedLMOutput`) with `logits` `(batch_size, seq_len, vocab_size)` (None
            with `skip_logits`) and the mean cross-entropy `loss` over positions whose label is not -100;
            with experts, plus `aux_loss` (included in `loss`) and, with `output_router_logits`, `router_logits`.
        """
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits, loss = self._lm_loss(outputs.last_hidden_state, labels, num_items_in_batch, skip_logits)
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, return_router_logits=return_router_logits, loss_share=share
        )
        return MoeMaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions, **moe
        )


class HfzooEncoderForSequenceClassification(HfzooEncoderPreTrainedModel):
    """Encoder + classifier on the first token's representation (BERT's `[CLS]`, Devlin et al. 2019 §3).

    Single-label classification, multi-label classification and regression, chosen by
    `config.problem_type` (or inferred from `num_labels` and the label dtype), as in transformers.

    Args:
        config: an `HfzooEncoderConfig` (`num_labels`, `problem_type`, `id2label`).
    """

    def __init__(self, config: HfzooEncoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooEncoderModel(config)
        self.classifier = SequenceClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> MoeSequenceClassifierOutput:
        """Classify each sequence.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, seq_len)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (default 0).
            position_ids: `(batch_size, seq_len)` int64 positions (default 0..seq_len-1).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            labels: `(batch_size,)` int64 class ids, `(batch_size, num_labels)` float targets
                (multi-label), or `(batch_size,)` float (regression).
            cache: prefix keys/values for every layer, also accepted as `past_key_values` (PEFT prefix
                tuning; `attention_mask` then covers prefix + tokens), or None.
            **kwargs: forwarded to the encoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                encoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) normalises the loss over the whole accumulated batch.

        Returns:
            `MoeSequenceClassifierOutput` (a `SequenceClassifierOutput`) with `logits` `(batch_size, num_labels)`
            and `loss`; with experts, `aux_loss` (included in `loss`) and, with `output_router_logits`,
            `router_logits`.

        Raises:
            ValueError: an integer label outside `[0, num_labels)`.
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state[:, 0])
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(labels, logits, self.config, num_items_in_batch)
        share = self._loss_share(labels, num_items_in_batch)
        loss, moe = self._add_router_losses(
            loss, outputs, attention_mask, return_router_logits=return_router_logits, loss_share=share
        )
        return MoeSequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions, **moe
        )


class HfzooEncoderForTokenClassification(HfzooEncoderPreTrainedModel):
    """Encoder + a per-token linear classifier (e.g. named-entity tagging; Devlin et al. 2019 §5.3).

    Args:
        config: an `HfzooEncoderConfig` (`num_labels`).
    """

    def __init__(self, config: HfzooEncoderConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = HfzooEncoderModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> MoeTokenClassifierOutput:
        """Classify each token.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids (or give `inputs_embeds`).
            attention_mask: `(batch_size, seq_len)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (default 0).
            position_ids: `(batch_size, seq_len)` int64 positions (default 0..seq_len-1).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            labels: `(batch_size, seq_len)` int64 class ids, -100 for ignored positions.
            cache: prefix keys/values for every layer, also accepted as `past_key_values` (PEFT prefix
                tuning; `attention_mask` then covers prefix + tokens), or None.
            **kwargs: forwarded to the encoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                encoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed loss by the labelled positions of the
                whole accumulated batch.

        Returns:
            `MoeTokenClassifierOutput` (a `TokenClassifierOutput`) with `logits` `(batch_size, seq_len,
            num_labels)` and the mean cross-entropy `loss` over labelled positions; with experts, `aux_loss`
            (included in `loss`) and, with `output_router_logits`, `router_logits`.

        Raises:
            ValueError: a label outside `[0, num_labels)` other than -100.
        """
        check_classification_labels(labels, self.config)
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        return self._token_classification_output(
            logits, labels, outputs, attention_mask, return_router_logits, num_items_in_batch
        )


class HfzooEncoderForQuestionAnswering(HfzooEncoderPreTrainedModel):
    """Encoder + a span-extraction head: a start and an end logit per token (Devlin et al. 2019 §4.2-4.3, SQuAD).

    The head is one linear layer `qa_outputs` of `hidden_size` -> 2 (start, end), named and shaped as in
    transformers' `BertForQuestionAnswering` (so `hfzoo.convert.bert_to_hfzoo` carries a finetuned BERT span head
    over, and PEFT's `QUESTION_ANS` task trains and saves `qa_outputs` beside the adapter). It has two outputs
    whatever `config.num_labels` is. The loss is transformers' `ForQuestionAnsweringLoss`: the mean of the start
    and the end cross-entropies over the sequence, positions at or beyond `seq_len` left out.

    Args:
        config: an `HfzooEncoderConfig`.
    """

    def __init__(self, config: HfzooEncoderConfig) -> None:
        super().__init__(config)
        self.model = HfzooEncoderModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> MoeQuestionAnsweringModelOutput:
        """Score every token as the start and as the end of the answer span.

        Args:
            input_ids: `(batch_size, seq_len)` int64 token ids, question and context (or give `inputs_embeds`).
            attention_mask: `(batch_size, seq_len)`, 1 for tokens and 0 for padding.
            token_type_ids: `(batch_size, seq_len)` int64 segment ids (0 question, 1 context; default 0).
            position_ids: `(batch_size, seq_len)` int64 positions (default 0..seq_len-1).
            inputs_embeds: `(batch_size, seq_len, hidden_size)` instead of `input_ids`.
            start_positions: `(batch_size,)` int64 index of the answer's first token; at or beyond `seq_len`:
                left out of the loss (an answer truncated away).
            end_positions: `(batch_size,)` int64 index of the answer's last token (same convention).
            cache: prefix keys/values for every layer, also accepted as `past_key_values` (PEFT prefix
                tuning; `attention_mask` then covers prefix + tokens), or None.
            **kwargs: forwarded to the encoder (the keyword contract of `HfzooPreTrainedModel`: named here or by the
                encoder, or in `PASSED_DOWN_KWARGS`; `IGNORED_KWARGS` dropped; others raise `TypeError`);
                `num_items_in_batch` (transformers' `Trainer`) divides the summed
                losses by it instead of averaging over the rows.

        Returns:
            `MoeQuestionAnsweringModelOutput` (a `QuestionAnsweringModelOutput`) with `start_logits` and
            `end_logits`, each `(batch_size, seq_len)` in the model's dtype, and, given both positions, the float32
            `loss` `(start_loss + end_loss) / 2`; with experts, `aux_loss` (included in `loss`) and, with
            `output_router_logits`, `router_logits`.

        Raises:
            ValueError: a negative start or end position (`check_answer_positions`).
        """
        check_answer_positions(start_positions, "start_positions")
        check_answer_positions(end_positions, "end_positions")
        return_router_logits = self._request_router_logits(kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
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
        )
