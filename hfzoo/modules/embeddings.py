"""Token embeddings and vocabulary output heads, shared by every family.

- `TokenEmbedding`: the input vocabulary matrix, optionally factorized (`config.embedding_size`, ALBERT)
  and scaled by sqrt(hidden_size) (`config.scale_embeddings`, Vaswani et al. 2017 §3.4).
- `VocabProjection`: hidden states -> vocabulary scores; tied to a `TokenEmbedding` or not
  (`config.tie_word_embeddings`), factorized when tied to a factorized embedding, and a mixture of
  softmaxes when `config.num_softmaxes > 1` (Yang et al. 2018), in which case it returns
  log-probabilities.
- `AdaptiveEmbedding`, `AdaptiveVocabProjection`, `AdaptiveLogSoftmax`: the vocabulary in frequency-ordered
  clusters whose embedding size shrinks by a factor per cluster: adaptive input embeddings (Baevski & Auli
  2019, `config.adaptive_input_cutoffs`), their tied output with one softmax (Mesh TensorFlow's
  `AdaptiveVocabEmbedding`, which Narang et al. 2021 used), and the adaptive softmax (Grave et al. 2017,
  `config.adaptive_softmax_cutoffs`), whose `logits` are log-probabilities. `vocab_clusters` gives the
  clusters, `check_adaptive_config` validates the fields.
- `build_token_embedding` / `build_vocab_projection`: the input embedding and the LM head's output layer a
  config asks for (what the stacks and the LM heads build).
- `tied_embedding_keys`: the `_tied_weights_keys` entries that tie one of these to a `TokenEmbedding`
  (or an `AdaptiveEmbedding`).
- `chunked_linear_cross_entropy`: the summed cross-entropy of a vocabulary projection computed in chunks
  of tokens, so that the logits of a whole batch never exist at once (`VocabProjection` with `labels`).
- `check_token_ids`, `check_lm_labels`, `check_attention_mask_values`, `check_batch_ids`: ids and labels outside
  the vocabulary, and mask values other than 0 and 1, refused with their value; `caller_checked_ids` skips the
  models' own value checks (a host-device sync each on a GPU) inside a training loop that checks each batch with
  `check_batch_ids` before moving it to the device.
- `check_vocab_resizable`: the refusal hook of `resize_token_embeddings` (a module that cannot change its
  vocabulary size sets `vocab_resize_refusal`).

Which parameters are tied is declared, never done by hand: the models list the pairs in their
`_tied_weights_keys` (computed from the config) and transformers ties, saves and loads them once
(DeepSpeed ZeRO-3 then partitions each tied matrix once).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from .softcapping import soft_cap

#: Bytes of float32 logits one chunk of `chunked_linear_cross_entropy` may hold on the CPU (32 MiB: 128 tokens of a
#: 50,257-token vocabulary); the chunk is the largest power of two of tokens within it.
LOSS_CHUNK_BYTES = 32 * 2**20
#: The same on a GPU (or any other accelerator): 1 GiB, 4,096 tokens of a 50,257-token vocabulary. Every chunk adds
#: its product to the float32 `(vocab_size, hidden)` weight gradient, one read and write of the whole matrix: with
#: 128-token chunks, 16 x 1,024 tokens of the `gpt2` preset spent 18 ms of a 97 ms compiled training step on those
#: additions on one H200 (`benchmarks/gpu_check.py --profile_dir`), and the chunks' matrix products ran on
#: 128-row operands. From about 3,000 tokens per chunk the additions cost under a tenth of the products.
ACCELERATOR_LOSS_CHUNK_BYTES = 2**30
#: On a GPU, `chunked_linear_cross_entropy` pads the vocabulary of its matrix products to a multiple of this
#: (zero weight rows whose scores are -inf: no probability, no gradient). With a row count such as GPT-2's 50,257
#: (not a multiple of 8), cuBLAS cannot use Hopper's matrix kernels: on one H200 the three vocabulary products
#: of a `gpt2` training step (16 x 1,024 tokens, bf16) ran in its `cutlass_75` fallback kernels at about 95
#: TFLOP/s, 31 ms of transformers' 68 ms compiled step.
ACCELERATOR_VOCAB_MULTIPLE = 64


#: False inside `caller_checked_ids()`: the models' value checks of ids, labels and masks are skipped.
_MODEL_VALUE_CHECKS = contextvars.ContextVar("hfzoo_model_value_checks", default=True)


@contextlib.contextmanager
def caller_checked_ids() -> Iterator[None]:
    """Within it, hfzoo's models skip the value checks of their ids, labels and masks (`out_of_range_id`).

    Each of those checks reads a min/max back from the ids' device: on a GPU, a host-device synchronization in every
    forward (two in a language-modelling training step: the token ids and the labels), which empties the queue of
    kernels that the host had launched ahead. A training loop whose batches are checked on the CPU before they are
    moved (`check_batch_ids`) runs its forwards inside this context, so that the checks cost no synchronization and
    bad ids are still refused with their value. Shapes and dtypes are checked as always. A context variable: it
    holds for the current thread (or asyncio task) and is restored on exit.

    Yields:
        None.
    """
    token = _MODEL_VALUE_CHECKS.set(False)
    try:
        yield
    finally:
        _MODEL_VALUE_CHECKS.reset(token)


def model_value_checks_enabled() -> bool:
    """Whether a model checks the values of its ids, labels and masks: in eager mode, outside `caller_checked_ids()`."""
    return not torch.compiler.is_compiling() and _MODEL_VALUE_CHECKS.get()


def out_of_range_id(ids: torch.Tensor, size: int) -> int | None:
    """An id of `ids` outside `[0, size)`, or None: the one an embedding lookup of `size` rows would fail on.

    Checked in eager mode only (one min/max pass over the ids and one host sync), and not inside
    `caller_checked_ids()`; None under `torch.compile`, where the lookup itself fails on such an id.

    Args:
        ids: int64 indices of any shape (token, position or token-type ids).
        size: the number of rows of the table they index.

    Returns:
        The smallest id when it is negative, else the largest when it is `>= size`; None when every id is in range.
    """
    if not model_value_checks_enabled() or not ids.numel():
        return None
    return _out_of_range(ids, size)


def _out_of_range(ids: torch.Tensor, size: int) -> int | None:
    low, high = torch.aminmax(ids)
    if (low < 0) | (high >= size):
        return int(low) if int(low) < 0 else int(high)
    return None


def _refuse_token_id(bad: int | None, vocab_size: int) -> None:
    if bad is not None:
        raise ValueError(
            f"token id {bad} is outside the vocabulary: input ids must be in [0, vocab_size="
            f"{vocab_size}) (a tokenizer larger than the model's vocab_size, or ids from another one?)"
        )


def _check_label_values(labels: torch.Tensor, vocab_size: int) -> None:
    """Refuse a label outside `[0, vocab_size)` other than -100 (one min/max pass, wherever `labels` is)."""
    if not labels.numel():
        return
    bad = _out_of_range(labels.masked_fill(labels == -100, 0), vocab_size)
    if bad is not None:
        raise ValueError(
            f"label {bad} is outside the vocabulary: labels must be in [0, vocab_size={vocab_size}), or -100 for "
            f"a position without a label"
        )


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse token ids outside `[0, vocab_size)` before an embedding lookup (eager mode: `out_of_range_id`).

    Args:
        input_ids: int64 token ids of any shape.
        vocab_size: the number of token ids the embedding has.

    Raises:
        ValueError: an id `< 0` or `>= vocab_size`; the message gives it.
    """
    _refuse_token_id(out_of_range_id(input_ids, vocab_size), vocab_size)


