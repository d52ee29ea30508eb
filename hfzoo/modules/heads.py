"""Output heads shared by the families: masked-LM head, classification heads, label checks."""

from __future__ import annotations

import torch
from torch import nn

from .embeddings import build_vocab_projection, model_value_checks_enabled
from .feed_forward import ACTIVATIONS
from .norms import build_norm


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head (Devlin et al. 2019; `BertLMPredictionHead`): transform, then vocabulary projection.

    `decoder(norm(act(dense(h))))` with a per-token output bias; `norm` follows `config.norm_type` (an
    identity with `none`). `decoder` is `hfzoo.modules.embeddings.build_vocab_projection`'s: a
    `VocabProjection` (factorized when tied to factorized embeddings; a mixture of softmaxes returning
    log-probabilities when `config.num_softmaxes > 1`), an `AdaptiveVocabProjection` (tied adaptive input
    embeddings) or an `AdaptiveLogSoftmax` (log-probabilities); its weights are tied to the input embeddings
    when `config.tie_word_embeddings` (declared by the model's `_tied_weights_keys`).

    Shapes:
        `(batch_size, seq_len, hidden_size)` -> logits `(batch_size, seq_len, vocab_size)`; with `labels`, a
        float32 scalar (the summed cross-entropy, computed in chunks by `VocabProjection`).
    """

    def __init__(self, config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act_fn = ACTIVATIONS[config.hidden_act]
        self.norm = build_norm(config)
        self.decoder = build_vocab_projection(config, bias=True, tied=config.tie_word_embeddings)

    def forward(self, hidden_states: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Map hidden states `(..., hidden_size)` to vocabulary logits `(..., vocab_size)`.

        Args:
            hidden_states: `(..., hidden_size)`.
            labels: optional int64 targets `(...)`, -100 = ignored; then the float32 sum of the
                cross-entropy over labelled positions is returned instead of the logits.
        """
        return self.decoder(self.norm(self.act_fn(self.dense(hidden_states))), labels=labels)


class SequenceClassificationHead(nn.Module):
    """Pooled-representation classifier: `out_proj(dropout(tanh(dense(x))))`.

    BERT's pooler + classifier (Devlin et al. 2019, §4.1; `BertPooler` then dropout and `classifier` in
    `BertForSequenceClassification`) in one module; models name it `classifier`, so PEFT saves it with
    an adapter. The dropout rate is `classifier_dropout`, or `hidden_dropout_prob` when that is None.

    Shapes:
        `(batch_size, hidden_size)` -> `(batch_size, num_labels)`.
    """

    def __init__(self, config) -> None:
        super().__init__()
        dropout = config.classifier_dropout if getattr(config, "classifier_dropout", None) is not None else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """Classify pooled representations `(batch_size, hidden_size)` into `(batch_size, num_labels)` logits."""
        return self.out_proj(self.dropout(torch.tanh(self.dense(pooled))))


def check_classification_labels(labels: torch.Tensor | None, config) -> None:
    """Refuse class labels outside `[0, num_labels)` (ignoring -100) before they reach the loss.

    Applies to integer labels (single-label classification and token classification); float labels
    (regression, multi-label) are not checked. In eager mode and outside `caller_checked_ids()` only
    (`hfzoo.modules.embeddings.model_value_checks_enabled`): the check reads a value back from the labels' device.

    Args:
        labels: int64 class ids of any shape, or None.
        config: the model config (for `num_labels`).

    Raises:
        ValueError: a label < 0 (other than -100) or >= `num_labels`; the message gives the value.
    """
    if labels is None or labels.is_floating_point() or not model_value_checks_enabled():
        return
    bad = ((labels < 0) & (labels != -100)) | (labels >= config.num_labels)
    if bad.any():
        raise ValueError(
            f"label {labels[bad].flatten()[0].item()} is outside [0, num_labels={config.num_labels}) "
            "(use -100 to ignore a position)"
        )


def check_answer_positions(positions: torch.Tensor | None, name: str) -> None:
    """Refuse negative answer-span positions before they reach the question-answering loss.

    transformers' `ForQuestionAnsweringLoss` clamps positions to `[0, seq_len]` and ignores `seq_len`: a
    position at or beyond the input's end (an answer cut off by truncation) drops out of the loss, as there.
    A negative position would be clamped to 0, the first token (`[CLS]`, "no answer" in SQuAD 2.0), and
    train the model towards it without a word: -100, the ignore value of the other heads, is the likely
    mistake. In eager mode and outside `caller_checked_ids()` only (`model_value_checks_enabled`).

    Args:
        positions: `(batch_size,)` or `(batch_size, 1)` int64 token indices (one per row), or None.
        name: the argument's name for the message (`start_positions` / `end_positions`).

    Raises:
        ValueError: a negative position; the message gives the value and its row.
    """
    if positions is None or not model_value_checks_enabled():
        return
    flat = positions.reshape(-1)  # one position per row
    bad = (flat < 0).nonzero()
    if len(bad):
        row = int(bad[0, 0])
        raise ValueError(
            f"{name} has {flat[row].item()} in row {row}: answer positions are token indices from 0 (the first "
            'token, the "no answer" span of SQuAD 2.0); a position at or after the input\'s end is left out of the '
            "loss (give the sequence length, not -100, to ignore a row)"
        )


def last_token_pool(
    hidden_states: torch.Tensor, input_ids: torch.Tensor | None, pad_token_id: int | None
) -> torch.Tensor:
    """Each row's vector at its last non-padding token (left or right padding), as transformers' decoders pool.

    The rightmost position whose id is not `pad_token_id` (transformers' `GenericForSequenceClassification`).

    Args:
        hidden_states: `(batch_size, seq_len, dim)` (hidden states or per-token scores).
        input_ids: `(batch_size, seq_len)` int64, or None (then the last position is used).
        pad_token_id: the padding id, or None (then the last position is used).

    Returns:
        `(batch_size, dim)`.

    Raises:
        ValueError: more than one row and no `pad_token_id` (the padding cannot be found).
    """
    batch = torch.arange(hidden_states.shape[0], device=hidden_states.device)
    if pad_token_id is None and hidden_states.shape[0] != 1:
        raise ValueError("Cannot handle batch sizes > 1 if no padding token is defined.")
    if input_ids is None or pad_token_id is None:
        return hidden_states[batch, -1]
    return _at_last_true(hidden_states, input_ids != pad_token_id)


def last_eos_pool(hidden_states: torch.Tensor, input_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Each row's vector at the position of its last `eos_token_id`, as BART's and T5's classification heads pool.

    An encoder-decoder classifier feeds the source shifted right to its decoder, so the decoder's state at the
    source's last eos has read the whole sequence (Lewis et al. 2020, BART, section 3.1).

    Args:
        hidden_states: `(batch_size, seq_len, dim)`, any float dtype.
        input_ids: `(batch_size, seq_len)` int64 ids aligned with `hidden_states`.
        eos_token_id: the id to pool at.

    Returns:
        `(batch_size, dim)`, the dtype of `hidden_states`. A row without `eos_token_id` gives its position 0; callers
        that cannot rule that out check `input_ids.eq(eos_token_id).any(-1)` first (a host-device sync on a GPU).
    """
    return _at_last_true(hidden_states, input_ids == eos_token_id)


def _at_last_true(hidden_states: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    """Each row of `hidden_states` `(batch_size, seq_len, dim)` at the rightmost True of its row of `flags`.

    `flags` is `(batch_size, seq_len)` bool; a row without a True gives position 0. Returns `(batch_size, dim)`.
    """
    positions = torch.arange(flags.shape[-1], device=hidden_states.device, dtype=torch.int32)
    last = (positions * flags.to(hidden_states.device, torch.int32)).argmax(-1)
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last]
