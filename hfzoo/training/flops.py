"""Model FLOPs of training (forward + backward), counted from a config: "Ops" of the study and MFU of a run.

`count_training_flops(config, seq_len, decoder_seq_len)` returns the FLOPs of one training sequence of
any hfzoo family; `FlopsCount.per_token` divides by the tokens the model processed. The convention:

- **Weights, 6N** (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1: C ~ 6N per
  token; PaLM, Chowdhery et al. 2022, App. B). Every weight of a matrix product applied to a token costs
  2 FLOPs in the forward pass (a multiply and an add) and 4 in the backward pass (gradients of the input
  and of the weight). N counts *all matrix-product weights each token passes through*, not the
  non-embedding parameters of Kaplan et al.: attention projections, the feed-forward block (in a
  mixture-of-experts layer the router and only the `num_experts_per_tok` experts a token is sent to:
  compute, not storage), and the language-model head (hidden -> vocabulary, with the factorized
  projection or the mixture-of-softmaxes matrices when present; the masked-LM head's transform). The
  output projection matters at small scale, which is why Hoffmann et al. 2022 ("Chinchilla", App. F)
  count it too. The factorized embedding's input projection (E -> hidden) is a matrix product and is
  counted; a layer shared by block sharing counts once per application. Not counted: lookups (token,
  position and relative-bias tables) and elementwise work (norms, activations, softmax, residuals).
- **Attention, 12 d_attn per (query, key) pair** (PaLM App. B: 12 L H Q T per token for self-attention
  over T keys). The scores `Q K^T` and the weighted values `P V` each cost 2 d_attn FLOPs per pair forward
  (`d_attn = num_attention_heads * head_dim`), three times that with backward. As in PaLM, causal masking
  is not discounted.
- **Encoder-decoder**: encoder tokens pass the encoder layers; decoder tokens pass the decoder layers and
  the head; cross-attention's key and value projections apply to the encoder's outputs (once per encoder
  token and decoder layer) and its scores cover every (decoder token, encoder token) pair.
- **Layer structure** (from the stacks' `StackLayout`s): the layers a stack builds and their sublayers
  (`sublayer_pattern`); a Universal Transformer applies its block once per recurrent step (all
  `num_recurrent_steps`: with ACT this is the most a position can take) plus its halting unit; a funnel
  encoder runs each block at its pooled length, its first layer's queries at the pooled length and keys and
  values at the previous one (`FunnelLayerStack.layer_lengths`); the Weighted Transformer's branched
  attention runs its feed-forward once per head; a product key memory costs its query projection and the
  scores of its `2 * memory_num_keys` sub-keys per head (its value read is a lookup, not counted); a GRU
  residual gate costs three `2 hidden -> hidden` projections per sublayer.

`tests/test_flops.py` checks the count against a hand count for a small decoder, encoder,
encoder-decoder and mixture-of-experts layer, and against torch's `FlopCounterMode` for every Table 1
row of `hfzoo.models.narang.TABLE_1_ROWS`: a new modification whose compute the count misses fails there.
"""

from __future__ import annotations

import dataclasses

from ..models.encoder.configuration_encoder import HfzooEncoderConfig
from ..modules.mixers import TOKEN_MIXERS
from ..modules.stack import LAYER_STACKS

__all__ = ["FlopsCount", "count_training_flops", "weights_per_token"]

#: Forward + backward FLOPs per weight per token (2 forward, 4 backward).
TRAINING_FLOPS_PER_WEIGHT = 6
#: Forward + backward FLOPs per (query, key) pair per unit of attention width (scores and values, x3).
TRAINING_ATTENTION_FLOPS_PER_PAIR = 12


@dataclasses.dataclass(frozen=True)
class FlopsCount:
    """Training FLOPs (forward + backward) of one sequence, split into weight products and attention.

    Attributes:
        weights: `6 x` the matrix-product weights applied, summed over the sequence's tokens (FLOPs).
        attention: attention scores and weighted values (FLOPs).
        tokens: tokens the model processed (encoder + decoder positions for an encoder-decoder).
    """

    weights: float
    attention: float
    tokens: int

    @property
    def total(self) -> float:
        """FLOPs of one training sequence (forward + backward)."""
        return self.weights + self.attention

    @property
    def per_token(self) -> float:
        """`total / tokens`: training FLOPs per processed token."""
        return self.total / self.tokens