def _mask_value_error(mask: torch.Tensor, name: str) -> ValueError | None:
    """The refusal of a 2-D mask holding a value other than 0 and 1 (one pass, one host sync), or None."""
    if mask.dim() != 2 or mask.dtype == torch.bool or not mask.numel():
        return None
    bad = (mask != 0) & (mask != 1)
    if not bad.any():
        return None
    value = mask[bad][0].item()
    hint = ""
    if value < 0:
        hint = (
            " (an additive mask, 0 to attend and a large negative value to mask? pass (mask == 0).long() instead: "
            "it is read as a boolean, so its negative values would be attended to and its zeros masked)"
        )
    elif value > 1 and float(value).is_integer():
        hint = " (segment or document ids? the mask only marks padding: any value but 0 would be attended to)"
    return ValueError(f"{name} holds {value!r}: expected 1 for each token to attend to and 0 for padding{hint}")


def check_attention_mask_values(attention_mask: torch.Tensor | None, name: str = "attention_mask") -> None:
    """Refuse a 2-D attention mask holding a value other than 0 and 1, before it is read as a boolean.

    transformers' masking (`masking_utils`) and hfzoo's token mixers read a 2-D mask as `mask.bool()`: an additive
    mask (0 and -10,000) or document ids (1, 2, ...) would be taken silently, with every nonzero value attended to.
    Checked in eager mode outside `caller_checked_ids()` (one pass over the mask and one host sync, like the id
    checks); a boolean mask, a prepared 4-D mask and None are taken as they are.

    Args:
        attention_mask: `(batch_size, seq_len)` of any dtype, 1 for each token and 0 for padding; or None, or 4-D.
        name: how the message names it.

    Raises:
        ValueError: naming the first value other than 0 and 1, with the likely cause for a negative value or an
            integer above 1.
    """
    if isinstance(attention_mask, torch.Tensor) and model_value_checks_enabled():
        if (error := _mask_value_error(attention_mask, name)) is not None:
            raise error


def check_lm_labels(labels: torch.Tensor, tokens_shape: tuple[int, ...], vocab_size: int) -> None:
    """Refuse language-modelling labels that cannot label the tokens, before the loss.

    The dtype and shape are checked always; the values in eager mode outside `caller_checked_ids()`
    (`out_of_range_id`: one min/max pass and one host sync), where the loss would otherwise fail with an
    `IndexError` on the CPU or a device-side assert on a GPU.

    Args:
        labels: `(batch_size, seq_len)` int64 target ids, -100 = ignored.
        tokens_shape: `(batch_size, seq_len)` of the tokens they label (the decoder's in an encoder-decoder).
        vocab_size: the number of token ids the head scores.

    Raises:
        ValueError: floating-point or boolean labels, another shape than the tokens', or a label outside
            `[0, vocab_size)` other than -100; the message gives it.
    """
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids (int64; -100 = ignored), got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(tokens_shape):
        raise ValueError(
            f"labels must be (batch_size, sequence_length) like the tokens they label {tuple(tokens_shape)}, got "
            f"shape {tuple(labels.shape)}"
        )
    if model_value_checks_enabled():
        _check_label_values(labels, vocab_size)


def check_batch_ids(batch: Mapping[str, torch.Tensor], vocab_size: int) -> None:
    """Refuse a batch of ids, labels or masks that a model would refuse, wherever it is and whatever the context.

    What the models' own checks refuse (`check_token_ids`, `check_lm_labels`'s values, `check_attention_mask_values`)
    for a caller that checks its batches on the CPU before moving them to the device and then runs the forward inside
    `caller_checked_ids()`: the same errors, without a host-device synchronization per forward.

    Args:
        batch: model inputs; its int64 `input_ids` and `decoder_input_ids` (any shape), `labels` (-100 =
            ignored) and 2-D `attention_mask` and `decoder_attention_mask` are checked, other keys are not.
        vocab_size: the model's `config.vocab_size`.

    Raises:
        ValueError: a token id or a label (other than -100) `< 0` or `>= vocab_size`, or a mask value other than 0
            and 1; the message gives it.
    """
    for key in ("input_ids", "decoder_input_ids"):
        if batch.get(key) is not None and batch[key].numel():
            _refuse_token_id(_out_of_range(batch[key], vocab_size), vocab_size)
    for key in ("attention_mask", "decoder_attention_mask"):
        if isinstance(batch.get(key), torch.Tensor) and (error := _mask_value_error(batch[key], key)) is not None:
            raise error
    labels = batch.get("labels")
    if labels is not None and not labels.is_floating_point():
        _check_label_values(labels, vocab_size)


