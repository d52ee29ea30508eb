"""Model FLOPs of training (forward + backward), counted from a config: "Ops" of the study and MFU of a run.

`count_training_flops(config, seq_len, decoder_seq_len)` returns the FLOPs of one training sequence of
any hfzoo family with its language-model head, `count_classification_flops(config, seq_len)` those of its
sequence classifier (GLUE finetuning); `FlopsCount.per_token` divides by the tokens the model processed. The convention:

- **Weights, 6N** (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1: C ~ 6N per
  token; PaLM, Chowdhery et al. 2022, App. B). Every weight of a matrix product applied to a token costs
  2 FLOPs in the forward pass (a multiply and an add) and 4 in the backward pass (gradients of the input
  and of the weight). N counts *all matrix-product weights each token passes through*, not the
  non-embedding parameters of Kaplan et al.: attention projections, the feed-forward block (in a
  mixture-of-experts layer the router and only the `num_experts_per_tok` experts a token is sent to:
  compute, not storage), and the language-model head (hidden -> vocabulary, with the factorized
  projection or the mixture-of-softmaxes matrices when present; the masked-LM head's transform; an
  adaptive head's cluster matrices and projections, every cluster on every token, since the full
  distribution is computed). The output projection matters at small scale, which is why Hoffmann et al.
  2022 ("Chinchilla", App. F) count it too. The factorized embedding's input projection (E -> hidden) and
  the adaptive input embeddings' cluster projections (each applied to every token) are matrix products and
  are counted; a layer shared by block sharing counts once per application. Not counted: lookups (token,
  position and relative-bias tables) and elementwise work (norms, activations, softmax, residuals; also the
  connections across a stack's layers, `hfzoo.modules.connections`: value residual learning's
  `lambda_1 V_n + lambda_2 V_1`, 3 FLOPs per value element forward, and the U-Net skips' weighted additions, 2
  per hidden element forward, which leave the count unchanged; their parameters, 2 per token mixer after the
  first and 1 per skip, are no matrix-product weights).
- **Attention, 12 d_attn per (query, key) pair** (PaLM App. B: 12 L H Q T per token for self-attention
  over T keys). The scores `Q K^T` and the weighted values `P V` each cost 2 d_attn FLOPs per pair forward
  (`d_attn = num_attention_heads * head_dim`, the query heads also under grouped-query attention, whose
  shared key/value heads save projection weights but no score work), three times that with backward. As in
  PaLM, causal masking is not discounted.
- **Token mixers**: each stack counts its token mixer's sublayers (`sublayer_pattern`: the `s` letters)
  and feed-forward sublayers (the `f` letters). What one token-mixer sublayer costs is the mixer class's
  own count (`hfzoo.modules.mixers`), in one of two forms: static methods `mixer_weights(config)`
  (matrix-product weights per token; self-attention's q, k, v, o, with k and v at `num_key_value_heads` heads
  under grouped-query attention) and `attention_pairs(config, seq_len)`
  ((query, key) pairs over a sequence; self-attention's `seq_len ** 2`, each costing `12 d_attn`), or a
  static `flops_per_token(config, mixer_idx, is_causal)` giving `(weights per token, FLOPs per (query, key)
  pair)` over all `seq_len ** 2` pairs (mixers with their own heads or per-layer widths: the convolutions,
  whose depthwise multiply-adds are elementwise work, and the Synthesizer). A mixer class with neither is
  counted as self-attention. A mixer with a parameter-free transform adds its forward FLOPs over the sequence
  with a static `transform_flops(config, seq_len)`, counted twice for training (the backward pass is one
  transform of the same size for the input's gradient; there is no weight gradient): FNet's 2-D FFT at
  5 N log2 N per complex FFT of length N (`hfzoo.modules.fourier.FourierMixer.transform_flops`). A layer
  type other than the Transformer layer (`hfzoo.modules.stack.LAYER_TYPES`, e.g. the Evolved Transformer's
  cells) gives its layers' terms with a static `training_flops`.
- **Encoder-decoder**: encoder tokens pass the encoder layers; decoder tokens pass the decoder layers and
  the head; cross-attention's key and value projections apply to the encoder's outputs (once per encoder
  token and decoder layer) and its scores cover every (decoder token, encoder token) pair. Transparent
  attention (Bapna et al. 2018) mixes the N + 1 encoder outputs once per cross-attention: `N + 1` weights
  per cross-attention and hidden unit, applied to every encoder token.
- **Layer structure** (from the stacks' `StackLayout`s): the layers a stack builds and their sublayers
  (`sublayer_pattern`); a Universal Transformer applies its block once per recurrent step (all
  `num_recurrent_steps`: with ACT this is the most a position can take) plus its halting unit; a funnel
  encoder runs each block at its pooled length, its first layer's queries at the pooled length and keys and
  values at the previous one (`FunnelLayerStack.layer_lengths`); the Weighted Transformer's branched
  attention runs its feed-forward once per head; a product key memory costs its query projection and the
  scores of its `2 * memory_num_keys` sub-keys per head (its value read is a lookup, not counted); a GRU
  residual gate costs three `2 hidden -> hidden` projections per sublayer.

`tests/models/test_flops.py` checks the count against a hand count for a small decoder, encoder,
encoder-decoder and mixture-of-experts layer, and against torch's `FlopCounterMode` for every Table 1
row of `hfzoo.models.narang.TABLE_1_ROWS`: a new modification whose compute the count misses fails there.
"""