def _attention_width(config) -> int:
    head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    return config.num_attention_heads * head_dim


def _feed_forward_weights(config, kind: str = "dense") -> int:
    """Weights a token passes in a feed-forward block (`hfzoo.modules.layer.FEED_FORWARD_BLOCKS` key)."""
    per_expert = (3 if config.gated_mlp else 2) * config.hidden_size * config.intermediate_size
    if kind == "experts":  # active experts only, + the router
        return config.num_experts_per_tok * per_expert + config.hidden_size * config.num_experts
    if kind == "product_key_memory":  # query projection + the sub-key scores of every head (Lample et al. §3.2)
        queries = config.memory_heads * config.memory_key_dim
        return config.hidden_size * queries + config.memory_num_keys * queries
    return per_expert


@dataclasses.dataclass(frozen=True)
class _LayerCost:
    """Matrix-product weights of one built layer, by the tokens they apply to."""

    query: int  # per token of the layer's (query) sequence: q, o, feed-forward, gates, cross q/o
    key_value: int  # self-attention k, v: per token of the key sequence
    cross_key_value: int  # cross-attention k, v: per encoder token
    mixes: bool  # has self-attention scores
    cross: bool  # has cross-attention scores


def _layer_costs(config, layout) -> list[_LayerCost]:
    """The cost of each layer a stack builds (`StackLayout.sublayers`, `feed_forward_kinds`)."""
    hidden, width = config.hidden_size, _attention_width(config)
    branched = TOKEN_MIXERS[layout.token_mixer].feed_forward  # the feed-forward runs once per head (branch)
    # the branches' feed-forward once per head, and the alpha-weighted sum over the heads (a contraction)
    mixer_ffn = config.num_attention_heads * (_feed_forward_weights(config) + hidden) if branched else 0
    gate = 3 * 2 * hidden * hidden if config.residual_gating != "none" else 0  # three 2h -> h projections
    kinds = iter(layout.feed_forward_kinds(config))
    costs = []
    for sublayers in layout.sublayers(config):
        query = key_value = cross_key_value = 0
        if "s" in sublayers:
            query += 2 * hidden * width + mixer_ffn + gate  # q, o (+ branches' feed-forward)
            key_value += 2 * hidden * width
            if layout.has_cross_attention:
                query += 2 * hidden * width + mixer_ffn + gate
                cross_key_value += 2 * hidden * width
        if "f" in sublayers:
            query += _feed_forward_weights(config, next(kinds)) + gate
        costs.append(_LayerCost(query, key_value, cross_key_value, "s" in sublayers, layout.has_cross_attention))
    return costs


def _stack_layout(config, stack: str):
    layouts = config.stack_layouts()
    return layouts[1] if stack == "decoder" else layouts[0]


def _stack_cost(config, layout, seq_len: int) -> tuple[int, int, int, int]:
    """`(weights, self-attention pairs, cross-attention key/value weights per encoder token, output length)`.

    `weights` sums each layer's weights times the tokens they apply to (lengths from the layer stack,
    `layer_lengths`); the factorized input projection and the layer stack's own weights apply to `seq_len`.
    """
    stack_type = LAYER_STACKS[layout.layer_stack].module
    lengths, out_len = stack_type.layer_lengths(config, layout, seq_len)
    weights = seq_len * stack_type.weights_per_token(config, layout)
    if config.embedding_size is not None:
        weights += seq_len * config.embedding_size * config.hidden_size  # factorized input projection
    pairs = cross = 0
    for cost, (q_len, kv_len) in zip(_layer_costs(config, layout), lengths, strict=True):
        weights += q_len * cost.query + kv_len * cost.key_value
        pairs += q_len * kv_len if cost.mixes else 0
        cross += cost.cross_key_value
    return weights, pairs, cross, out_len


