"""Token embeddings and vocabulary output heads, shared by every family.

- `TokenEmbedding`: the input vocabulary matrix, optionally factorized (`config.embedding_size`, ALBERT)
  and scaled by sqrt(hidden_size) (`config.scale_embeddings`, Vaswani et al. 2017 §3.4).
- `VocabProjection`: hidden states -> vocabulary scores; tied to a `TokenEmbedding` or not
  (`config.tie_word_embeddings`), factorized when tied to a factorized embedding, and a mixture of
  softmaxes when `config.num_softmaxes > 1` (Yang et al. 2018), in which case it returns
  log-probabilities.
- `tied_embedding_keys`: the `_tied_weights_keys` entries that tie one of these to a `TokenEmbedding`.
- `chunked_linear_cross_entropy`: the summed cross-entropy of a vocabulary projection computed in chunks
  of tokens, so that the logits of a whole batch never exist at once (`VocabProjection` with `labels`).
- `check_vocab_resizable`: the refusal hook of `resize_token_embeddings` (a module that cannot change its
  vocabulary size sets `vocab_resize_refusal`).

Which parameters are tied is declared, never done by hand: the models list the pairs in their
`_tied_weights_keys` (computed from the config) and transformers ties, saves and loads them once
(DeepSpeed ZeRO-3 then partitions each tied matrix once).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

#: Bytes of float32 logits one chunk of `chunked_linear_cross_entropy` may hold (32 MiB: 128 tokens of a
#: 50,257-token vocabulary); the chunk is the largest power of two of tokens within it.
LOSS_CHUNK_BYTES = 32 * 2**20


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
        if not torch.compiler.is_compiling() and input_ids.numel():
            low, high = torch.aminmax(input_ids)
            if (low < 0) | (high >= self.num_embeddings):
                bad = int(low) if int(low) < 0 else int(high)
                raise ValueError(
                    f"token id {bad} is outside the vocabulary: input ids must be in [0, vocab_size="
                    f"{self.num_embeddings}) (a tokenizer larger than the model's vocab_size, or ids from another one?)"
                )
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
        if self.num_softmaxes > 1:
            self.mos_prior = nn.Linear(config.hidden_size, self.num_softmaxes, bias=False)
            self.mos_latent = nn.Linear(config.hidden_size, self.num_softmaxes * config.hidden_size)
        else:
            self.mos_prior = self.mos_latent = None

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
            return self._logits(hidden_states)
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
            return chunked_linear_cross_entropy(hidden_states, self.weight, labels, self.bias)
        # A mixture of softmaxes has no single matrix product to fuse: each chunk of tokens is a
        # checkpointed call, so only one chunk's K mixture components exist at a time, in forward and backward.
        chunk = _chunk_tokens(self.num_softmaxes * self.out_features)
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


def _chunk_tokens(floats_per_token: int) -> int:
    """Tokens per chunk: the largest power of two whose `floats_per_token` float32 values fit `LOSS_CHUNK_BYTES`."""
    tokens = max(1, LOSS_CHUNK_BYTES // (4 * floats_per_token))
    return 1 << (tokens.bit_length() - 1)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of `hidden @ weight.T + bias` against `labels`, one chunk of tokens at a time.

    The forward pass computes, per chunk, the float32 logits, the loss and, when gradients are needed, the
    gradient of the loss with respect to the logits (`softmax - one_hot`, in place of the logits), then the
    chunk's gradients of `hidden`, `weight` and `bias`; only these (and no logits) are kept for the backward
    pass, which scales them in place by the incoming gradient and hands them over (so a second backward
    through the same graph is refused). The matrix products run in `compute_dtype` (the autocast dtype, as
    `nn.Linear` would), the softmax, the loss and the weight and bias gradients in float32.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk, compute_dtype, grad_enabled):  # noqa: D102
        needs_hidden, needs_weight, needs_bias = (grad_enabled and needed for needed in ctx.needs_input_grad[:3])
        needs_bias = needs_bias and bias is not None
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if needs_bias else None
        hidden = hidden.to(compute_dtype)
        weight = weight.to(compute_dtype)  # under autocast: one low-precision copy, as nn.Linear makes
        bias = None if bias is None else bias.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            chunk_hidden = hidden[start : start + chunk]  # (c, in_features)
            chunk_labels = labels[start : start + chunk]  # (c,)
            logits = nn.functional.linear(chunk_hidden, weight, bias).float()  # (c, vocab_size) float32
            valid = chunk_labels != -100
            targets = chunk_labels.masked_fill(~valid, 0)[:, None]  # (c, 1)
            log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)  # (c, 1)
            losses = log_normalizer - logits.gather(1, targets)  # (c, 1)
            total += losses.squeeze(1).masked_fill(~valid, 0.0).sum()
            if not (needs_hidden or needs_weight or needs_bias):
                continue
            grad_logits = logits.sub_(log_normalizer).exp_()  # softmax, in place of the logits
            grad_logits.scatter_add_(1, targets, -valid[:, None].to(grad_logits.dtype))  # - one_hot(label)
            grad_logits.mul_(valid[:, None])  # ignored positions contribute nothing
            if needs_bias:
                grad_bias += grad_logits.sum(0)
            grad_logits = grad_logits.to(compute_dtype)
            if needs_hidden:
                grad_hidden[start : start + chunk] = grad_logits @ weight
            if needs_weight and compute_dtype == torch.float32:
                grad_weight.addmm_(grad_logits.t(), chunk_hidden)  # in place: no (vocab_size, in_features) temporary
            elif needs_weight:
                grad_weight += grad_logits.t() @ chunk_hidden  # low-precision product, float32 accumulation
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
        return (*scaled, None, None, None, None)


def chunked_linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of the scores `hidden_states @ weight.T + bias` without holding them whole.

    Equal to `nn.functional.cross_entropy(nn.functional.linear(hidden_states, weight, bias).float(), labels,
    reduction="sum")` (the float32 loss of transformers' `ForCausalLMLoss` before normalization) and to its
    gradients, but the float32 scores exist for `chunk_size` tokens at a time: for GPT-2's vocabulary of
    50,257 at 1,024 tokens this replaces the 196 MiB scores, their log-softmax and their gradient by chunks of
    at most `LOSS_CHUNK_BYTES`. The gradients are computed during the forward pass (the weight's as a float32
    `(vocab_size, in_features)` accumulator, which becomes the weight's gradient) and handed over by the
    backward pass. Under autocast the matrix products run in the autocast dtype, as `nn.Linear` would, while
    the softmax, the loss and the weight gradient accumulate in float32 (torch's
    `nn.functional.linear_cross_entropy`, whose chunked path is similar, returns the loss in the inputs'
    dtype, i.e. a bf16 sum under autocast).

    Args:
        hidden_states: `(num_tokens, in_features)`.
        weight: `(vocab_size, in_features)`.
        labels: `(num_tokens,)` int64 targets, -100 = ignored.
        bias: `(vocab_size,)` or None.
        chunk_size: tokens per chunk; default: as many as `LOSS_CHUNK_BYTES` of float32 scores hold.

    Returns:
        A float32 scalar: the sum of `-log softmax(scores)[label]` over non-ignored positions (nats).
        Differentiable once (no double backward, no second backward through the same graph).
    """
    device_type = hidden_states.device.type
    autocast = torch.is_autocast_enabled(device_type)
    compute_dtype = torch.get_autocast_dtype(device_type) if autocast else hidden_states.dtype
    chunk = chunk_size or _chunk_tokens(weight.shape[0])
    with torch.autocast(device_type, enabled=False):
        # Inside `apply` grad mode is off: say here whether the caller records gradients at all.
        return _ChunkedLinearCrossEntropy.apply(
            hidden_states, weight, bias, labels, chunk, compute_dtype, torch.is_grad_enabled()
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


def tied_embedding_keys(config, target: str, source: str) -> dict[str, str]:
    """`_tied_weights_keys` entries tying the module at `target` to the `TokenEmbedding` at `source`.

    `target` is a `TokenEmbedding` or a tied `VocabProjection`; both have a `weight` and, with
    `config.embedding_size`, an `embed_proj.weight` of the same shapes as the source's.

    Args:
        config: an hfzoo config (`embedding_size`).
        target: dotted module path of the tied copy, e.g. `"lm_head"`.
        source: dotted module path of the embedding that owns the weights, e.g. `"model.embed_tokens"`.

    Returns:
        `{f"{target}.weight": f"{source}.weight", ...}` (plus the `embed_proj` pair when factorized).
    """
    names = ["weight"] + (["embed_proj.weight"] if config.embedding_size is not None else [])
    return {f"{target}.{name}": f"{source}.{name}" for name in names}