from __future__ import annotations

import dataclasses

from ..modules.attention import HfzooAttention, key_value_heads
from ..modules.embeddings import adaptive_input_clusters, adaptive_softmax_clusters
from ..modules.mixers import TOKEN_MIXERS
from ..modules.stack import LAYER_STACKS, LAYER_TYPES
from .decoder.configuration_decoder import HfzooDecoderConfig
from .encoder.configuration_encoder import HfzooEncoderConfig

__all__ = ["FlopsCount", "count_classification_flops", "count_training_flops", "weights_per_token"]

#: Forward + backward FLOPs per weight per token (2 forward, 4 backward).
TRAINING_FLOPS_PER_WEIGHT = 6
#: Forward + backward FLOPs per (query, key) pair per unit of attention width (scores and values, x3).
TRAINING_ATTENTION_FLOPS_PER_PAIR = 12
#: Forward + backward FLOPs per forward FLOP of a parameter-free linear transform (FNet's FFT): its backward
#: pass is one transform of the same size, for the input's gradient (no weight gradient).
TRAINING_FLOPS_PER_TRANSFORM_FLOP = 2


@dataclasses.dataclass(frozen=True)
class FlopsCount:
    """Training FLOPs (forward + backward) of one sequence, split into weight products and attention.

    Attributes:
        weights: `6 x` the matrix-product weights applied, summed over the sequence's tokens (FLOPs).
        attention: the token mixers' work over the sequence besides weights (FLOPs): attention scores and
            weighted values, and parameter-free transforms (FNet's FFTs).
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


def _cluster_weights(config, clusters, head_rows: int = 0) -> int:
    """Weights of an adaptive vocabulary's clusters applied to one token: projections (narrower ones) + matrices."""
    hidden = config.hidden_size
    projections = sum(hidden * c.embedding_size for c in clusters if c.embedding_size != hidden)
    return projections + sum(c.embedding_size * c.size for c in clusters) + clusters[0].embedding_size * head_rows


def _input_embedding_weights(config) -> int:
    """Matrix-product weights of the input embedding per token: a factorized or adaptive embedding's projections."""
    if config.embedding_size is not None:
        return config.embedding_size * config.hidden_size
    clusters = adaptive_input_clusters(config)
    if clusters is None:
        return 0
    return sum(config.hidden_size * c.embedding_size for c in clusters if c.embedding_size != config.hidden_size)


@dataclasses.dataclass(frozen=True)
class _LayerCost:
    """Matrix-product weights of one built layer, by the tokens they apply to (the token mixer's apart)."""

    query: int  # per token of the layer's (query) sequence: feed-forward, gates, cross q/o, branches
    cross_key_value: int  # cross-attention k, v: per encoder token
    mixer_idx: int | None  # the layer's token mixer, counted among the stack's (None: no token mixer)
    cross: bool  # has cross-attention scores


def _layer_costs(config, layout) -> list[_LayerCost]:
    """The cost of each layer a stack builds (`StackLayout.sublayers`, `feed_forward_kinds`)."""
    hidden, width = config.hidden_size, _attention_width(config)
    branched = TOKEN_MIXERS[layout.token_mixer].feed_forward  # the feed-forward runs once per head (branch)
    # the branches' feed-forward once per head, and the alpha-weighted sum over the heads (a contraction)
    mixer_ffn = config.num_attention_heads * (_feed_forward_weights(config) + hidden) if branched else 0
    gate = 3 * 2 * hidden * hidden if config.residual_gating != "none" else 0  # three 2h -> h projections
    kinds = iter(layout.feed_forward_kinds(config))
    costs, mixers = [], 0
    for sublayers in layout.sublayers(config):
        query = cross_key_value = 0
        mixer_idx = None
        if "s" in sublayers:
            query += mixer_ffn + gate  # (+ the token mixer's own weights, `_token_mixer_terms`)
            mixer_idx, mixers = mixers, mixers + 1
            if layout.has_cross_attention:
                query += 2 * hidden * width + mixer_ffn + gate
                cross_key_value += 2 * hidden * key_value_heads(config) * config.head_dim  # grouped k, v heads
        if "f" in sublayers:
            query += _feed_forward_weights(config, next(kinds)) + gate
        costs.append(_LayerCost(query, cross_key_value, mixer_idx, "s" in sublayers and layout.has_cross_attention))
    return costs