class TokenEmbedding(nn.Embedding):
    """Token ids -> `hidden_size` vectors: `scale * embed_proj(weight[ids])`.

    `weight` is `(vocab_size, embedding_size)`. With `config.embedding_size` set (factorized embedding
    parameterization, Lan et al. 2020 "ALBERT" §3.1), `embed_proj` (`nn.Linear(embedding_size,
    hidden_size, bias=False)`) maps the `embedding_size` rows to the model width, so the vocabulary costs
    `V * E + E * H` parameters instead of `V * H`; without it `embedding_size = hidden_size` and
    `embed_proj` is None. `scale` is `sqrt(hidden_size)` with `config.scale_embeddings` (Vaswani et al.
    2017, §3.4), else 1.

    Subclassing `nn.Embedding` keeps the plain case's checkpoint key (`embed_tokens.weight`), and
    transformers' `resize_token_embeddings` and PEFT see an embedding: resizing replaces the rows of
    `weight` in place (new rows appended, old rows kept) and leaves `embed_proj` and `scale` as they are.

    Args:
        config: an hfzoo config (`vocab_size`, `hidden_size`, `embedding_size`, `scale_embeddings`).

    Shapes:
        `input_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)` in the weight's dtype.
    """

    #: Why this module cannot change its vocabulary size, or None when it can (see `check_vocab_resizable`).
    vocab_resize_refusal: str | None = None

    def __init__(self, config) -> None:
        factorized = config.embedding_size is not None
        super().__init__(config.vocab_size, config.embedding_size if factorized else config.hidden_size)
        self.embed_proj = nn.Linear(config.embedding_size, config.hidden_size, bias=False) if factorized else None
        self.scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed `input_ids` `(batch_size, seq_len)` into `(batch_size, seq_len, hidden_size)`.

        Raises:
            ValueError: an id outside `[0, vocab_size)` (checked in eager mode: one min/max pass over the ids and
                one host sync; skipped under `torch.compile`, where the lookup itself fails on such an id).
        """
        check_token_ids(input_ids, self.num_embeddings)
        embeddings = super().forward(input_ids)  # (batch, seq, embedding_size)
        if self.embed_proj is not None:
            embeddings = self.embed_proj(embeddings)  # (batch, seq, hidden_size)
        return embeddings * self.scale if self.scale != 1.0 else embeddings


class TransposedLinear(nn.Linear):
    """`y = x W`, the transpose of `nn.Linear(in_features, out_features)`: maps `out_features` -> `in_features`.

    Its `weight` has the shape of the `nn.Linear` going the other way, so the output side of a factorized
    embedding can be tied to the input side's `embed_proj` (Mesh TensorFlow's `FactorizedVocabEmbedding`
    uses the same two factors for ids -> embeddings and hidden -> logits).

    Shapes:
        `(..., out_features)` -> `(..., in_features)`.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Map `(..., out_features)` to `(..., in_features)`."""
        return nn.functional.linear(hidden_states, self.weight.t())


class VocabProjection(nn.Linear):
    """Hidden states -> vocabulary scores: the output embedding of every LM head.

    ```
    plain / untied:     logits = h W^T (+ b)          W: (vocab_size, hidden_size)
    tied + factorized:  logits = (h P) E^T (+ b)      E: (vocab_size, embedding_size), P: (hidden_size, embedding_size)
    mixture of softmaxes (num_softmaxes = K > 1; Yang et al. 2018, "Breaking the Softmax Bottleneck", §3):
        pi = softmax(h W_pi)                          W_pi: (hidden_size, K)                  (mos_prior)
        h_k = tanh(h W_h + b_h)[k]                    W_h: (hidden_size, K * hidden_size)     (mos_latent)
        log P(y | h) = logsumexp_k( log pi_k + log_softmax(logits(h_k))_y )
    ```
    With `config.final_logit_softcapping` = c the logits are `c * tanh(logits / c)` (Gemma 2 Team 2024 §2;
    `hfzoo.modules.softcapping`), in the returned logits and in the chunked loss alike.
    With `config.scale_lm_head_input` the hidden states are first multiplied by `hidden_size ** -0.5`,
    as T5 v1.0 (Raffel et al. 2020, Mesh TensorFlow) does before its tied output embedding, whose
    entries are initialised with standard deviation 1 (transformers' T5: `scale_decoder_outputs`).

    When tied (`tie_word_embeddings`, declared by the model's `_tied_weights_keys`), `weight` is the
    `TokenEmbedding`'s `(vocab_size, embedding_size)` matrix and `embed_proj` its `embed_proj`, used
    transposed. An untied head is a full `(vocab_size, hidden_size)` matrix even when the input
    embeddings are factorized, as in Mesh TensorFlow, which Narang et al. 2021 used (this is what gives
    their "Factorized Embedding" row 227M parameters).

    With a mixture of softmaxes the returned "logits" are log-probabilities (float32 log-sum-exp,
    cast back to the input dtype): `softmax` of them is the mixture's distribution and cross-entropy on
    them is its negative log-likelihood, so losses, `generate()` and sampling work unchanged.

    Given `labels`, the projection returns instead the summed cross-entropy of the scores against them,
    computed in chunks of tokens (`chunked_linear_cross_entropy`; with a mixture of softmaxes, chunks
    recomputed in the backward pass by `torch.utils.checkpoint`), so that training never holds the float32
    scores of the whole batch nor their gradient. The loss runs inside this module's forward, where
    DeepSpeed ZeRO-3 has gathered the weights.

    `resize_token_embeddings` keeps this module (transformers would replace it by a plain `nn.Linear`,
    losing the factorization, the input scale and the mixture): its `weight` and `bias` rows are resized.

    Args:
        config: an hfzoo config (`vocab_size`, `hidden_size`, `embedding_size`, `num_softmaxes`,
            `scale_lm_head_input`).
        bias: add a per-token output bias (BERT's masked-LM head).
        tied: the weight will be tied to a `TokenEmbedding` (then a factorized embedding makes this head
            factorized too).

    Shapes:
        `(..., hidden_size)` -> `(..., vocab_size)` scores (logits, or log-probabilities when `num_softmaxes > 1`);
        with `labels` `(...)`, a float32 scalar.
    """

    #: Why this module cannot change its vocabulary size, or None when it can (see `check_vocab_resizable`).
    vocab_resize_refusal: str | None = None

    def __init__(self, config, bias: bool, tied: bool) -> None:
        factorized = tied and config.embedding_size is not None
        super().__init__(config.embedding_size if factorized else config.hidden_size, config.vocab_size, bias=bias)
        self.embed_proj = TransposedLinear(config.embedding_size, config.hidden_size) if factorized else None
        self.num_softmaxes = config.num_softmaxes
        self.input_scale = config.hidden_size**-0.5 if config.scale_lm_head_input else None
        self.logit_softcap = getattr(config, "final_logit_softcapping", None)  # refused with a mixture (log-probs)
        if self.num_softmaxes > 1:
            self.mos_prior = nn.Linear(config.hidden_size, self.num_softmaxes, bias=False)
            self.mos_latent = nn.Linear(config.hidden_size, self.num_softmaxes * config.hidden_size)
        else:
            self.mos_prior = self.mos_latent = None
        self.chunk_fn = None  # a compiled `linear_cross_entropy_chunk` (`compile_loss`), or None: the eager function

    def compile_loss(self, **compile_kwargs) -> bool:
        """Compile one chunk of the training loss (`linear_cross_entropy_chunk`) for this module's calls.

        The compiled graph is one chunk's work: its scores' matrix product, softmax, loss and the gradients of
        the scores and the hidden states (recompiled once for a shorter last chunk); the loop over chunks and
        the weight gradient's accumulation stay eager, so the graph does not grow with the number of tokens.
        Used by `--torch_compile`'s regional compilation (`hfzoo.training.compilation.compile_output_layer`).

        Args:
            **compile_kwargs: `torch.compile` options (`backend`, `mode`, ...).

        Returns:
            True when compiled; False for a mixture of softmaxes, whose loss has no such chunk function.
        """
        if self.mos_prior is not None:
            return False
        self.chunk_fn = torch.compile(linear_cross_entropy_chunk, **compile_kwargs)
        return True

    def _logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.embed_proj is not None:
            hidden_states = self.embed_proj(hidden_states)  # (..., embedding_size)
        return super().forward(hidden_states)  # (..., vocab_size)

    def _mixture_log_probs(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The mixture of softmaxes' float32 log-probabilities `(..., vocab_size)` of (scaled) hidden states."""
        log_prior = torch.log_softmax(self.mos_prior(hidden_states).float(), dim=-1)  # (..., K)
        contexts = torch.tanh(self.mos_latent(hidden_states))  # (..., K * hidden_size)
        contexts = contexts.view(*hidden_states.shape[:-1], self.num_softmaxes, -1)  # (..., K, hidden_size)
        log_probs = torch.log_softmax(self._logits(contexts).float(), dim=-1)  # (..., K, vocab_size)
        return torch.logsumexp(log_probs + log_prior[..., None], dim=-2)  # (..., vocab_size)

    def forward(self, hidden_states: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Score `hidden_states` `(..., hidden_size)` against the vocabulary: `(..., vocab_size)`.

        Args:
            hidden_states: `(..., hidden_size)` in the compute dtype.
            labels: optional int64 targets of shape `hidden_states.shape[:-1]` (-100 = ignored); then the
                summed cross-entropy is returned instead of the scores.

        Returns:
            The scores `(..., vocab_size)` in the input dtype, or with `labels` the float32 scalar sum over
            non-ignored positions of `-log p(label)` (nats; divide by the number of labels for the mean).
        """
        if self.input_scale is not None:
            hidden_states = hidden_states * self.input_scale
        if labels is not None:
            return self._summed_cross_entropy(hidden_states, labels)
        if self.mos_prior is None:
            return soft_cap(self._logits(hidden_states), self.logit_softcap)
        return self._mixture_log_probs(hidden_states).to(hidden_states.dtype)

    def _summed_cross_entropy(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1])  # (tokens, hidden_size)
        labels = labels.reshape(-1).to(hidden_states.device)  # (tokens,)
        if labels.shape[0] != hidden_states.shape[0]:
            raise ValueError(
                f"labels hold {labels.shape[0]} positions but the hidden states {hidden_states.shape[0]}: "
                "labels must have the shape of the scores without their vocabulary dimension"
            )
        if self.mos_prior is None:
            if self.embed_proj is not None:
                hidden_states = self.embed_proj(hidden_states)  # (tokens, embedding_size)
            return chunked_linear_cross_entropy(
                hidden_states, self.weight, labels, self.bias, softcap=self.logit_softcap, chunk_fn=self.chunk_fn
            )
        # A mixture of softmaxes has no single matrix product to fuse: each chunk of tokens is a
        # checkpointed call, so only one chunk's K mixture components exist at a time, in forward and backward.
        chunk = _chunk_tokens(self.num_softmaxes * self.out_features, hidden_states.device.type)
        total = torch.zeros((), dtype=torch.float32, device=hidden_states.device)
        for start in range(0, hidden_states.shape[0], chunk):
            total = total + checkpoint(
                self._mixture_nll,
                hidden_states[start : start + chunk],
                labels[start : start + chunk],
                use_reentrant=False,
            )
        return total

    def _mixture_nll(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.nll_loss(self._mixture_log_probs(hidden_states), labels, reduction="sum")


def _chunk_tokens(floats_per_token: int, device_type: str = "cpu") -> int:
    """Tokens per chunk: the largest power of two whose `floats_per_token` float32 values fit the chunk budget.

    The budget is `LOSS_CHUNK_BYTES` on the CPU and `ACCELERATOR_LOSS_CHUNK_BYTES` on any other device type.
    """
    budget = LOSS_CHUNK_BYTES if device_type == "cpu" else ACCELERATOR_LOSS_CHUNK_BYTES
    tokens = max(1, budget // (4 * floats_per_token))
    return 1 << (tokens.bit_length() - 1)


def chunk_loss_and_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    softcap: float | None,
    needs_grad: bool,
    needs_bias: bool,
    compute_dtype: torch.dtype,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One chunk of `chunked_linear_cross_entropy` after its matrix product: the loss and the scores' gradient.

    The elementwise work of a chunk (float32 cast, soft cap, log-sum-exp, softmax minus one-hot), called by
    `linear_cross_entropy_chunk` (compiled, it is one fused pass instead of several over the float32 scores).
    Eager, the gradient is computed in place of the float32 scores: `logits` itself when it is float32
    without a soft cap (it is overwritten); compiled, `logits` is not modified.

    Args:
        logits: `(c, vocab_size)` scores of the chunk's c tokens in any float dtype (the matrix product's);
            everything below is computed in float32.
        labels: `(c,)` int64 targets, -100 = ignored.
        softcap: cap c of the scores, `c * tanh(scores / c)` (Gemma 2 §2), or None.
        needs_grad: compute the gradient of the loss with respect to the (uncapped) scores.
        needs_bias: also return its sum over tokens (the output bias's gradient).
        compute_dtype: dtype of the returned gradient (the matrix products' dtype).
        vocab_size: the real vocabulary when `logits` has more columns (a padded vocabulary: the columns from
            `vocab_size` on get no probability and a zero gradient); None: every column is real.

    Returns:
        `(loss, grad_logits, grad_bias)`: the float32 scalar summed loss over non-ignored tokens (nats);
        `(c, vocab_size)` `softmax - one_hot` (zero rows for ignored tokens) in `compute_dtype`, or None;
        `(vocab_size,)` float32 column sums of that gradient, or None (padded columns included, as zeros).
    """
    logits, capped_tanh = logits.float(), None
    if softcap is not None:  # Gemma 2's final logit soft-capping; tanh kept for the chain rule
        capped_tanh = torch.tanh(logits / softcap)
        logits = capped_tanh * softcap
    if vocab_size is not None and vocab_size < logits.shape[-1]:  # padded columns: no probability
        logits[:, vocab_size:] = float("-inf")  # a float32 buffer of this function's own (cast or capped)
    valid = labels != -100
    targets = labels.masked_fill(~valid, 0)[:, None]  # (c, 1)
    log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)  # (c, 1)
    loss = (log_normalizer - logits.gather(1, targets)).squeeze(1).masked_fill(~valid, 0.0).sum()
    if not needs_grad:
        return loss, None, None
    if torch.compiler.is_compiling():
        # One elementwise expression, which the compiled graph fuses into a single pass over the scores that
        # writes the gradient in `compute_dtype`: no float32 (c, vocab_size) buffer (the in-place form below
        # materializes one, since a scatter does not fuse).
        probs = (logits - log_normalizer).exp()  # softmax
        is_target = torch.arange(logits.shape[-1], device=logits.device) == targets  # (c, vocab_size)
        grad_logits = torch.where(is_target, probs - 1, probs) * valid[:, None]  # ignored positions: zero rows
        if capped_tanh is not None:  # d(c tanh(z / c)) / dz = 1 - tanh(z / c)^2
            grad_logits = grad_logits * (1 - capped_tanh.square())
    else:
        # Eager: in place, so that the float32 scores' buffer holds the softmax and then the gradient.
        grad_logits = logits.sub_(log_normalizer).exp_()  # softmax, in place of the scores
        grad_logits.scatter_add_(1, targets, -valid[:, None].to(grad_logits.dtype))  # - one_hot(label)
        grad_logits.mul_(valid[:, None])  # ignored positions contribute nothing
        if capped_tanh is not None:  # d(c tanh(z / c)) / dz = 1 - tanh(z / c)^2
            grad_logits.mul_(1 - capped_tanh.square_())
    grad_bias = grad_logits.sum(0) if needs_bias else None
    return loss, grad_logits.to(compute_dtype), grad_bias


def linear_cross_entropy_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    softcap: float | None,
    needs_hidden: bool,
    needs_grad: bool,
    needs_bias: bool,
    compute_dtype: torch.dtype,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One chunk of `chunked_linear_cross_entropy`: its scores, loss and the gradients of scores and hidden states.

    The scores `hidden @ weight.T + bias`, then `chunk_loss_and_grad`, then the hidden states' gradient
    `grad_logits @ weight`: the part of a chunk that `VocabProjection.compile_loss` compiles as one graph (so the
    scores and their gradient are planned within it instead of being allocated op by op). The weight's gradient
    is left to the caller, which accumulates it over chunks.

    Args:
        hidden: `(c, in_features)` hidden states of the chunk's c tokens, in `compute_dtype`.
        weight: `(vocab_size, in_features)` in `compute_dtype` (or more rows: a padded vocabulary).
        bias: `(vocab_size,)` in `compute_dtype` (padded as the weight), or None.
        labels: `(c,)` int64 targets, -100 = ignored.
        softcap: cap c of the scores (Gemma 2 §2), or None.
        needs_hidden: also compute the hidden states' gradient.
        needs_grad: compute the scores' gradient (any gradient is needed).
        needs_bias: also return the bias's gradient.
        compute_dtype: the matrix products' dtype.
        vocab_size: the real vocabulary when `weight` is padded (`chunk_loss_and_grad`); None: not padded.

    Returns:
        `(loss, grad_logits, grad_hidden, grad_bias)`: the float32 scalar summed loss (nats); `(c, vocab_size)`
        `softmax - one_hot` in `compute_dtype` or None; `(c, in_features)` in `compute_dtype` or None;
        `(vocab_size,)` float32 or None.
    """
    logits = nn.functional.linear(hidden, weight, bias)  # (c, vocab_size) in compute_dtype
    loss, grad_logits, grad_bias = chunk_loss_and_grad(
        logits, labels, softcap, needs_grad, needs_bias, compute_dtype, vocab_size
    )
    grad_hidden = grad_logits @ weight if needs_hidden and grad_logits is not None else None
    return loss, grad_logits, grad_hidden, grad_bias


def _zero_padded(tensor: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` `(n, ...)` cast to `dtype` with zero rows appended up to `(rows, ...)`, in one copy."""
    padded = tensor.new_zeros((rows, *tensor.shape[1:]), dtype=dtype)
    padded[: tensor.shape[0]] = tensor
    return padded


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T + bias` against `labels`, one chunk of tokens at a time.

    The forward pass computes, per chunk, the float32 logits, the loss and, when gradients are needed, the
    gradient of the loss with respect to the logits (`softmax - one_hot`, in place of the logits), then the
    chunk's gradients of `hidden`, `weight` and `bias` (with a soft cap c, the logits are `c tanh(z / c)` and the
    gradient of `z` is the capped logits' times `1 - tanh^2`); only these (and no logits) are kept for the backward
    pass, which scales them in place by the incoming gradient and hands them over (so a second backward
    through the same graph is refused). The matrix products run in `compute_dtype` (the autocast dtype, as
    `nn.Linear` would), the softmax, the loss and the weight and bias gradients in float32. With `padded_size`
    above the vocabulary they run on a vocabulary padded to that size (zero rows, -inf scores), and the gradients
    are cut back to the real vocabulary.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,
        hidden,
        weight,
        bias,
        labels,
        chunk,
        compute_dtype,
        grad_enabled,
        softcap=None,
        chunk_fn=None,
        padded_size=None,
    ):
        needs_hidden, needs_weight, needs_bias = (grad_enabled and needed for needed in ctx.needs_input_grad[:3])
        needs_bias = needs_bias and bias is not None
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        num_tokens, hidden_dtype = hidden.shape[0], hidden.dtype
        # Several chunks write their slices of one gradient; a single chunk's gradient is the whole one.
        grad_hidden = torch.empty_like(hidden) if needs_hidden and num_tokens > chunk else None
        grad_weight = grad_bias = None
        hidden = hidden.to(compute_dtype)
        vocab_size = weight.shape[0]
        padded_size = padded_size or vocab_size
        if padded_size == vocab_size:
            weight = weight.to(compute_dtype)  # under autocast: one low-precision copy, as nn.Linear makes
            bias = None if bias is None else bias.to(compute_dtype)
        else:  # one copy each, cast and padded with zero rows (their scores are set to -inf)
            weight = _zero_padded(weight, padded_size, compute_dtype)
            bias = None if bias is None else _zero_padded(bias, padded_size, compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        # An empty input runs one empty chunk, so that its gradients are zeros (not missing).
        for start in range(0, max(num_tokens, 1), chunk):
            chunk_hidden = hidden[start : start + chunk]  # (c, in_features)
            loss, grad_logits, chunk_grad_hidden, chunk_grad_bias = (chunk_fn or linear_cross_entropy_chunk)(
                chunk_hidden,
                weight,
                bias,
                labels[start : start + chunk],
                softcap,
                needs_hidden,
                needs_hidden or needs_weight or needs_bias,
                needs_bias,
                compute_dtype,
                vocab_size if padded_size != vocab_size else None,
            )
            total += loss
            if grad_logits is None:
                continue
            if needs_bias:
                grad_bias = chunk_grad_bias if grad_bias is None else grad_bias.add_(chunk_grad_bias)
            if needs_hidden and grad_hidden is None:
                grad_hidden = chunk_grad_hidden.to(hidden_dtype)
            elif needs_hidden:
                grad_hidden[start : start + chunk] = chunk_grad_hidden
            if needs_weight and grad_weight is None:  # the first chunk's product starts the float32 sum
                grad_weight = (grad_logits.t() @ chunk_hidden).float()
            elif needs_weight and compute_dtype == torch.float32:
                grad_weight.addmm_(grad_logits.t(), chunk_hidden)  # in place: no (vocab_size, in_features) temporary
            elif needs_weight:
                grad_weight += grad_logits.t() @ chunk_hidden  # low-precision product, float32 accumulation
        if padded_size != vocab_size:  # the real vocabulary's rows (the padded ones are zeros)
            grad_weight = None if grad_weight is None else grad_weight[:vocab_size]
            grad_bias = None if grad_bias is None else grad_bias[:vocab_size]
        # Kept as attributes, not saved tensors: they are results, not inputs, and backward consumes them.
        ctx.grads = (grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):  # noqa: D102  (documented on the class)
        if ctx.grads is None:
            raise RuntimeError(
                "chunked_linear_cross_entropy: its gradients were handed over by a first backward pass; "
                "a second one (retain_graph=True) is not supported"
            )
        grads, ctx.grads = ctx.grads, None
        scaled = [
            None if grad is None else grad.mul_(grad_output.to(grad.dtype)).to(dtype)
            for grad, dtype in zip(grads, ctx.dtypes)
        ]
        return (*scaled, None, None, None, None, None, None, None)


def chunked_linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    softcap: float | None = None,
    chunk_fn: Callable | None = None,
    vocab_multiple: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of the scores `hidden_states @ weight.T + bias` without holding them whole.

    Equal to `nn.functional.cross_entropy(nn.functional.linear(hidden_states, weight, bias).float(), labels,
    reduction="sum")` (the float32 loss of transformers' `ForCausalLMLoss` before normalization) and to its
    gradients, but the float32 scores exist for `chunk_size` tokens at a time: for GPT-2's vocabulary of
    50,257 at 1,024 tokens this replaces the 196 MiB scores, their log-softmax and their gradient by chunks of
    at most `LOSS_CHUNK_BYTES` (32 MiB) on the CPU and `ACCELERATOR_LOSS_CHUNK_BYTES` (1 GiB) on a GPU. The
    gradients are computed during the forward pass (the weight's as a float32 `(vocab_size, in_features)`
    accumulator, which becomes the weight's gradient) and handed over by the backward pass. Under autocast the
    matrix products run in the autocast dtype, as `nn.Linear` would, while the softmax, the loss and the weight
    gradient accumulate in float32 (torch's `nn.functional.linear_cross_entropy`, whose chunked path is similar,
    returns the loss in the inputs' dtype, i.e. a bf16 sum under autocast).

    Args:
        hidden_states: `(num_tokens, in_features)`.
        weight: `(vocab_size, in_features)`.
        labels: `(num_tokens,)` int64 targets, -100 = ignored.
        bias: `(vocab_size,)` or None.
        chunk_size: tokens per chunk; default: as many as the device's budget of float32 scores holds (a power
            of two).
        softcap: cap c of the scores, `c * tanh(scores / c)` (Gemma 2 §2, `final_logit_softcapping`), applied
            in float32 before the softmax; None: uncapped.
        chunk_fn: what computes a chunk's scores, loss and gradients: `linear_cross_entropy_chunk` (None) or a
            compiled form of it (`VocabProjection.compile_loss`).
        vocab_multiple: run the matrix products on the vocabulary padded to a multiple of this (zero rows with
            -inf scores; same loss and gradients); default: `ACCELERATOR_VOCAB_MULTIPLE` (64) on a GPU, where a
            vocabulary such as GPT-2's 50,257 otherwise rules out the fast matrix kernels, and 1 (no padding) on
            the CPU.

    Returns:
        A float32 scalar: the sum of `-log softmax(scores)[label]` over non-ignored positions (nats).
        Differentiable once (no double backward, no second backward through the same graph).

    Raises:
        ValueError: `vocab_multiple` below 1.
    """
    device_type = hidden_states.device.type
    autocast = torch.is_autocast_enabled(device_type)
    compute_dtype = torch.get_autocast_dtype(device_type) if autocast else hidden_states.dtype
    if vocab_multiple is None:
        vocab_multiple = 1 if device_type == "cpu" else ACCELERATOR_VOCAB_MULTIPLE
    if vocab_multiple < 1:
        raise ValueError(f"chunked_linear_cross_entropy: vocab_multiple must be >= 1, got {vocab_multiple}")
    padded_size = -(-weight.shape[0] // vocab_multiple) * vocab_multiple  # the next multiple
    chunk = chunk_size or _chunk_tokens(padded_size, device_type)
    with torch.autocast(device_type, enabled=False):
        # Inside `apply` grad mode is off: say here whether the caller records gradients at all.
        return _ChunkedLinearCrossEntropy.apply(
            hidden_states,
            weight,
            bias,
            labels,
            chunk,
            compute_dtype,
            torch.is_grad_enabled(),
            softcap,
            chunk_fn,
            padded_size,
        )


def check_vocab_resizable(model: nn.Module) -> None:
    """Refuse to resize the vocabulary of a model holding a module that cannot (`resize_token_embeddings` calls it).

    The protocol: a vocabulary module whose size cannot change (e.g. one whose vocabulary is split into
    frequency clusters of fixed sizes) sets the attribute `vocab_resize_refusal` to a sentence saying why;
    `TokenEmbedding` and `VocabProjection` set it to None.

    Args:
        model: the model to resize.

    Raises:
        ValueError: naming the first such submodule, its class and its reason.
    """
    for name, module in model.named_modules():
        reason = getattr(module, "vocab_resize_refusal", None)
        if reason:
            raise ValueError(
                f"resize_token_embeddings: {name or 'the model'} ({type(module).__name__}) cannot change its "
                f"vocabulary size: {reason}"
            )


#: Why an adaptive vocabulary module cannot be resized (its `vocab_resize_refusal`).
_ADAPTIVE_RESIZE_REFUSAL = (
    "the vocabulary is stored as one matrix per frequency cluster (adaptive_input_cutoffs / "
    "adaptive_softmax_cutoffs), the last cluster ending at vocab_size, so new ids have no defined cluster; "
    "build the model with the new vocab_size and cutoffs instead"
)


@dataclass(frozen=True)
class VocabCluster:
    """One cluster of an adaptive vocabulary: the token ids `[start, end)` and their embedding size.

    Attributes:
        start: first token id of the cluster.
        end: one past its last token id.
        embedding_size: the cluster's embedding width (`hidden_size` for the first cluster).
    """

    start: int
    end: int
    embedding_size: int

    @property
    def size(self) -> int:
        """Number of tokens in the cluster."""
        return self.end - self.start


def vocab_clusters(config, cutoffs: list[int], factor: float) -> list[VocabCluster]:
    """Split the vocabulary at `cutoffs` into clusters whose embedding size shrinks by `factor` per cluster.

    Cluster i holds the ids `[cutoffs[i-1], cutoffs[i])` (the first starts at 0, the last ends at
    `vocab_size`) with embedding size `int(hidden_size // factor ** i)` (Baevski & Auli 2019, §3: d / k^i;
    fairseq's `AdaptiveInput`, torch's `AdaptiveLogSoftmaxWithLoss` tails), at least 1 (a narrow model with
    many clusters would otherwise leave the last ones without width). Clusters are contiguous id
    ranges, so they follow token frequency when the tokenizer numbers its tokens by frequency
    (SentencePiece; roughly BPE, whose merges come in order of frequency).

    Args:
        config: an hfzoo config (`vocab_size`, `hidden_size`), its cutoffs already validated.
        cutoffs: strictly increasing ids in `(0, vocab_size)`.
        factor: the shrink factor k >= 1 (1: every cluster has `hidden_size`).

    Returns:
        `len(cutoffs) + 1` clusters covering `[0, vocab_size)`.
    """
    bounds = [0, *cutoffs, config.vocab_size]
    return [
        VocabCluster(bounds[i], bounds[i + 1], max(1, int(config.hidden_size // factor**i)))
        for i in range(len(bounds) - 1)
    ]


def adaptive_input_clusters(config) -> list[VocabCluster] | None:
    """The clusters of the adaptive input embeddings (`adaptive_input_cutoffs`, `adaptive_input_factor`), or None."""
    if config.adaptive_input_cutoffs is None:
        return None
    return vocab_clusters(config, config.adaptive_input_cutoffs, config.adaptive_input_factor)


def adaptive_softmax_clusters(config) -> list[VocabCluster] | None:
    """The clusters of the adaptive softmax (`adaptive_softmax_cutoffs`, `adaptive_softmax_factor`), or None."""
    if config.adaptive_softmax_cutoffs is None:
        return None
    return vocab_clusters(config, config.adaptive_softmax_cutoffs, config.adaptive_softmax_factor)


def adaptive_head_rows(config) -> int:
    """Extra rows of the first cluster's matrix: one per tail cluster when it is tied to an adaptive softmax.

    The adaptive softmax's head scores the first cluster's tokens and one entry per tail cluster (Grave et
    al. 2017, §4.2), so its `(first cluster size + tail clusters, hidden_size)` matrix is what a tied
    input embedding's first cluster holds (its last rows are never looked up), as Mesh TensorFlow's
    `AdaptiveSoftmaxVocabEmbedding` does.
    """
    if config.adaptive_softmax_cutoffs is None or not config.tie_word_embeddings:
        return 0
    return len(config.adaptive_softmax_cutoffs)


class AdaptiveEmbedding(nn.Module):
    """Adaptive input embeddings (Baevski & Auli 2019, §3): ids -> `hidden_size` vectors, less width for rare ones.

    Baevski & Auli 2019, "Adaptive Input Representations for Neural Language Modeling".
    The vocabulary is split into clusters at `config.adaptive_input_cutoffs` (`vocab_clusters`); cluster i
    has its own `(size_i, E_i)` matrix `clusters.i` with `E_i = hidden_size // adaptive_input_factor ** i`
    and a projection `projections.i` (`nn.Linear(E_i, hidden_size, bias=False)`) to the model width:
    `embed(t) = scale * W_i E_i[t - start_i]` for `t` in cluster i. A cluster of full width has no
    projection (`nn.Identity`), as in Mesh TensorFlow's `AdaptiveVocabEmbedding` (which Narang et al. 2021
    used): with factor 1 the layer is a plain `(vocab_size, hidden_size)` embedding cut into pieces. `scale`
    is `sqrt(hidden_size)` with `config.scale_embeddings`, else 1. Tied to an adaptive softmax, the first
    cluster's matrix has one more row per tail cluster (`adaptive_head_rows`), never looked up.

    Every token is looked up in every cluster (at a clamped row) and the results outside its cluster are
    zeroed: no data-dependent shapes (`torch.compile`, exact FLOP counts), at the cost of the small
    projections applied to every token.

    The matrices cannot be resized (`vocab_resize_refusal` says why, for `resize_token_embeddings`).

    Args:
        config: an hfzoo config with `adaptive_input_cutoffs` set (`vocab_size`, `hidden_size`,
            `adaptive_input_factor`, `scale_embeddings`).

    Shapes:
        `input_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)` in the weights' dtype.
    """

    #: Why the vocabulary size cannot change (read by `resize_token_embeddings`' refusal hook).
    vocab_resize_refusal: str | None = _ADAPTIVE_RESIZE_REFUSAL

    def __init__(self, config) -> None:
        super().__init__()
        clusters = adaptive_input_clusters(config)
        head_rows = adaptive_head_rows(config)
        self.vocab_size = config.vocab_size
        self.bounds = [(cluster.start, cluster.end) for cluster in clusters]
        self.clusters = nn.ModuleList(
            nn.Embedding(cluster.size + (head_rows if i == 0 else 0), cluster.embedding_size)
            for i, cluster in enumerate(clusters)
        )
        self.projections = nn.ModuleList(
            nn.Identity()
            if cluster.embedding_size == config.hidden_size
            else nn.Linear(cluster.embedding_size, config.hidden_size, bias=False)
            for cluster in clusters
        )
        self.scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed `input_ids` `(batch_size, seq_len)` into `(batch_size, seq_len, hidden_size)`.

        Raises:
            ValueError: an id outside `[0, vocab_size)` (see `check_token_ids`).
        """
        check_token_ids(input_ids, self.vocab_size)
        embeddings = None
        for (start, end), cluster, projection in zip(self.bounds, self.clusters, self.projections, strict=True):
            in_cluster = (input_ids >= start) & (input_ids < end)  # (batch, seq)
            rows = (input_ids - start).clamp(0, end - start - 1)  # any valid row outside the cluster: zeroed below
            vectors = projection(cluster(rows))  # (batch, seq, E_i) -> (batch, seq, hidden_size)
            vectors = vectors * in_cluster[..., None].to(vectors.dtype)
            embeddings = vectors if embeddings is None else embeddings + vectors
        return embeddings * self.scale if self.scale != 1.0 else embeddings


class _AdaptiveOutput(nn.Module):
    """The output side of an adaptive vocabulary: per cluster, `hidden_size -> E_i -> cluster scores`.

    `clusters.i` is `nn.Linear(E_i, rows_i, bias=bias)` (its weight has the shape of the input side's
    `clusters.i` embedding, so the two tie) and `projections.i` a `TransposedLinear(E_i, hidden_size)`
    (`hidden_size -> E_i` with the weight shape of the input side's `projections.i`), or `nn.Identity` for
    a full-width cluster. With `config.scale_lm_head_input` the hidden states are first multiplied by
    `hidden_size ** -0.5` (T5 v1.0).

    Args:
        config: an hfzoo config.
        clusters: the vocabulary clusters (`vocab_clusters`).
        head_rows: extra output rows of the first cluster (the adaptive softmax's cluster entries).
        bias: a per-row output bias in every cluster (BERT's masked-LM head).
    """

    #: Why the vocabulary size cannot change (read by `resize_token_embeddings`' refusal hook).
    vocab_resize_refusal: str | None = _ADAPTIVE_RESIZE_REFUSAL

    def __init__(self, config, clusters: list[VocabCluster], head_rows: int, bias: bool) -> None:
        super().__init__()
        self.cluster_sizes = [cluster.size for cluster in clusters]
        self.clusters = nn.ModuleList(
            nn.Linear(cluster.embedding_size, cluster.size + (head_rows if i == 0 else 0), bias=bias)
            for i, cluster in enumerate(clusters)
        )
        self.projections = nn.ModuleList(
            nn.Identity()
            if cluster.embedding_size == config.hidden_size
            else TransposedLinear(cluster.embedding_size, config.hidden_size)
            for cluster in clusters
        )
        self.input_scale = config.hidden_size**-0.5 if config.scale_lm_head_input else None

    def cluster_scores(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        """Each cluster's scores `(..., rows_i)` for `hidden_states` `(..., hidden_size)`."""
        if self.input_scale is not None:
            hidden_states = hidden_states * self.input_scale
        return [cluster(projection(hidden_states)) for cluster, projection in zip(self.clusters, self.projections)]

    @staticmethod
    def summed_cross_entropy(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Float32 sum of `-log softmax(scores)[label]` over the positions whose label is not -100.

        Args:
            scores: `(..., vocab_size)` logits or log-probabilities (softmax leaves the latter unchanged).
            labels: int64 `scores.shape[:-1]`, -100 where ignored.

        Returns:
            A float32 scalar (nats, summed; divide by the number of labels for the mean).
        """
        return nn.functional.cross_entropy(
            scores.float().reshape(-1, scores.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )


class AdaptiveVocabProjection(_AdaptiveOutput):
    """Hidden states -> vocabulary logits through the clusters of tied adaptive input embeddings (one softmax).

    ```
    logits = concat_i( (h P_i) E_i^T + b_i )      E_i: (size_i, E_i), P_i: (hidden_size, E_i) (identity at full width)
    ```
    the transposed factors of each cluster of the `AdaptiveEmbedding` it is tied to, concatenated over the
    clusters in id order: Mesh TensorFlow's `AdaptiveVocabEmbedding.hidden_to_logits`, which Narang et al.
    2021 used for their "Adaptive input embeddings" row (a single softmax over the whole vocabulary, unlike
    Baevski & Auli's adaptive softmax output). The LM heads build it when `tie_word_embeddings` and
    `adaptive_input_cutoffs` are set without an adaptive softmax; an untied head is a full `VocabProjection`.

    Args:
        config: an hfzoo config with `adaptive_input_cutoffs`.
        bias: a per-token output bias (BERT's masked-LM head).

    Shapes:
        `(..., hidden_size)` -> logits `(..., vocab_size)`.
    """

    def __init__(self, config, bias: bool) -> None:
        super().__init__(config, adaptive_input_clusters(config), 0, bias)

    def forward(self, hidden_states: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Score `hidden_states` `(..., hidden_size)` against the vocabulary.

        Args:
            hidden_states: `(..., hidden_size)`.
            labels: optional int64 targets `hidden_states.shape[:-1]` (-100 = ignored).

        Returns:
            The logits `(..., vocab_size)`, or with `labels` the float32 summed cross-entropy
            (`summed_cross_entropy`), the interface of `VocabProjection` for the LM heads' losses.
        """
        logits = torch.cat(self.cluster_scores(hidden_states), dim=-1)
        return logits if labels is None else self.summed_cross_entropy(logits, labels)


class AdaptiveLogSoftmax(_AdaptiveOutput):
    """The adaptive softmax (Grave et al. 2017, §4): full-vocabulary log-probabilities from a head and tail clusters.

    Grave et al. 2017, "Efficient softmax approximation for GPUs": a head softmax and one softmax per tail cluster.
    The vocabulary is split at `config.adaptive_softmax_cutoffs` (`vocab_clusters`, embedding sizes
    `hidden_size // adaptive_softmax_factor ** i`). The head (`clusters.0`, `nn.Linear(hidden_size,
    size_0 + n_tail)`) scores the first cluster's tokens and one entry per tail cluster; tail cluster i
    projects `h` to its width (`projections.i`, none at full width: factor 1 is Narang et al. 2021's
    "Adaptive softmax without projection") and scores its tokens (`clusters.i`):
    ```
    log p(t | h) = log_softmax(head(h))[t]                                        t in the first cluster
    log p(t | h) = log_softmax(head(h))[size_0 + i - 1] + log_softmax(tail_i(P_i h))[t - start_i]   t in cluster i
    ```
    The returned "logits" are these log-probabilities for every token (float32 log-softmax, cast back to
    the input's dtype), as `torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob` computes them: `softmax` of them
    is the model's distribution and cross-entropy on them is its negative log-likelihood, so the LM losses,
    `generate()` (greedy, sampling, beam search) and pipelines work unchanged. The training cost is that of
    the full distribution (the head, then every tail on every token): the shortcut of computing a tail only
    for the tokens whose target lies in it cannot return the logits that `generate()` and pipelines need.

    Why not `torch.nn.AdaptiveLogSoftmaxWithLoss` itself: its tails always have a projection (`Linear(h,
    h // div_value ** (i + 1))`, even at `div_value=1`), so the paper's variant without projection (223M
    parameters) cannot be built with it; its `forward(input, target)` returns only the targets'
    log-probabilities; and its tails' first factor would need transposing to tie with the input
    embeddings. The computation is the same as its `log_prob` (tests/modules/test_adaptive.py compares the two).

    Tied to adaptive input embeddings with the same clusters (`tie_word_embeddings`; required by the
    config when tied), `clusters.i` and `projections.i` are the embedding's matrices (Baevski & Auli 2019
    §4.5; Mesh TensorFlow's `AdaptiveSoftmaxVocabEmbedding`), the head's extra rows included.

    Args:
        config: an hfzoo config with `adaptive_softmax_cutoffs`.
        bias: a per-row output bias in every cluster (BERT's masked-LM head; Grave et al. have none).

    Shapes:
        `(..., hidden_size)` -> log-probabilities `(..., vocab_size)`.
    """

    def __init__(self, config, bias: bool) -> None:
        super().__init__(config, adaptive_softmax_clusters(config), len(config.adaptive_softmax_cutoffs), bias)

    def forward(self, hidden_states: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probabilities of every token given `hidden_states`.

        Args:
            hidden_states: `(..., hidden_size)`.
            labels: optional int64 targets `hidden_states.shape[:-1]` (-100 = ignored).

        Returns:
            The log-probabilities `(..., vocab_size)` in the input dtype, or with `labels` the float32 sum of
            `-log p(label)` (`summed_cross_entropy` on the float32 log-probabilities), the interface of
            `VocabProjection` for the LM heads' losses.
        """
        head, *tails = self.cluster_scores(hidden_states)
        head = torch.log_softmax(head.float(), dim=-1)  # (..., size_0 + n_tail)
        shortlist = self.cluster_sizes[0]
        log_probs = [head[..., :shortlist]]
        for i, tail in enumerate(tails):
            cluster_log_prob = head[..., shortlist + i : shortlist + i + 1]  # (..., 1)
            log_probs.append(torch.log_softmax(tail.float(), dim=-1) + cluster_log_prob)  # (..., size_i)
        log_probs = torch.cat(log_probs, dim=-1)  # float32 (..., vocab_size)
        return log_probs.to(hidden_states.dtype) if labels is None else self.summed_cross_entropy(log_probs, labels)


def build_token_embedding(config) -> nn.Module:
    """The token embedding `config` asks for: `AdaptiveEmbedding` with `adaptive_input_cutoffs`, else `TokenEmbedding`.

    Args:
        config: an hfzoo config (validated).

    Returns:
        A module mapping `(batch_size, seq_len)` int64 ids to `(batch_size, seq_len, hidden_size)`.
    """
    return AdaptiveEmbedding(config) if config.adaptive_input_cutoffs is not None else TokenEmbedding(config)


def build_vocab_projection(config, bias: bool, tied: bool) -> nn.Module:
    """The output layer of an LM head: hidden states -> vocabulary scores.

    `AdaptiveLogSoftmax` with `adaptive_softmax_cutoffs` (log-probabilities); `AdaptiveVocabProjection` when
    tied to adaptive input embeddings without an adaptive softmax; otherwise `VocabProjection` (plain,
    factorized when tied to factorized embeddings, a mixture of softmaxes with `num_softmaxes > 1`).

    Args:
        config: an hfzoo config (validated).
        bias: a per-token output bias (BERT's masked-LM head).
        tied: the weights will be tied to the input embedding (`tie_word_embeddings`).

    Returns:
        A module mapping `(..., hidden_size)` to `(..., vocab_size)`.
    """
    if config.adaptive_softmax_cutoffs is not None:
        return AdaptiveLogSoftmax(config, bias)
    if tied and config.adaptive_input_cutoffs is not None:
        return AdaptiveVocabProjection(config, bias)
    return VocabProjection(config, bias, tied)


def _check_cutoffs(config, field: str) -> None:
    cutoffs = getattr(config, field)
    if cutoffs is None:
        return
    if (
        not isinstance(cutoffs, (list, tuple))
        or not cutoffs
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in cutoffs)
    ):
        raise ValueError(f"{field} must be None or a non-empty list of token ids, got {cutoffs!r}")
    if any(b <= a for a, b in zip(cutoffs, cutoffs[1:])) or cutoffs[0] < 1 or cutoffs[-1] >= config.vocab_size:
        raise ValueError(
            f"{field}={list(cutoffs)} must be strictly increasing ids inside the vocabulary, each in "
            f"[1, vocab_size={config.vocab_size}): cluster i holds the ids [cutoffs[i-1], cutoffs[i]) and the last "
            "cluster ends at vocab_size"
        )


def _check_factor(config, cutoffs_field: str, factor_field: str) -> None:
    factor = getattr(config, factor_field)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
        raise ValueError(f"{factor_field} must be a number >= 1 (1: no shrinking), got {factor!r}")
    if getattr(config, cutoffs_field) is None and factor != 4:
        raise ValueError(
            f"{factor_field}={factor!r} only applies with {cutoffs_field}, which is None; leave it at its default 4"
        )


def check_adaptive_config(config) -> None:
    """Validate the adaptive input / adaptive softmax fields and what they contradict (called by the config).

    Args:
        config: an hfzoo config.

    Raises:
        ValueError: cutoffs that are not strictly increasing ids in `[1, vocab_size)`; a factor below 1 or one
            set without its cutoffs; adaptive clusters together with
            `embedding_size` (both factorize the vocabulary matrix); an adaptive softmax, or a head tied to
            adaptive input embeddings, with `num_softmaxes > 1`; a tied adaptive softmax whose clusters differ
            from the input embeddings' (the message names the fields and the values that would work).
    """
    for kind in ("input", "softmax"):
        _check_cutoffs(config, f"adaptive_{kind}_cutoffs")
        _check_factor(config, f"adaptive_{kind}_cutoffs", f"adaptive_{kind}_factor")
    adaptive_input, adaptive_softmax = config.adaptive_input_cutoffs, config.adaptive_softmax_cutoffs
    if config.embedding_size is not None and (adaptive_input is not None or adaptive_softmax is not None):
        field = "adaptive_input_cutoffs" if adaptive_input is not None else "adaptive_softmax_cutoffs"
        raise ValueError(
            f"embedding_size={config.embedding_size} and {field} both factorize the vocabulary matrix; "
            "set one of them (embedding_size=None for the adaptive clusters)"
        )
    adaptive_head = adaptive_softmax is not None or (config.tie_word_embeddings and adaptive_input is not None)
    if config.num_softmaxes > 1 and adaptive_head:
        field = "adaptive_softmax_cutoffs" if adaptive_softmax is not None else "adaptive_input_cutoffs"
        raise ValueError(
            f"num_softmaxes={config.num_softmaxes} (a mixture of softmaxes) needs a plain output matrix, but {field} "
            "makes the LM head adaptive; use num_softmaxes=1"
            + ("" if adaptive_softmax is not None else " or tie_word_embeddings=False")
        )
    if adaptive_softmax is not None and config.tie_word_embeddings:
        same = list(adaptive_input or []) == list(adaptive_softmax)
        if not same or config.adaptive_input_factor != config.adaptive_softmax_factor:
            raise ValueError(
                f"adaptive_softmax_cutoffs={list(adaptive_softmax)} with tie_word_embeddings=True ties the softmax's "
                f"clusters to the input embeddings, so adaptive_input_cutoffs must be {list(adaptive_softmax)} and "
                f"adaptive_input_factor={config.adaptive_softmax_factor!r} (got adaptive_input_cutoffs="
                f"{adaptive_input!r}, adaptive_input_factor={config.adaptive_input_factor!r}); or set "
                "tie_word_embeddings=False"
            )


def tied_embedding_keys(config, target: str, source: str) -> dict[str, str]:
    """`_tied_weights_keys` entries tying the module at `target` to the `TokenEmbedding` at `source`.

    `target` is a `TokenEmbedding` or a tied `VocabProjection`; both have a `weight` and, with
    `config.embedding_size`, an `embed_proj.weight` of the same shapes as the source's. With
    `config.adaptive_input_cutoffs` the source is an `AdaptiveEmbedding` and the target another one or a tied
    `AdaptiveVocabProjection` / `AdaptiveLogSoftmax` with the same clusters: each cluster's matrix
    (`clusters.i.weight`) and projection (`projections.i.weight`, clusters narrower than `hidden_size`) are tied.

    Args:
        config: an hfzoo config (`embedding_size`, `adaptive_input_cutoffs`).
        target: dotted module path of the tied copy, e.g. `"lm_head"`.
        source: dotted module path of the embedding that owns the weights, e.g. `"model.embed_tokens"`.

    Returns:
        `{f"{target}.weight": f"{source}.weight", ...}` (plus the `embed_proj` pair when factorized; the
        clusters' pairs when adaptive).
    """
    clusters = adaptive_input_clusters(config)
    if clusters is not None:
        names = [f"clusters.{i}.weight" for i in range(len(clusters))] + [
            f"projections.{i}.weight" for i, c in enumerate(clusters) if c.embedding_size != config.hidden_size
        ]
        return {f"{target}.{name}": f"{source}.{name}" for name in names}
    names = ["weight"] + (["embed_proj.weight"] if config.embedding_size is not None else [])
    return {f"{target}.{name}": f"{source}.{name}" for name in names}
