"""Token embeddings and vocabulary output heads, shared by every family.

- `TokenEmbedding`: the input vocabulary matrix, optionally factorized (`config.embedding_size`, ALBERT)
  and scaled by sqrt(hidden_size) (`config.scale_embeddings`, Vaswani et al. 2017 §3.4).
- `VocabProjection`: hidden states -> vocabulary scores; tied to a `TokenEmbedding` or not
  (`config.tie_word_embeddings`), factorized when tied to a factorized embedding, and a mixture of
  softmaxes when `config.num_softmaxes > 1` (Yang et al. 2018), in which case it returns
  log-probabilities.
- `tied_embedding_keys`: the `_tied_weights_keys` entries that tie one of these to a `TokenEmbedding`.

Which parameters are tied is declared, never done by hand: the models list the pairs in their
`_tied_weights_keys` (computed from the config) and transformers ties, saves and loads them once
(DeepSpeed ZeRO-3 then partitions each tied matrix once).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class TokenEmbedding(nn.Embedding):
    """Token ids -> `hidden_size` vectors: `scale * embed_proj(weight[ids])`.

    `weight` is `(vocab_size, embedding_size)`. With `config.embedding_size` set (factorized embedding
    parameterization, Lan et al. 2020 "ALBERT" §3.1), `embed_proj` (`nn.Linear(embedding_size,
    hidden_size, bias=False)`) maps the `embedding_size` rows to the model width, so the vocabulary costs
    `V * E + E * H` parameters instead of `V * H`; without it `embedding_size = hidden_size` and
    `embed_proj` is None. `scale` is `sqrt(hidden_size)` with `config.scale_embeddings` (Vaswani et al.
    2017, §3.4), else 1.

    Subclassing `nn.Embedding` keeps the plain case's checkpoint key (`embed_tokens.weight`), and
    transformers' `resize_token_embeddings` and PEFT see an embedding.

    Args:
        config: an hfzoo config (`vocab_size`, `hidden_size`, `embedding_size`, `scale_embeddings`).

    Shapes:
        `input_ids` `(batch_size, seq_len)` int64 -> `(batch_size, seq_len, hidden_size)` in the weight's dtype.
    """

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

    Args:
        config: an hfzoo config (`vocab_size`, `hidden_size`, `embedding_size`, `num_softmaxes`,
            `scale_lm_head_input`).
        bias: add a per-token output bias (BERT's masked-LM head).
        tied: the weight will be tied to a `TokenEmbedding` (then a factorized embedding makes this head
            factorized too).

    Shapes:
        `(..., hidden_size)` -> `(..., vocab_size)` scores (logits, or log-probabilities when `num_softmaxes > 1`).
    """

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

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Score `hidden_states` `(..., hidden_size)` against the vocabulary: `(..., vocab_size)`."""
        if self.input_scale is not None:
            hidden_states = hidden_states * self.input_scale
        if self.mos_prior is None:
            return self._logits(hidden_states)
        log_prior = torch.log_softmax(self.mos_prior(hidden_states).float(), dim=-1)  # (..., K)
        contexts = torch.tanh(self.mos_latent(hidden_states))  # (..., K * hidden_size)
        contexts = contexts.view(*hidden_states.shape[:-1], self.num_softmaxes, -1)  # (..., K, hidden_size)
        log_probs = torch.log_softmax(self._logits(contexts).float(), dim=-1)  # (..., K, vocab_size)
        mixed = torch.logsumexp(log_probs + log_prior[..., None], dim=-2)  # (..., vocab_size)
        return mixed.to(hidden_states.dtype)


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
