"""The config boundary, tested by property (`hypothesis`) over every field of the three hfzoo configs.

`DOMAINS` gives each field its documented domain: a strategy of values inside it (with the other fields a
value needs to apply, e.g. `linformer_k` needs `token_mixer="linformer"`) and one of values outside it (out of
range, unknown choices, broken cross-field rules such as heads that do not divide the hidden size); values
of the wrong type are drawn for every field from its annotation. Properties:

- outside: the config constructor and `build_config` refuse the value with a `ValueError` naming the field;
- inside: the config builds, and a tiny model (eager attention) of it gives a finite loss and finite
  gradients on a short padded batch; a few fields drawn together either build such a model or are refused
  by a cross-field rule naming one of them;
- coverage: every field of the three configs has a domain here, or is listed in `UNCOVERED` with a reason.

Examples found by the property test once, kept as regular tests, are at the end (`FOUND`).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, make_batch
from huggingface_hub.errors import StrictDataclassClassValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedConfig

from hfzoo.configuration_utils import OTHER_MODELS_FIELD_NAMES, _hfzoo_field_types
from hfzoo.models.presets import build_config
from hfzoo.modules.experts import ROUTERS
from hfzoo.modules.feed_forward import ACTIVATIONS
from hfzoo.modules.layer import NORM_POSITIONS
from hfzoo.modules.linformer import LINFORMER_SHARING
from hfzoo.modules.memory import MEMORY_QUERY_NORMS
from hfzoo.modules.mixers import TOKEN_MIXERS
from hfzoo.modules.norms import NORM_CLASSES, QK_NORMS
from hfzoo.modules.positions import POSITION_EMBEDDING_TYPES
from hfzoo.modules.stack import BLOCK_SHARING, LAYER_TYPES
from hfzoo.modules.synthesizer import SYNTHESIZER_MIXINGS, SYNTHESIZERS

ALL = ("decoder", "encoder", "encoder-decoder")
MODEL_TYPES = {"decoder": "hfzoo_decoder", "encoder": "hfzoo_encoder", "encoder-decoder": "hfzoo_encoder_decoder"}
BASE = {**TINY, "bos_token_id": None}  # vocab 97, hidden 32, 4 heads, 2 layers, 64 positions, pad 0, eos 1
VOCAB = BASE["vocab_size"]

# --------------------------------------------------------------------------------------------- domains


@dataclass
class Domain:
    """A field's documented domain: values inside (`valid`) and outside it (`invalid`, beside wrong types).

    `valid` may be a function of the family; `needs` maps a value to the other fields it needs to apply
    (default: none); `families` are the configs the field's non-default values apply to.
    """

    valid: object  # a strategy, or callable(family) -> strategy
    invalid: st.SearchStrategy = field(default_factory=st.nothing)
    needs: object = None  # callable(value) -> dict, or a dict for every value
    families: tuple[str, ...] = ALL

    def valid_for(self, family: str) -> st.SearchStrategy:
        """`valid`, or for a field whose domain depends on the family, `valid(family)`."""
        return self.valid(family) if callable(self.valid) else self.valid

    def companions(self, value) -> dict:
        if self.needs is None:
            return {}
        return self.needs(value) if callable(self.needs) else dict(self.needs)


def positive(low: int = 1, high: int = 4) -> st.SearchStrategy:
    return st.integers(low, high)


NOT_POSITIVE = st.integers(max_value=0)
PROBABILITY = st.floats(0.0, 0.9)
NOT_PROBABILITY = st.one_of(st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False),
                            st.floats(min_value=1.0, allow_nan=False, allow_infinity=False))  # fmt: skip
POSITIVE_FLOAT = st.floats(1e-6, 10.0)
NOT_POSITIVE_FLOAT = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
NON_NEGATIVE_FLOAT = st.floats(0.0, 1.0)
NEGATIVE_FLOAT = st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False)
TOKEN = st.integers(0, VOCAB - 1)
NOT_TOKEN = st.one_of(st.integers(max_value=-1), st.integers(min_value=VOCAB))


def unknown(names) -> st.SearchStrategy:
    """Strings that are not choices (`names`)."""
    return st.text(min_size=1, max_size=12).filter(lambda text: text not in set(names))


def causal_mixers(model_type: str) -> list[str]:
    return [n for n, m in TOKEN_MIXERS.items() if m.runs_in(model_type, True)]


def bidirectional_mixers(model_type: str) -> list[str]:
    return [n for n, m in TOKEN_MIXERS.items() if m.runs_in(model_type, False)]


#: What a token mixer needs to run on the tiny batch (11 tokens).
MIXER_NEEDS = {
    "linformer": {"linformer_k": 8},
    "sliding_window": {"attention_window": 4},
    "bigbird": {"bigbird_block_size": 2, "bigbird_num_random_blocks": 1},
    "lightweight_convolution": {"conv_kernel_size": 3},
    "dynamic_convolution": {"conv_kernel_size": 3},
    "synthesizer": {"position_embedding_type": "none"},
}


def stack_mixers(family: str) -> list[str]:
    """The token mixers `token_mixer` may name in `family` (the encoder-decoder's: both its stacks')."""
    model_type = MODEL_TYPES[family]
    if family == "decoder":
        return causal_mixers(model_type)
    if family == "encoder":
        return bidirectional_mixers(model_type)
    return [m for m in causal_mixers(model_type) if m in bidirectional_mixers(model_type)]


DOMAINS: dict[str, Domain] = {
    # ---- sizes
    "vocab_size": Domain(st.integers(VOCAB, 2 * VOCAB), NOT_POSITIVE),
    "hidden_size": Domain(st.sampled_from([16, 32, 48]), st.one_of(NOT_POSITIVE, st.sampled_from([30, 34]))),
    "num_hidden_layers": Domain(positive(1, 3), NOT_POSITIVE),
    "num_attention_heads": Domain(st.sampled_from([1, 2, 4, 8]), st.one_of(NOT_POSITIVE, st.sampled_from([3, 5]))),
    # grouped-query attention: key/value heads dividing the query heads (None: one per query head)
    "num_key_value_heads": Domain(
        st.sampled_from([None, 1, 2, 4]), st.one_of(NOT_POSITIVE, st.sampled_from([3])), {"num_attention_heads": 4}
    ),
    "head_dim": Domain(st.one_of(st.none(), st.sampled_from([4, 8, 12])), NOT_POSITIVE),
    "intermediate_size": Domain(positive(8, 64), NOT_POSITIVE),
    "max_position_embeddings": Domain(positive(16, 128), NOT_POSITIVE),
    "embedding_size": Domain(st.one_of(st.none(), st.sampled_from([8, 16, 24])), NOT_POSITIVE),
    # ---- feed-forward
    "hidden_act": Domain(st.sampled_from(sorted(ACTIVATIONS)), unknown(ACTIVATIONS)),
    "gated_mlp": Domain(st.booleans()),
    "mlp_bias": Domain(st.booleans()),
    "activation_dropout": Domain(st.one_of(st.none(), PROBABILITY), NOT_PROBABILITY),
    # ---- norms and residuals
    "norm_type": Domain(st.sampled_from(list(NORM_CLASSES)), unknown(NORM_CLASSES)),
    "norm_position": Domain(st.sampled_from(list(NORM_POSITIONS)), unknown(NORM_POSITIONS)),
    "embedding_norm": Domain(st.booleans()),
    "layer_norm_eps": Domain(st.floats(1e-8, 1e-2), NOT_POSITIVE_FLOAT),
    "rms_norm_eps": Domain(st.floats(1e-8, 1e-2), NOT_POSITIVE_FLOAT, needs={"norm_type": "rms_norm"}),
    "rezero": Domain(st.booleans()),
    "fixup_init": Domain(st.booleans(), needs=lambda v: {"norm_type": "none"} if v else {}),
    "residual_gating": Domain(
        st.sampled_from(["none", "gru"]),
        unknown(["none", "gru"]),
        needs=lambda v: {"layer_stack": "universal"} if v != "none" else {},
    ),  # fmt: skip
    "value_residual": Domain(st.booleans()),
    "unet_skips": Domain(st.booleans(), needs=lambda v: {"num_hidden_layers": 4} if v else {}),
    # ---- dropout, init
    "hidden_dropout_prob": Domain(PROBABILITY, NOT_PROBABILITY),
    "attention_probs_dropout_prob": Domain(PROBABILITY, NOT_PROBABILITY),
    "initializer_range": Domain(st.floats(1e-4, 0.5), NOT_POSITIVE_FLOAT),
    # ---- embeddings and output
    "tie_word_embeddings": Domain(st.booleans()),
    "scale_embeddings": Domain(st.booleans()),
    "scale_lm_head_input": Domain(st.booleans()),
    "num_softmaxes": Domain(positive(1, 3), NOT_POSITIVE),
    "adaptive_input_cutoffs": Domain(
        st.one_of(st.none(), st.sampled_from([[20, 50], [10, 40, 80]])),
        st.sampled_from([[50, 20], [0, 20], [20, VOCAB], []]),
    ),
    "adaptive_input_factor": Domain(
        st.floats(1.0, 4.0),
        st.floats(max_value=0.99, allow_nan=False, allow_infinity=False),
        needs={"adaptive_input_cutoffs": [20, 50]},
    ),  # fmt: skip
    "adaptive_softmax_cutoffs": Domain(
        st.one_of(st.none(), st.sampled_from([[20, 50], [10, 40, 80]])),
        st.sampled_from([[50, 20], [0, 20], [20, VOCAB], []]),
        needs=lambda v: {"tie_word_embeddings": False} if v else {},
    ),
    "adaptive_softmax_factor": Domain(
        st.floats(1.0, 4.0),
        st.floats(max_value=0.99, allow_nan=False, allow_infinity=False),
        needs={"adaptive_softmax_cutoffs": [20, 50], "tie_word_embeddings": False},
    ),  # fmt: skip
    "block_sharing": Domain(st.sampled_from(["none", "all"]), unknown(BLOCK_SHARING)),
    # ---- token ids
    "pad_token_id": Domain(st.one_of(st.none(), TOKEN), NOT_TOKEN),
    "bos_token_id": Domain(st.one_of(st.none(), TOKEN), NOT_TOKEN),
    "eos_token_id": Domain(st.one_of(st.none(), TOKEN, st.lists(TOKEN, min_size=1, max_size=2)), NOT_TOKEN),
    "use_cache": Domain(st.booleans()),
    # ---- experts
    "num_experts": Domain(st.sampled_from([0, 2, 4]), st.one_of(st.integers(max_value=-1), st.just(1))),
    "num_experts_per_tok": Domain(positive(1, 2), NOT_POSITIVE, needs={"num_experts": 4}),
    "router_type": Domain(st.sampled_from(list(ROUTERS)), unknown(ROUTERS), needs={"num_experts": 4}),
    "expert_capacity_factor": Domain(
        st.floats(0.25, 2.0), NOT_POSITIVE_FLOAT, needs={"num_experts": 4, "router_type": "switch"}
    ),  # fmt: skip
    "router_aux_loss_coef": Domain(NON_NEGATIVE_FLOAT, NEGATIVE_FLOAT, needs={"num_experts": 4}),
    "router_z_loss_coef": Domain(NON_NEGATIVE_FLOAT, NEGATIVE_FLOAT, needs={"num_experts": 4}),
    "moe_layer_interval": Domain(positive(1, 2), NOT_POSITIVE, needs={"num_experts": 4}),
    "output_router_logits": Domain(st.booleans(), needs={"num_experts": 4}),
    # ---- positions
    "position_embedding_type": Domain(
        st.sampled_from(list(POSITION_EMBEDDING_TYPES)), unknown(POSITION_EMBEDDING_TYPES)
    ),
    "relative_attention_num_buckets": Domain(
        st.sampled_from([4, 8, 32]),
        st.one_of(NOT_POSITIVE, st.integers(1, 3)),
        needs={"position_embedding_type": "relative_attention_bias"},
    ),
    "relative_attention_max_distance": Domain(
        st.integers(17, 128),
        st.one_of(NOT_POSITIVE, st.integers(1, 16)),  # must exceed the 32 // 2 exact buckets
        needs={"position_embedding_type": "relative_attention_bias"},
    ),
    "share_relative_attention_bias": Domain(
        st.booleans(), needs={"position_embedding_type": "relative_attention_bias"}
    ),
    "max_relative_positions": Domain(positive(1, 16), NOT_POSITIVE, needs={"position_embedding_type": "shaw"}),
    "rope_theta": Domain(st.floats(10.0, 1e6), NOT_POSITIVE_FLOAT, needs={"position_embedding_type": "rotary"}),
    "scale_attention_scores": Domain(st.booleans()),
    "attention_bias": Domain(st.booleans()),
    # ---- token mixers and layers
    "token_mixer": Domain(
        lambda family: st.sampled_from(stack_mixers(family)),
        unknown(TOKEN_MIXERS),
        needs=lambda v: MIXER_NEEDS.get(v, {}),
    ),
    "sublayer_pattern": Domain(
        st.one_of(st.none(), st.sampled_from(["sfsf", "ssff", "sffs"])), st.sampled_from(["", "sf", "sxsf", "sfsfsf"])
    ),  # fmt: skip
    "linformer_k": Domain(
        positive(2, 16),
        st.one_of(NOT_POSITIVE, st.integers(65, 200)),
        needs={"token_mixer": "linformer"},
        families=("encoder",),
    ),
    "linformer_sharing": Domain(
        st.sampled_from(list(LINFORMER_SHARING)),
        unknown(LINFORMER_SHARING),
        needs={"token_mixer": "linformer", "linformer_k": 8},
        families=("encoder",),
    ),  # fmt: skip
    "attention_window": Domain(
        st.integers(1, 8).map(lambda half: 2 * half),
        st.one_of(NOT_POSITIVE, st.sampled_from([1, 3, 5])),
        needs={"token_mixer": "sliding_window"},
    ),
    "bigbird_block_size": Domain(
        positive(1, 3),
        NOT_POSITIVE,
        needs={"token_mixer": "bigbird", "bigbird_num_random_blocks": 1},
        families=("encoder",),
    ),
    "bigbird_num_random_blocks": Domain(
        st.integers(0, 1),
        st.integers(max_value=-1),
        needs={"token_mixer": "bigbird", "bigbird_block_size": 2},
        families=("encoder",),
    ),  # fmt: skip
    "bigbird_num_global_blocks": Domain(
        st.integers(0, 2),
        st.integers(max_value=-1),
        needs={"token_mixer": "bigbird", "bigbird_block_size": 2, "bigbird_num_random_blocks": 1},
        families=("encoder",),
    ),  # fmt: skip
    "layer_type": Domain(st.sampled_from(list(LAYER_TYPES)), unknown(LAYER_TYPES)),
    "conv_kernel_size": Domain(
        st.sampled_from([1, 3, [3, 5]]),
        st.one_of(NOT_POSITIVE, st.just([3, 0])),
        needs={"token_mixer": "lightweight_convolution"},
    ),  # fmt: skip
    "conv_num_heads": Domain(
        st.one_of(st.none(), st.sampled_from([1, 2, 4])),
        NOT_POSITIVE,
        needs={"token_mixer": "lightweight_convolution", "conv_kernel_size": 3},
    ),  # fmt: skip
    "conv_weight_dropout": Domain(
        PROBABILITY, NOT_PROBABILITY, needs={"token_mixer": "lightweight_convolution", "conv_kernel_size": 3}
    ),  # fmt: skip
    "conv_pointwise_projection": Domain(
        st.booleans(), needs={"token_mixer": "lightweight_convolution", "conv_kernel_size": 3}
    ),  # fmt: skip
    "synthesizer_type": Domain(
        st.sampled_from(list(SYNTHESIZERS)),
        unknown(SYNTHESIZERS),
        needs={"token_mixer": "synthesizer", "position_embedding_type": "none"},
    ),  # fmt: skip
    "synthesizer_mixing": Domain(
        st.sampled_from(list(SYNTHESIZER_MIXINGS)),
        unknown(SYNTHESIZER_MIXINGS),
        needs={"token_mixer": "synthesizer", "position_embedding_type": "none"},
    ),  # fmt: skip
    "synthesizer_num_heads": Domain(
        st.one_of(st.none(), st.sampled_from([1, 2, 4])),
        NOT_POSITIVE,
        needs={"token_mixer": "synthesizer", "position_embedding_type": "none"},
    ),  # fmt: skip
    "synthesizer_head_dim": Domain(
        st.one_of(st.none(), st.sampled_from([4, 8])),
        NOT_POSITIVE,
        needs={"token_mixer": "synthesizer", "position_embedding_type": "none"},
    ),  # fmt: skip
    "synthesizer_factorized_rank": Domain(
        positive(1, 8),
        NOT_POSITIVE,
        needs={
            "token_mixer": "synthesizer",
            "position_embedding_type": "none",
            "synthesizer_type": "factorized_random",
        },
    ),  # fmt: skip
    "transparent_attention": Domain(st.booleans(), families=("encoder-decoder",)),
    "layer_stack": Domain(st.sampled_from(["standard", "universal"]), unknown(["standard", "universal", "funnel"])),
    "num_recurrent_steps": Domain(positive(1, 3), NOT_POSITIVE, needs={"layer_stack": "universal"}),
    "adaptive_computation_time": Domain(st.booleans(), needs={"layer_stack": "universal"}),
    "act_threshold": Domain(
        st.floats(0.5, 0.999),
        st.one_of(NOT_POSITIVE_FLOAT, st.floats(min_value=1.01, allow_nan=False, allow_infinity=False)),
        needs={"layer_stack": "universal"},
    ),  # fmt: skip
    "act_loss_coef": Domain(NON_NEGATIVE_FLOAT, NEGATIVE_FLOAT, needs={"layer_stack": "universal"}),
    "funnel_block_sizes": Domain(
        st.sampled_from([[1, 1], [2]]),
        st.sampled_from([[0, 1], [], [1, 1, 1]]),
        needs={"layer_stack": "funnel"},
        families=("encoder",),
    ),  # fmt: skip
    "funnel_upsampling_layers": Domain(
        st.integers(0, 2),
        st.integers(max_value=-1),
        needs={"layer_stack": "funnel", "funnel_block_sizes": [1, 1]},
        families=("encoder",),
    ),  # fmt: skip
    "memory_layers": Domain(
        st.one_of(st.none(), st.sampled_from([[0], [1], [-1], [0, 1]])),
        st.sampled_from([[2], [-3], [0, 0], [0, -2]]),
        needs=lambda v: {"memory_num_keys": 4, "memory_top_k": 2, "memory_key_dim": 8} if v else {},
    ),  # fmt: skip
    "memory_num_keys": Domain(
        positive(2, 8), NOT_POSITIVE, needs={"memory_layers": [0], "memory_top_k": 2, "memory_key_dim": 8}
    ),
    "memory_heads": Domain(
        positive(1, 4),
        NOT_POSITIVE,
        needs={"memory_layers": [0], "memory_num_keys": 4, "memory_top_k": 2, "memory_key_dim": 8},
    ),  # fmt: skip
    "memory_top_k": Domain(
        positive(1, 4),
        st.one_of(NOT_POSITIVE, st.integers(5, 20)),
        needs={"memory_layers": [0], "memory_num_keys": 4, "memory_key_dim": 8},
    ),  # fmt: skip
    "memory_key_dim": Domain(
        st.sampled_from([4, 8, 16]), NOT_POSITIVE, needs={"memory_layers": [0], "memory_num_keys": 4, "memory_top_k": 2}
    ),  # fmt: skip
    "memory_query_norm": Domain(
        st.sampled_from(list(MEMORY_QUERY_NORMS)),
        unknown(MEMORY_QUERY_NORMS),
        needs={"memory_layers": [0], "memory_num_keys": 4, "memory_top_k": 2, "memory_key_dim": 8},
    ),  # fmt: skip
    # ---- attention
    "qk_norm": Domain(st.one_of(st.none(), st.sampled_from(list(QK_NORMS))), unknown(QK_NORMS)),
    "qk_norm_learnable_scale": Domain(st.booleans(), needs={"qk_norm": "rms_norm"}),
    "attn_logit_softcapping": Domain(st.one_of(st.none(), POSITIVE_FLOAT), NOT_POSITIVE_FLOAT),
    "final_logit_softcapping": Domain(st.one_of(st.none(), POSITIVE_FLOAT), NOT_POSITIVE_FLOAT),
    # ---- the task heads' (every family)
    "classifier_dropout": Domain(st.one_of(st.none(), PROBABILITY), NOT_PROBABILITY),
    # ---- the encoder's
    "type_vocab_size": Domain(st.integers(0, 2), st.integers(max_value=-1), families=("encoder",)),
    # ---- the encoder-decoder's
    "num_decoder_layers": Domain(st.one_of(st.none(), positive(1, 3)), NOT_POSITIVE, families=("encoder-decoder",)),
    "decoder_start_token_id": Domain(TOKEN, NOT_TOKEN, families=("encoder-decoder",)),
    "tie_encoder_decoder_embeddings": Domain(st.booleans(), families=("encoder-decoder",)),
    "decoder_token_mixer": Domain(
        st.one_of(st.none(), st.sampled_from(causal_mixers("hfzoo_encoder_decoder"))),
        unknown(TOKEN_MIXERS),
        needs=lambda v: MIXER_NEEDS.get(v, {}),
        families=("encoder-decoder",),
    ),  # fmt: skip
    "decoder_layer_stack": Domain(
        st.sampled_from([None, "standard", "universal"]),
        unknown(["standard", "universal"]),
        families=("encoder-decoder",),
    ),  # fmt: skip
    "decoder_memory_layers": Domain(
        st.one_of(st.none(), st.sampled_from([[0], [-1]])),
        st.sampled_from([[2], [-3]]),
        needs=lambda v: {"memory_num_keys": 4, "memory_top_k": 2, "memory_key_dim": 8} if v else {},
        families=("encoder-decoder",),
    ),  # fmt: skip
}

#: Fields of the configs without a domain here, and why.
UNCOVERED = {
    name: "a field of transformers' PreTrainedConfig (validated there), not an hfzoo architecture field"
    for name in (f.name for f in dataclasses.fields(PreTrainedConfig))
}


def config_fields(family: str) -> list[str]:
    return [f.name for f in dataclasses.fields(FAMILIES[family][0])]


def family_fields(family: str) -> list[tuple[str, str]]:
    return [(family, name) for name in config_fields(family) if name in DOMAINS and family in DOMAINS[name].families]


CASES = [case for family in ALL for case in family_fields(family)]
CASE_IDS = [f"{family}-{name}" for family, name in CASES]


# --------------------------------------------------------------------------------------------- helpers


def wrong_type(annotation) -> st.SearchStrategy:
    """Values of none of the types `annotation` allows (booleans count as neither integers nor numbers)."""
    from hfzoo.configuration_utils import _type_error

    candidates = st.one_of(
        st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
        st.none(), st.lists(st.integers(0, 5), max_size=2), st.lists(st.text(max_size=2), min_size=1, max_size=2),
    )  # fmt: skip
    return candidates.filter(lambda value: _type_error(value, annotation) is not None)


def invalid_companions(domain: Domain) -> dict:
    """The fields an out-of-domain value is drawn with: what the field needs to apply at all."""
    if isinstance(domain.needs, dict):
        return dict(domain.needs)
    return {}


def refusal(family: str, values: dict) -> str | None:
    """The message of the refusal of `values` by the config constructor (None when it builds)."""
    config_class = FAMILIES[family][0]
    try:
        config_class(**{**BASE, **values})
    except StrictDataclassClassValidationError as err:
        cause = err.__cause__
        assert isinstance(cause, ValueError), f"{type(cause).__name__}: {cause} (not a ValueError) for {values}"
        return str(cause)
    except ValueError as err:  # raised before the validators (`__post_init__`)
        return str(err)
    return None


def check_finite_model(family: str, values: dict) -> None:
    """A tiny model of `values` gives a finite loss and finite gradients (eager attention, fixed seed)."""
    config_class, model_class = FAMILIES[family]
    config = config_class(**{**BASE, **values})
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="eager")
    model.train()
    batch = make_batch(family, seed=0)
    kwargs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "labels": batch.labels}
    if batch.decoder_input_ids is not None:
        kwargs["decoder_input_ids"] = batch.decoder_input_ids
    output = model(**kwargs)
    assert torch.isfinite(output.loss), f"loss {output.loss} for {values}"
    output.loss.backward()
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), f"gradient of {name} not finite for {values}"


def valid_case(family: str, name: str) -> st.SearchStrategy:
    domain = DOMAINS[name]
    return domain.valid_for(family).map(lambda value: {**domain.companions(value), name: value})


PROPERTY = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
                    database=None)  # fmt: skip


# --------------------------------------------------------------------------------------------- properties


def test_every_config_field_has_a_domain_or_a_reason():
    fields = {name for family in ALL for name in config_fields(family)}
    assert sorted(fields - set(DOMAINS) - set(UNCOVERED)) == []  # a new field needs a domain here
    assert sorted(set(DOMAINS) - fields) == []  # and a domain of a field that is gone is dropped
    assert all(reason for reason in UNCOVERED.values())
    assert set(UNCOVERED).isdisjoint(_hfzoo_field_types(FAMILIES["encoder-decoder"][0]))  # only transformers' own


@pytest.mark.parametrize("family, name", CASES, ids=CASE_IDS)
@settings(PROPERTY, max_examples=12)
@given(data=st.data())
def test_values_outside_a_fields_domain_are_refused_naming_it(family, name, data):
    annotation = _hfzoo_field_types(FAMILIES[family][0])[name]
    value = data.draw(st.one_of(DOMAINS[name].invalid, wrong_type(annotation)), label=name)
    values = {**invalid_companions(DOMAINS[name]), name: value}
    message = refusal(family, values)
    assert message is not None, f"{name}={value!r} was accepted by the {family} config"
    assert name in message, f"the refusal of {name}={value!r} does not name it: {message}"
    if isinstance(value, str) and str not in typing.get_args(annotation) + (annotation,):
        return  # build_config reads a string override as `--config_overrides` text ("1" -> 1): nothing to refuse
    with pytest.raises(ValueError, match=name):
        build_config(f"{family}-tiny", {**BASE, **values})


@pytest.mark.parametrize("family, name", CASES, ids=CASE_IDS)
@settings(PROPERTY, max_examples=3)
@given(data=st.data())
def test_values_inside_a_fields_domain_build_a_model_with_finite_loss_and_gradients(family, name, data):
    values = data.draw(valid_case(family, name), label=name)
    message = refusal(family, values)
    assert message is None, f"{values} (inside the domain) was refused: {message}"
    check_finite_model(family, values)


@pytest.mark.parametrize("family", ALL)
@settings(PROPERTY, max_examples=25)
@given(data=st.data())
def test_fields_drawn_together_build_a_finite_model_or_are_refused_naming_one(family, data):
    names = data.draw(
        st.lists(st.sampled_from([n for f, n in family_fields(family)]), min_size=2, max_size=4, unique=True)
    )
    values: dict = {}
    for name in names:
        values.update(data.draw(valid_case(family, name), label=name))
    message = refusal(family, values)
    if message is not None:
        assert any(key in message for key in values), f"the refusal of {values} names none of them: {message}"
        return
    check_finite_model(family, values)


# --------------------------------------------------------------------------------------------- found


#: Inputs the property test found refused with a traceback or accepted; each is now refused naming its field.
FOUND = [
    ("decoder", {"hidden_dropout_prob": "0.1"}, "hidden_dropout_prob must be a finite number, got '0.1'"),
    ("decoder", {"embedding_norm": "yes"}, "embedding_norm must be True or False, got 'yes'"),
    ("encoder", {"initializer_range": math.nan}, "initializer_range must be a finite number, got nan"),
    ("decoder", {"layer_norm_eps": math.inf}, "layer_norm_eps must be a finite number, got inf"),
    ("decoder", {"vocab_size": True}, "vocab_size must be an integer, got True"),
    ("encoder-decoder", {"tie_encoder_decoder_embeddings": None}, "tie_encoder_decoder_embeddings must be True or False"),
    ("decoder", {"eos_token_id": VOCAB}, f"eos_token_id={VOCAB} is outside the vocabulary [0, {VOCAB})"),
    ("encoder", {"eos_token_id": -1}, f"eos_token_id=-1 is outside the vocabulary [0, {VOCAB})"),
    ("decoder", {"num_attention_heads": "4"}, "num_attention_heads must be an integer, got '4'"),
    ("decoder", {"conv_kernel_size": [3, "5"], "token_mixer": "lightweight_convolution"},
     "conv_kernel_size must be an integer or a list of integers or None"),
]  # fmt: skip


@pytest.mark.parametrize("family, values, expected", FOUND, ids=[next(iter(v)) for _, v, _ in FOUND])
def test_inputs_the_property_test_found_are_refused_naming_the_field(family, values, expected):
    message = refusal(family, values)
    assert message is not None and expected in message, message


# --------------------------------------------------------------------------------------------- misspelt keywords


@pytest.mark.compat  # how PreTrainedConfig hands unknown keywords to __post_init__ is transformers' own
@pytest.mark.parametrize("family", ALL)
def test_a_misspelt_field_name_is_refused_and_other_unknown_keywords_are_kept(family, tmp_path):
    """Every field of the config, misspelt (last letter dropped, a letter doubled, two letters swapped in a name
    of 8 letters or more), is refused (PreTrainedConfig would keep it as an attribute that nothing reads);
    keywords other libraries add (`sep_token_id`, any key of their own) still build, save and load."""
    config_class = FAMILIES[family][0]
    fields = {f.name for f in dataclasses.fields(config_class)}
    for name in sorted(fields):
        typos = {name[:-1], name[:3] + name[2] + name[3:]}
        if len(name) >= 8:  # two letters swapped: a difflib ratio of (n - 1) / n
            typos.add(name[:2] + name[3] + name[2] + name[4:])
        for typo in typos:
            if typo in fields or hasattr(config_class, typo) or typo == name:
                continue
            message = refusal(family, {typo: 4})
            assert message is not None, f"{typo} (for {name}) was accepted by the {family} config"
            assert (
                message.startswith(f"{typo}=4 is not a field of {config_class.__name__}") and "did you mean" in message
            )
    config = config_class(**BASE, sep_token_id=3, my_library_note="kept")
    config.save_pretrained(tmp_path)
    loaded = config_class.from_pretrained(tmp_path)
    assert (loaded.sep_token_id, loaded.my_library_note) == (3, "kept")


@pytest.mark.compat
@pytest.mark.parametrize("family", ALL)
def test_other_models_names_for_a_field_are_refused_and_the_configs_own_aliases_set_it(family, tmp_path):
    """T5's `num_layers=4` would be kept as an attribute that nothing reads, building a 6-layer model; an alias of
    the config's `attribute_map` (the encoder-decoder's `num_encoder_layers`) sets its field, as in transformers."""
    config_class = FAMILIES[family][0]
    fields = {f.name for f in dataclasses.fields(config_class)}
    for name, (target, whose) in OTHER_MODELS_FIELD_NAMES.items():
        assert target in fields, target
        message = refusal(family, {name: 4})
        assert message is not None, f"{name} was accepted by the {family} config"
        assert message.startswith(f"{name}=4 is not a field of {config_class.__name__}"), message
        assert f"{name} is {whose} name for {target}; give {target}" in message, message
    for alias, target in config_class.attribute_map.items():
        config = config_class(**BASE, **{alias: 3})
        assert getattr(config, target) == 3 and getattr(config, alias) == 3
        config.save_pretrained(tmp_path)
        assert getattr(config_class.from_pretrained(tmp_path), target) == 3