def _head_weights(config) -> int:
    """Weights of the language-model head per token: vocabulary projection (+ MoS, factorized, MLM transform)."""
    hidden, vocab, softmaxes = config.hidden_size, config.vocab_size, config.num_softmaxes
    factorized = config.tie_word_embeddings and config.embedding_size is not None
    # one projection to the vocabulary per softmax; a tied factorized head goes hidden -> E -> vocabulary
    projection = (hidden * config.embedding_size + config.embedding_size * vocab) if factorized else hidden * vocab
    weights = softmaxes * projection
    if softmaxes > 1:  # Yang et al. 2018: prior (hidden -> K) and latent contexts (hidden -> K * hidden)
        weights += hidden * softmaxes + hidden * softmaxes * hidden
    if isinstance(config, HfzooEncoderConfig):  # BERT's masked-LM transform (dense hidden -> hidden)
        weights += hidden * hidden
    return weights


def weights_per_token(config, stack: str) -> int:
    """Matrix-product weights one token passes through in a stack (all its layers), without attention scores.

    Args:
        config: an hfzoo config of any family.
        stack: `"encoder"` (an encoder-decoder's encoder, or a single-stack model's layers), `"decoder"`
            (an encoder-decoder's decoder, without the key/value projections of cross-attention, which apply
            to encoder tokens: see `count_training_flops`), or `"head"` (the language-model head).

    Returns:
        The number of weights (each costs 2 FLOPs forward per token).

    Raises:
        ValueError: an unknown `stack`.
    """
    if stack == "head":
        return _head_weights(config)
    if stack not in ("encoder", "decoder"):
        raise ValueError(f"stack must be 'encoder', 'decoder' or 'head', got {stack!r}")
    layout = _stack_layout(config, stack)
    weights, _, _, _ = _stack_cost(config, layout, 1)
    return weights


def count_training_flops(config, seq_len: int, decoder_seq_len: int | None = None) -> FlopsCount:
    """Training FLOPs (forward + backward) of one sequence for an hfzoo model with its LM head.

    See the module docstring for what is counted (Kaplan et al. 2020 §2.1, PaLM App. B).

    Args:
        config: an hfzoo config (decoder, encoder or encoder-decoder).
        seq_len: tokens of the sequence (an encoder-decoder's encoder input length).
        decoder_seq_len: an encoder-decoder's decoder length (span corruption: the target length); required
            for encoder-decoders, must be None otherwise.

    Returns:
        A `FlopsCount`.

    Raises:
        ValueError: a non-positive length, or `decoder_seq_len` given or missing for the wrong family.
    """
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if seq_len < 1 or (decoder_seq_len is not None and decoder_seq_len < 1):
        raise ValueError(f"sequence lengths must be positive, got {seq_len} and {decoder_seq_len}")
    if encoder_decoder != (decoder_seq_len is not None):
        raise ValueError(
            "decoder_seq_len is required for an encoder-decoder and only for one "
            f"(is_encoder_decoder={encoder_decoder}, decoder_seq_len={decoder_seq_len})"
        )
    width, flops_per_weight, per_pair = (
        _attention_width(config),
        TRAINING_FLOPS_PER_WEIGHT,
        TRAINING_ATTENTION_FLOPS_PER_PAIR,
    )
    layouts = config.stack_layouts()
    weights, pairs, _, encoder_len = _stack_cost(config, layouts[0], seq_len)
    if not encoder_decoder:
        weights += seq_len * weights_per_token(config, "head")
        return FlopsCount(flops_per_weight * weights, per_pair * pairs * width, seq_len)
    # The decoder's cross-attention reads the encoder's outputs (compressed by a funnel encoder).
    decoder_weights, decoder_pairs, cross_key_value, _ = _stack_cost(config, layouts[1], decoder_seq_len)
    cross_layers = sum(cost.cross for cost in _layer_costs(config, layouts[1]))
    weights += encoder_len * cross_key_value + decoder_weights + decoder_seq_len * weights_per_token(config, "head")
    pairs += decoder_pairs + cross_layers * decoder_seq_len * encoder_len
    return FlopsCount(flops_per_weight * weights, per_pair * pairs * width, seq_len + decoder_seq_len)
