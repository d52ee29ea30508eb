"""GPT-2 (`GPT2LMHeadModel` and its task heads) <-> the hfzoo decoder (`HfzooDecoderForCausalLM`, ...), both ways.

GPT-2 (Radford et al. 2019) is a pre-LN decoder with learned absolute positions, biases everywhere,
GELU (tanh approximation, `gelu_new`) and tied input/output embeddings: exactly what
`HfzooDecoderConfig` expresses with `norm_position="pre"`, `norm_type="layer_norm"`,
`position_embedding_type="learned"`, `attention_bias=mlp_bias=True`. The weights differ only in
layout:

- GPT-2's `Conv1D` stores `(in_features, out_features)` (`y = x @ W + b`); `nn.Linear` stores the
  transpose `(out_features, in_features)`.
- GPT-2 fuses the query/key/value projections into one `c_attn` of shape
  `(hidden_size, 3 * hidden_size)` (columns `[q | k | v]`); hfzoo has `q_proj`, `k_proj`, `v_proj`.

Both directions only split, concatenate and transpose tensors, so `hfzoo_to_gpt2(gpt2_to_hfzoo(m))`
returns `m`'s state dict exactly (same keys, `torch.equal` values).

Example:
    ```python
    >>> from transformers import GPT2LMHeadModel
    >>> from hfzoo.convert import gpt2_to_hfzoo, hfzoo_to_gpt2
    >>> gpt2 = GPT2LMHeadModel.from_pretrained("openai-community/gpt2")
    >>> model = gpt2_to_hfzoo(gpt2)            # HfzooDecoderForCausalLM, same logits
    >>> back = hfzoo_to_gpt2(model)            # GPT2LMHeadModel, same state dict
    ```
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from transformers import (
    GPT2Config,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    GPT2LMHeadModel,
    GPT2Model,
)

from ..models.decoder import HfzooDecoderConfig
from .common import (
    CAUSAL_LM,
    HFZOO_DECODER_HEADS,
    HfzooDecoderHeads,
    build_hfzoo_config,
    check_activation,
    check_fixed_fields,
    check_keys,
    check_multi_head,
    check_standard_head_dim,
    class_position,
    decoder_task_fields,
    load_converted,
    read_source,
    resolve_tied_head,
)

__all__ = [
    "GPT2_HEADS",
    "GPT2_TO_HFZOO_GLOBAL",
    "GPT2_TO_HFZOO_HEADS",
    "GPT2_TO_HFZOO_LAYER",
    "gpt2_config_from_hfzoo",
    "gpt2_to_hfzoo",
    "hfzoo_config_from_gpt2",
    "hfzoo_to_gpt2",
]

# --------------------------------------------------------------------------------------------------
# The state-dict mapping. GPT-2 keys are given without the `transformer.` prefix of GPT2LMHeadModel.
# Operations (GPT-2 -> hfzoo; the inverse is applied for hfzoo -> GPT-2):
#   copy:     same tensor
#   T:        transpose (Conv1D (in, out) -> nn.Linear (out, in))
#   split3:   split the last dim into [q | k | v] (c_attn bias (3h,) -> 3 x (h,))
#   split3_T: split the last dim into [q | k | v], transpose each (c_attn (h, 3h) -> 3 x (h, h))
# --------------------------------------------------------------------------------------------------

GPT2_TO_HFZOO_GLOBAL: tuple[tuple[str, str, str], ...] = (
    # GPT-2 key            hfzoo key                       op
    ("wte.weight",         "model.embed_tokens.weight",    "copy"),
    ("wpe.weight",         "model.embed_positions.weight", "copy"),
    ("ln_f.weight",        "model.norm.weight",            "copy"),
    ("ln_f.bias",          "model.norm.bias",              "copy"),
    ("lm_head.weight",     "lm_head.weight",               "copy"),
)  # fmt: skip

GPT2_TO_HFZOO_LAYER: tuple[tuple[str, str | tuple[str, str, str], str], ...] = (
    # GPT-2 key (h.{i}.)   hfzoo key (model.layers.{i}.)                                            op
    ("ln_1.weight",        "self_attn_norm.weight",                                                 "copy"),
    ("ln_1.bias",          "self_attn_norm.bias",                                                   "copy"),
    ("attn.c_attn.weight", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), "split3_T"),  # noqa: E501
    ("attn.c_attn.bias",   ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),       "split3"),
    ("attn.c_proj.weight", "self_attn.o_proj.weight",                                               "T"),
    ("attn.c_proj.bias",   "self_attn.o_proj.bias",                                                 "copy"),
    ("ln_2.weight",        "mlp_norm.weight",                                                       "copy"),
    ("ln_2.bias",          "mlp_norm.bias",                                                         "copy"),
    ("mlp.c_fc.weight",    "mlp.up_proj.weight",                                                    "T"),
    ("mlp.c_fc.bias",      "mlp.up_proj.bias",                                                      "copy"),
    ("mlp.c_proj.weight",  "mlp.down_proj.weight",                                                  "T"),
    ("mlp.c_proj.bias",    "mlp.down_proj.bias",                                                    "copy"),
)  # fmt: skip

#: GPT-2's classes at the positions of `hfzoo.convert.common.HFZOO_DECODER_HEADS`: the language model, then the
#: sequence classifier (`score` without bias, pooled at the last non-padding token), the token classifier
#: (`classifier`, hfzoo's `score`) and the span head (`qa_outputs`).
GPT2_HEADS = (GPT2LMHeadModel, GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2ForQuestionAnswering)
#: Each head's own tensors, `(GPT-2 key, hfzoo key)`, by position (the language model's `lm_head.weight` is in
#: `GPT2_TO_HFZOO_GLOBAL`).
GPT2_TO_HFZOO_HEADS: tuple[tuple[tuple[str, str], ...], ...] = (
    (),
    (("score.weight", "score.weight"),),
    (("classifier.weight", "score.weight"), ("classifier.bias", "score.bias")),
    (("qa_outputs.weight", "qa_outputs.weight"), ("qa_outputs.bias", "qa_outputs.bias")),
)

# hfzoo fields GPT-2 fixes, with the value GPT-2 needs and why.
_GPT2_FIXED = {
    "norm_position": ("pre", "GPT-2 is pre-LN (norm before each sub-block, final ln_f)"),
    "norm_type": ("layer_norm", "GPT-2 uses nn.LayerNorm"),
    "position_embedding_type": ("learned", "GPT-2 has learned absolute positions (wpe)"),
    "attention_bias": (True, "GPT-2's Conv1D projections always have a bias"),
    "mlp_bias": (True, "GPT-2's Conv1D projections always have a bias"),
    "gated_mlp": (False, "GPT-2's MLP has no gate projection"),
    "rezero": (False, "GPT-2 has no residual scalars"),
    "fixup_init": (False, "GPT-2 has no residual scalars"),
    "num_experts": (0, "GPT-2's MLP is dense"),
}

# Buffers of old GPT-2 checkpoints (the causal mask), not weights; dropped when reading a state dict.
_LEGACY_GPT2_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


# ------------------------------------------------------------------------------------------------ configs


def hfzoo_config_from_gpt2(gpt2_config: GPT2Config) -> HfzooDecoderConfig:
    """Build the `HfzooDecoderConfig` describing the same network as a `GPT2Config`.

    Mapped fields: `vocab_size`, `n_embd` -> `hidden_size`, `n_layer` -> `num_hidden_layers`, `n_head` ->
    `num_attention_heads`, `n_inner` (None: `4 * n_embd`) -> `intermediate_size`, `activation_function` ->
    `hidden_act`, `n_positions` -> `max_position_embeddings`, `layer_norm_epsilon` -> `layer_norm_eps`,
    `resid_pdrop` (= `embd_pdrop`) -> `hidden_dropout_prob`, `attn_pdrop` -> `attention_probs_dropout_prob`,
    `initializer_range`, `tie_word_embeddings`, `use_cache`, the special token ids and the task fields
    (`id2label`, `label2id`, `problem_type`, and `classifier_dropout`: 0.1 when unset, as
    `GPT2ForTokenClassification` applies). The architecture choices are fixed to GPT-2's: pre-LN layer norm,
    learned positions, biases in every projection, no dropout on the feed-forward hidden layer
    (`activation_dropout=0.0`). `reorder_and_upcast_attn` is accepted and dropped (it changes only the precision
    of eager attention; hfzoo's eager softmax is float32).

    Args:
        gpt2_config: the GPT-2 config.

    Returns:
        A validated `HfzooDecoderConfig`.

    Raises:
        TypeError: `gpt2_config` is not a `GPT2Config`.
        ValueError: a GPT-2 setting hfzoo's decoder cannot express (message names the field):
            `add_cross_attention=True`, `scale_attn_weights=False`,
            `scale_attn_by_inverse_layer_idx=True`, `embd_pdrop != resid_pdrop`, an
            `activation_function` unknown to `ACT2FN`; or a config that fails hfzoo's validation
            (e.g. `bos_token_id` outside the vocabulary).
    """
    if not isinstance(gpt2_config, GPT2Config):
        raise TypeError(f"expected a GPT2Config, got {type(gpt2_config).__name__}")
    c = gpt2_config
    if c.add_cross_attention:
        raise ValueError("add_cross_attention=True: hfzoo's decoder has no cross-attention layers")
    if not c.scale_attn_weights:
        raise ValueError("scale_attn_weights=False: hfzoo always scales attention scores by head_dim**-0.5")
    if c.scale_attn_by_inverse_layer_idx:
        raise ValueError(
            "scale_attn_by_inverse_layer_idx=True: hfzoo has no per-layer attention scaling 1 / (layer_idx + 1)"
        )
    if c.embd_pdrop != c.resid_pdrop:
        raise ValueError(
            f"embd_pdrop={c.embd_pdrop} differs from resid_pdrop={c.resid_pdrop}: hfzoo has one "
            "hidden_dropout_prob for embeddings and residual branches; set them equal"
        )
    check_activation("activation_function", c.activation_function)
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        hidden_act=c.activation_function,
        max_position_embeddings=c.n_positions,
        position_embedding_type="learned",
        norm_type="layer_norm",
        norm_position="pre",
        layer_norm_eps=c.layer_norm_epsilon,
        attention_bias=True,
        mlp_bias=True,
        hidden_dropout_prob=c.resid_pdrop,
        attention_probs_dropout_prob=c.attn_pdrop,
        activation_dropout=0.0,
        initializer_range=c.initializer_range,
        tie_word_embeddings=c.tie_word_embeddings,
        use_cache=c.use_cache,
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        **decoder_task_fields(c, to_hfzoo=True),
    )
    return build_hfzoo_config(HfzooDecoderConfig, fields, "GPT-2 config")


def gpt2_config_from_hfzoo(config: HfzooDecoderConfig) -> GPT2Config:
    """Build the `GPT2Config` describing the same network as an `HfzooDecoderConfig`.

    The inverse of `hfzoo_config_from_gpt2` on the fields it maps (`n_inner` is None when
    `intermediate_size == 4 * hidden_size`, as in GPT-2's own configs; `embd_pdrop` and `resid_pdrop`
    are both `hidden_dropout_prob`).

    Args:
        config: an hfzoo decoder config.

    Returns:
        A `GPT2Config` (`scale_attn_weights=True`, no cross-attention).

    Raises:
        TypeError: `config` is not an `HfzooDecoderConfig` (encoders are bidirectional, not GPT-2).
        ValueError: an hfzoo setting GPT-2 cannot express (message names the field):
            `norm_position` other than `"pre"`, `norm_type` other than `"layer_norm"`,
            `position_embedding_type` other than `"learned"`, `head_dim != hidden_size //
            num_attention_heads`, `attention_bias=False` or `mlp_bias=False` (GPT-2's `Conv1D`
            always has a bias), `gated_mlp`, `rezero`, `fixup_init` or `num_experts > 0`, or a
            `hidden_act` unknown to `ACT2FN`.
    """
    if not isinstance(config, HfzooDecoderConfig):
        raise TypeError(f"expected an HfzooDecoderConfig, got {type(config).__name__}")
    check_fixed_fields(config, _GPT2_FIXED, "GPT-2")
    check_standard_head_dim(config, "GPT-2")
    check_multi_head(config, "GPT-2")
    check_activation("hidden_act", config.hidden_act)
    if getattr(config, "type_vocab_size", 0):
        raise ValueError(f"type_vocab_size={config.type_vocab_size}: GPT-2 has no token-type embeddings")
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.max_position_embeddings,
        n_embd=config.hidden_size,
        n_layer=config.num_hidden_layers,
        n_head=config.num_attention_heads,
        n_inner=None if config.intermediate_size == 4 * config.hidden_size else config.intermediate_size,
        activation_function=config.hidden_act,
        resid_pdrop=config.hidden_dropout_prob,
        embd_pdrop=config.hidden_dropout_prob,
        attn_pdrop=config.attention_probs_dropout_prob,
        layer_norm_epsilon=config.layer_norm_eps,
        initializer_range=config.initializer_range,
        scale_attn_weights=True,
        use_cache=config.use_cache,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        **decoder_task_fields(config, to_hfzoo=False),
    )


# ------------------------------------------------------------------------------------------------ weights


def _global_keys(head: int) -> tuple[tuple[str, str, str], ...]:
    """The rows of `GPT2_TO_HFZOO_GLOBAL` a model with the head at `head` has (`lm_head` only in the language model)."""
    return tuple(row for row in GPT2_TO_HFZOO_GLOBAL if head == CAUSAL_LM or row[0] != "lm_head.weight")


def _gpt2_state_dict_to_hfzoo(
    state: Mapping[str, torch.Tensor], config: HfzooDecoderConfig, head: int = CAUSAL_LM
) -> dict[str, torch.Tensor]:
    """Map a GPT-2 state dict (keys without `transformer.`) to hfzoo keys and layouts (see the tables)."""
    hidden = config.hidden_size
    out = {}
    for gpt2_key, hfzoo_key, _op in _global_keys(head):
        out[hfzoo_key] = state[gpt2_key]
    for gpt2_key, hfzoo_key in GPT2_TO_HFZOO_HEADS[head]:
        out[hfzoo_key] = state[gpt2_key]
    for i in range(config.num_hidden_layers):
        for gpt2_key, hfzoo_key, op in GPT2_TO_HFZOO_LAYER:
            tensor = state[f"h.{i}.{gpt2_key}"]
            if op.startswith("split3"):
                parts = tensor.split(hidden, dim=-1)  # (..., 3 * hidden) -> 3 x (..., hidden)
                for key, part in zip(hfzoo_key, parts):
                    out[f"model.layers.{i}.{key}"] = part.t().contiguous() if op == "split3_T" else part.contiguous()
            else:
                out[f"model.layers.{i}.{hfzoo_key}"] = tensor.t().contiguous() if op == "T" else tensor
    return out


def _hfzoo_state_dict_to_gpt2(
    state: Mapping[str, torch.Tensor], config: HfzooDecoderConfig, head: int = CAUSAL_LM
) -> dict[str, torch.Tensor]:
    """Map an hfzoo decoder state dict to the GPT-2 class's keys (body under `transformer.`) and Conv1D layouts."""
    out = {}
    for gpt2_key, hfzoo_key, _op in _global_keys(head):
        out[gpt2_key if gpt2_key == "lm_head.weight" else f"transformer.{gpt2_key}"] = state[hfzoo_key]
    for gpt2_key, hfzoo_key in GPT2_TO_HFZOO_HEADS[head]:
        out[gpt2_key] = state[hfzoo_key]
    for i in range(config.num_hidden_layers):
        for gpt2_key, hfzoo_key, op in GPT2_TO_HFZOO_LAYER:
            if op.startswith("split3"):
                parts = [state[f"model.layers.{i}.{key}"] for key in hfzoo_key]
                if op == "split3_T":
                    parts = [p.t() for p in parts]  # 3 x (out, in) -> 3 x (in, out)
                tensor = torch.cat(parts, dim=-1)  # (..., 3 * hidden), columns [q | k | v]
            else:
                tensor = state[f"model.layers.{i}.{hfzoo_key}"]
                tensor = tensor.t().contiguous() if op == "T" else tensor
            out[f"transformer.h.{i}.{gpt2_key}"] = tensor
    return out


def _expected_gpt2_keys(num_layers: int, head: int = CAUSAL_LM) -> set[str]:
    keys = {g for g, _, _ in _global_keys(head)} | {g for g, _ in GPT2_TO_HFZOO_HEADS[head]}
    return keys | {f"h.{i}.{g}" for i in range(num_layers) for g, _, _ in GPT2_TO_HFZOO_LAYER}


def _head_of_state(state: Mapping[str, torch.Tensor], side: int) -> int:
    """The head a state dict holds (a position of `HFZOO_DECODER_HEADS`): the language model when it has none.

    Read from its head keys (`side` 0: GPT-2's, 1: hfzoo's), the heads with more keys first (hfzoo's token
    classifier is `score` with a bias, its sequence classifier `score` without).
    """
    for head in sorted(range(len(GPT2_TO_HFZOO_HEADS)), key=lambda h: -len(GPT2_TO_HFZOO_HEADS[h])):
        pairs = GPT2_TO_HFZOO_HEADS[head]
        if pairs and all(pair[side] in state for pair in pairs):
            return head
    return CAUSAL_LM


#: The GPT-2 classes `gpt2_to_hfzoo` takes and `hfzoo_to_gpt2` returns (annotations).
GPT2Models = GPT2LMHeadModel | GPT2ForSequenceClassification | GPT2ForTokenClassification | GPT2ForQuestionAnswering


def gpt2_to_hfzoo(
    gpt2_model_or_state_dict: GPT2Models | GPT2Model | Mapping[str, torch.Tensor],
    config: GPT2Config | HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooDecoderHeads:
    """Convert a GPT-2 model (or its state dict) to the hfzoo decoder class computing the same outputs.

    `GPT2LMHeadModel` -> `HfzooDecoderForCausalLM` (same logits), `GPT2ForSequenceClassification` ->
    `HfzooDecoderForSequenceClassification`, `GPT2ForTokenClassification` -> `HfzooDecoderForTokenClassification`
    (`classifier` -> `score`), `GPT2ForQuestionAnswering` -> `HfzooDecoderForQuestionAnswering` (same logits and
    loss; the label set, problem type and classifier dropout carried over). Weights are re-laid out per
    `GPT2_TO_HFZOO_GLOBAL` / `GPT2_TO_HFZOO_LAYER`: `c_attn` `(hidden, 3 * hidden)` is split into `q_proj`,
    `k_proj`, `v_proj` `(hidden, hidden)` each (transposed), the other `Conv1D` weights `(in, out)` are transposed
    to `nn.Linear`'s `(out, in)`. A `GPT2Model` (or a state dict without `lm_head.weight` nor a head, as in the
    original OpenAI checkpoints) converts to the language model when the embeddings are tied. A state dict picks
    its head from its keys (`classifier.*`, `score.*`, `qa_outputs.*`). The result has the source's dtype and
    device and is in eval mode.

    Args:
        gpt2_model_or_state_dict: one of `GPT2_HEADS`, a `GPT2Model`, or a state dict of one (keys with or
            without the `transformer.` prefix; legacy `attn.bias` mask buffers are ignored).
        config: required with a state dict (ignored for a model, whose config is used): a
            `GPT2Config`, or an `HfzooDecoderConfig` that GPT-2 can express.
        attn_implementation: attention backend of the result ("eager", "sdpa", ...); default: the
            source model's backend (a model), hfzoo's default (a state dict).

    Returns:
        The hfzoo decoder model (`hfzoo.convert.common.HFZOO_DECODER_HEADS`).

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config hfzoo cannot express (see `hfzoo_config_from_gpt2`); state-dict keys that
            do not match the config (missing / unexpected keys listed); a tied config whose
            `lm_head.weight` differs from `wte.weight`.
    """
    source = gpt2_model_or_state_dict
    state, config, attn_implementation = read_source(
        source, (*GPT2_HEADS, GPT2Model), config, attn_implementation,
        "gpt2_to_hfzoo", "GPT2Config or HfzooDecoderConfig",
    )  # fmt: skip
    if isinstance(config, GPT2Config):
        hfzoo_config = hfzoo_config_from_gpt2(config)
    else:
        gpt2_config_from_hfzoo(config)  # raises if GPT-2 cannot express it
        hfzoo_config = config
    state = {key.removeprefix("transformer."): value for key, value in state.items()}
    state = {key: value for key, value in state.items() if not _LEGACY_GPT2_BUFFERS.fullmatch(key)}
    head = class_position(source, GPT2_HEADS)
    if head is None:  # a state dict, or a GPT2Model
        head = _head_of_state(state, 0)
    if head == CAUSAL_LM:
        state = resolve_tied_head(state, hfzoo_config.tie_word_embeddings, "wte.weight", "lm_head.weight", "GPT-2")
    check_keys(set(state), _expected_gpt2_keys(hfzoo_config.num_hidden_layers, head), "GPT-2")
    model = HFZOO_DECODER_HEADS[head](hfzoo_config)
    return load_converted(model, _gpt2_state_dict_to_hfzoo(state, hfzoo_config, head), attn_implementation)


def hfzoo_to_gpt2(
    model_or_state_dict: HfzooDecoderHeads | Mapping[str, torch.Tensor],
    config: HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> GPT2Models:
    """Convert an hfzoo decoder (or its state dict) to the GPT-2 class computing the same outputs.

    The inverse of `gpt2_to_hfzoo`: `HfzooDecoderForCausalLM` -> `GPT2LMHeadModel`,
    `HfzooDecoderForSequenceClassification` -> `GPT2ForSequenceClassification`,
    `HfzooDecoderForTokenClassification` -> `GPT2ForTokenClassification` (`score` -> `classifier`),
    `HfzooDecoderForQuestionAnswering` -> `GPT2ForQuestionAnswering` (a state dict: from its keys). `q_proj`,
    `k_proj`, `v_proj` `(hidden, hidden)` are transposed and concatenated into `c_attn` `(hidden, 3 * hidden)`,
    the other `nn.Linear` weights `(out, in)` are transposed to `Conv1D`'s `(in, out)`. The result has the
    source's dtype and device, eval mode.

    Args:
        model_or_state_dict: an hfzoo decoder of `hfzoo.convert.common.HFZOO_DECODER_HEADS`, or its state dict.
        config: required with a state dict (ignored for a model): the `HfzooDecoderConfig`.
        attn_implementation: attention backend of the result; default: the source model's backend
            (a model), transformers' default (a state dict).

    Returns:
        The GPT-2 model (`GPT2_HEADS`).

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type / config type.
        ValueError: a config GPT-2 cannot express (see `gpt2_config_from_hfzoo`); state-dict keys that
            do not match the config; a tied config whose `lm_head.weight` differs from the embeddings.
    """
    source = model_or_state_dict
    state, config, attn_implementation = read_source(
        source, HFZOO_DECODER_HEADS, config, attn_implementation, "hfzoo_to_gpt2", "HfzooDecoderConfig"
    )
    gpt2_config = gpt2_config_from_hfzoo(config)
    head = class_position(source, HFZOO_DECODER_HEADS)
    if head is None:  # a state dict
        head = _head_of_state(state, 1)
    if head == CAUSAL_LM:
        state = resolve_tied_head(
            state, config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.weight", "hfzoo"
        )
    expected = {h for _, h, _ in _global_keys(head)} | {h for _, h in GPT2_TO_HFZOO_HEADS[head]}
    expected |= {
        f"model.layers.{i}.{key}"
        for i in range(config.num_hidden_layers)
        for _, h, _ in GPT2_TO_HFZOO_LAYER
        for key in (h if isinstance(h, tuple) else (h,))
    }
    check_keys(set(state), expected, "hfzoo")
    model = GPT2_HEADS[head](gpt2_config)
    return load_converted(model, _hfzoo_state_dict_to_gpt2(state, config, head), attn_implementation)