def _layout(config, stack: str):
    """The `StackLayout` of `"decoder"` (an encoder-decoder's decoder) or `"encoder"` (the first / only stack)."""
    layouts = config.stack_layouts()
    return layouts[1] if stack == "decoder" else layouts[0]


def _token_mixer_terms(config, layout, mixer_idx: int, seq_len: int) -> tuple[int, float]:
    """`(weights per token, training FLOPs of its (query, key) pairs and transforms over seq_len tokens)` of a mixer."""
    module = TOKEN_MIXERS[layout.token_mixer].module
    transform = getattr(module, "transform_flops", None)  # a parameter-free transform (FNet's FFT), forward
    transforms = 0 if transform is None else TRAINING_FLOPS_PER_TRANSFORM_FLOP * transform(config, seq_len)
    cost = getattr(module, "flops_per_token", None)
    if cost is not None:  # (weights, FLOPs per pair), over every pair of the sequence
        weights, per_pair = cost(config, mixer_idx, layout.is_causal)
        return weights, per_pair * seq_len * seq_len + transforms
    if not (hasattr(module, "mixer_weights") and hasattr(module, "attention_pairs")):
        module = HfzooAttention
    pairs = module.attention_pairs(config, seq_len)
    width = _attention_width(config)
    return module.mixer_weights(config), TRAINING_ATTENTION_FLOPS_PER_PAIR * width * pairs + transforms


@dataclasses.dataclass(frozen=True)
class _StackCost:
    weights: float  # matrix-product weights applied over the stack's sequence (summed over its tokens)
    attention: float  # training FLOPs of the token mixers' (query, key) pairs and transforms
    cross_key_value: int  # cross-attention key / value weights every encoder token passes
    cross_pair_flops: float  # training FLOPs per (stack token, encoder token) pair of the cross-attentions
    out_len: int  # the stack's output length (a funnel encoder's compressed length)


def _stack_cost(config, layout, seq_len: int) -> _StackCost:
    """What a stack of `layout` costs over a sequence of `seq_len` tokens.

    Each layer's weights times the tokens they apply to (lengths from the layer stack, `layer_lengths`); the
    input projections (factorized or adaptive embeddings) and the layer stack's own weights apply to `seq_len`.
    """
    stack_type = LAYER_STACKS[layout.layer_stack].module
    lengths, out_len = stack_type.layer_lengths(config, layout, seq_len)
    weights = seq_len * (stack_type.weights_per_token(config, layout) + _input_embedding_weights(config))
    layer_cost = getattr(LAYER_TYPES[config.layer_type], "training_flops", None)
    if layer_cost is not None:  # a layer type with blocks of its own (the Evolved Transformer's cells)
        cell, pair, cross_pair, cross_kv = layer_cost(config, layout.is_causal, layout.has_cross_attention)
        n = len(lengths)
        return _StackCost(
            weights + n * cell * seq_len, n * pair * seq_len * seq_len, n * cross_kv, n * cross_pair, out_len
        )
    hidden, width = config.hidden_size, _attention_width(config)
    attention = cross_key_value = cross_layers = 0
    for cost, (q_len, kv_len) in zip(_layer_costs(config, layout), lengths, strict=True):
        weights += q_len * cost.query
        if cost.mixer_idx is not None and q_len == kv_len:
            mixer_weights, mixer_attention = _token_mixer_terms(config, layout, cost.mixer_idx, q_len)
            weights += q_len * mixer_weights
            attention += mixer_attention
        elif cost.mixer_idx is not None:  # pooled queries (funnel): q, o at q_len; k, v at kv_len
            weights += (q_len + kv_len) * 2 * hidden * width
            attention += TRAINING_ATTENTION_FLOPS_PER_PAIR * width * q_len * kv_len
        cross_key_value += cost.cross_key_value
        cross_layers += cost.cross
    return _StackCost(
        weights, attention, cross_key_value, cross_layers * TRAINING_ATTENTION_FLOPS_PER_PAIR * width, out_len
    )


def _head_weights(config) -> int:
    """Weights of the language-model head per token: vocabulary projection (+ MoS, factorized, MLM transform)."""
    hidden, vocab, softmaxes = config.hidden_size, config.vocab_size, config.num_softmaxes
    factorized = config.tie_word_embeddings and config.embedding_size is not None
    # one projection to the vocabulary per softmax; a tied factorized head goes hidden -> E -> vocabulary
    projection = (hidden * config.embedding_size + config.embedding_size * vocab) if factorized else hidden * vocab
    softmax_clusters = adaptive_softmax_clusters(config)
    if softmax_clusters is not None:  # Grave et al. 2017: head (+ one entry per tail cluster) and every tail
        projection = _cluster_weights(config, softmax_clusters, len(softmax_clusters) - 1)
    elif config.tie_word_embeddings and config.adaptive_input_cutoffs is not None:  # tied adaptive input, one softmax
        projection = _cluster_weights(config, adaptive_input_clusters(config))
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
    return _stack_cost(config, _layout(config, stack), 1).weights


def _check_lengths(config, seq_len: int, decoder_seq_len: int | None) -> None:
    """Refuse non-positive lengths, and a decoder length given or missing for the wrong family."""
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    if seq_len < 1 or (decoder_seq_len is not None and decoder_seq_len < 1):
        raise ValueError(f"sequence lengths must be positive, got {seq_len} and {decoder_seq_len}")
    if encoder_decoder != (decoder_seq_len is not None):
        raise ValueError(
            "decoder_seq_len is required for an encoder-decoder and only for one "
            f"(is_encoder_decoder={encoder_decoder}, decoder_seq_len={decoder_seq_len})"
        )


def _stacks_cost(config, seq_len: int, decoder_seq_len: int | None) -> tuple[float, float, int]:
    """The stacks' part of one sequence, without any head.

    Returns:
        `(weights, attention, tokens)`: the matrix-product weights applied, summed over the tokens they apply
        to (not yet multiplied by `TRAINING_FLOPS_PER_WEIGHT`); the attention and transform FLOPs (training);
        the tokens processed (encoder + decoder positions for an encoder-decoder).
    """
    layouts = config.stack_layouts()
    encoder = _stack_cost(config, layouts[0], seq_len)
    if decoder_seq_len is None:
        return encoder.weights, encoder.attention, seq_len
    # The decoder's cross-attention reads the encoder's outputs (compressed by a funnel encoder).
    decoder = _stack_cost(config, layouts[1], decoder_seq_len)
    weights = encoder.weights + encoder.out_len * decoder.cross_key_value + decoder.weights
    attention = encoder.attention + decoder.attention + decoder.cross_pair_flops * decoder_seq_len * encoder.out_len
    if config.transparent_attention:  # Bapna et al. 2018: N + 1 encoder outputs mixed per cross-attention
        cross_attentions = sum("s" in layer for layer in layouts[1].sublayers(config))
        weights += encoder.out_len * cross_attentions * (len(layouts[0].sublayers(config)) + 1) * config.hidden_size
    return weights, attention, seq_len + decoder_seq_len


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
    _check_lengths(config, seq_len, decoder_seq_len)
    weights, attention, tokens = _stacks_cost(config, seq_len, decoder_seq_len)
    head_tokens = seq_len if decoder_seq_len is None else decoder_seq_len  # the LM head reads every output
    head = weights_per_token(config, "head")
    return FlopsCount(TRAINING_FLOPS_PER_WEIGHT * (weights + head_tokens * head), attention, tokens)


def count_classification_flops(config, seq_len: int) -> FlopsCount:
    """Training FLOPs (forward + backward) of one sequence for an hfzoo sequence classifier.

    The model is the family's `...ForSequenceClassification` (what GLUE finetuning trains): the stacks as in
    `count_training_flops`, an encoder-decoder's decoder reading the source itself (`seq_len` decoder positions,
    as BART's classifier does), and the classification head instead of the LM head: a decoder's `score`
    (hidden -> `num_labels`) on every position, whose last real one is pooled; an encoder's and an
    encoder-decoder's `SequenceClassificationHead` (dense hidden -> hidden, then hidden -> `num_labels`) on the
    one pooled position. Mixture-of-experts layers count the experts a token is sent to, a Universal Transformer
    its recurrent steps, a funnel its pooled lengths: the same rules as pretraining's count
    (`tests/finetuning/test_classification_flops.py` checks it against torch's `FlopCounterMode` for every
    Table 1 row).

    Args:
        config: an hfzoo config (decoder, encoder or encoder-decoder) with its `num_labels`.
        seq_len: tokens of the sequence.

    Returns:
        A `FlopsCount` (`tokens`: the positions processed, encoder + decoder for an encoder-decoder).

    Raises:
        ValueError: a non-positive length.
    """
    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    decoder_seq_len = seq_len if encoder_decoder else None
    _check_lengths(config, seq_len, decoder_seq_len)
    weights, attention, tokens = _stacks_cost(config, seq_len, decoder_seq_len)
    hidden, labels = config.hidden_size, config.num_labels
    if isinstance(config, HfzooDecoderConfig):
        head = seq_len * hidden * labels
    else:
        head = hidden * hidden + hidden * labels
    return FlopsCount(TRAINING_FLOPS_PER_WEIGHT * (weights + head), attention, tokens)
