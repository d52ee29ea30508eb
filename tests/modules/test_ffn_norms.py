"""Feed-forward, normalization and mixture-of-experts blocks against closed forms and transformers' references.

The per-family checks of every value (forward/backward, save/load, padding, causality, backends) are
rows of `tests/models/test_variants.py`; this file checks the numbers of each block.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch import nn
from transformers import AutoModel, MixtralConfig, T5Config
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func as mixtral_load_balancing_loss
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func
from transformers.models.t5.modeling_t5 import T5DenseGatedActDense

from hfzoo import AUTO_CLASSES, HfzooDecoderConfig, HfzooEncoderDecoderConfig
from hfzoo.convert import gpt2_config_from_hfzoo
from hfzoo.modules.experts import (
    SparseMoeFeedForward,
    load_balancing_loss,
    router_aux_losses,
    router_z_loss,
)
from hfzoo.modules.feed_forward import ACTIVATIONS, FeedForward
from hfzoo.modules.layer import build_residual, deepnorm_constants, num_residual_branches

H, FF = 16, 24


def config(**overrides) -> HfzooDecoderConfig:
    return HfzooDecoderConfig(**{**TINY, "hidden_size": H, "intermediate_size": FF, **overrides})


# ---------------------------------------------------------------- activations and feed-forward


@pytest.mark.parametrize(
    "name, closed_form",
    [
        ("elu", lambda x: torch.where(x > 0, x, torch.exp(x) - 1)),
        ("selu", lambda x: 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * (torch.exp(x) - 1))),
        ("softplus", lambda x: torch.log1p(torch.exp(x))),
        ("sigmoid", lambda x: 1 / (1 + torch.exp(-x))),
        ("swish", lambda x: x / (1 + torch.exp(-x))),
        ("relu", lambda x: x.clamp(min=0)),
        ("linear", lambda x: x),
    ],
)
def test_activations_match_their_closed_forms(name, closed_form):
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS[name](x), closed_form(x))


@pytest.mark.parametrize("act", ["sigmoid", "relu", "gelu", "silu", "linear", "selu"])
@pytest.mark.parametrize("gated", [False, True])
def test_feed_forward_matches_einsum(act, gated):
    torch.manual_seed(0)
    ffn = FeedForward(config(hidden_act=act, gated_mlp=gated)).double()
    x = torch.randn(2, 5, H, dtype=torch.float64)
    f = ACTIVATIONS[act]
    up = torch.einsum("bsh,fh->bsf", x, ffn.up_proj.weight) + ffn.up_proj.bias
    if gated:  # Shazeer 2020, eq. 6: (act(xW) * xV) W2
        hidden = f(torch.einsum("bsh,fh->bsf", x, ffn.gate_proj.weight) + ffn.gate_proj.bias) * up
    else:  # Vaswani et al. 2017, eq. 2
        hidden = f(up)
    expected = torch.einsum("bsf,hf->bsh", hidden, ffn.down_proj.weight) + ffn.down_proj.bias
    torch.testing.assert_close(ffn(x), expected)


def test_gated_mlp_adds_exactly_one_hidden_by_ff_matrix_per_layer():
    for family, (config_class, model_class) in FAMILIES.items():
        sizes = {}
        for gated in (False, True):
            cfg = config_class(**{**TINY, "gated_mlp": gated, "mlp_bias": False})
            sizes[gated] = sum(p.numel() for p in model_class(cfg).parameters())
        layers = TINY["num_hidden_layers"] * (2 if family == "encoder-decoder" else 1)
        assert sizes[True] - sizes[False] == layers * TINY["hidden_size"] * TINY["intermediate_size"], family


def test_gated_gelu_new_matches_t5_v1_1_feed_forward():
    """T5 v1.1's `T5DenseGatedActDense` is `gated_mlp=True, hidden_act="gelu_new", mlp_bias=False`."""
    t5 = T5DenseGatedActDense(T5Config(d_model=H, d_ff=FF, dense_act_fn="gelu_new", dropout_rate=0.0)).eval()
    ours = FeedForward(config(gated_mlp=True, hidden_act="gelu_new", mlp_bias=False)).eval()
    ours.gate_proj.weight.data.copy_(t5.wi_0.weight)
    ours.up_proj.weight.data.copy_(t5.wi_1.weight)
    ours.down_proj.weight.data.copy_(t5.wo.weight)
    x = torch.randn(3, 7, H)
    torch.testing.assert_close(ours(x), t5(x), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- residual wiring


class Affine(nn.Module):
    """A stand-in sub-block F(x) = tanh(x A + b)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(H, H)

    def forward(self, x):
        return torch.tanh(self.linear(x))


def residual_case(**overrides):
    torch.manual_seed(0)
    cfg = config(**overrides)
    residual = build_residual(cfg)
    for param in residual.parameters():  # move scalars and norm weights off their initial values
        param.data.uniform_(0.5, 1.5)
    norm = nn.LayerNorm(H) if cfg.norm_type == "layer_norm" else nn.Identity()
    if isinstance(norm, nn.LayerNorm):
        norm.weight.data.uniform_(0.5, 1.5)
        norm.bias.data.uniform_(-0.5, 0.5)
    return residual, norm, Affine(), torch.randn(2, 4, H)


def layer_norm(x, module):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


def test_residual_wirings_match_their_formulas():
    identity = nn.Identity()
    for overrides, formula in [
        ({"norm_position": "pre"}, lambda x, r, n, f: x + f(layer_norm(x, n))),
        ({"norm_position": "post"}, lambda x, r, n, f: layer_norm(x + f(x), n)),
        (
            {"norm_position": "sandwich"},  # Ding et al. 2021: x + LN'(F(LN(x)))
            lambda x, r, n, f: x + layer_norm(f(layer_norm(x, n)), r.post_norm),
        ),
        (
            {"norm_position": "deepnorm"},  # Wang et al. 2022 eq. 1: LN(alpha x + F(x))
            lambda x, r, n, f: layer_norm(r.deepnorm_alpha * x + f(x), n),
        ),
        (
            {"norm_position": "pre", "rezero": True},  # Bachlechner et al. 2020 + pre-LN
            lambda x, r, n, f: x + r.rezero_alpha * f(layer_norm(x, n)),
        ),
        ({"norm_type": "none", "rezero": True}, lambda x, r, n, f: x + r.rezero_alpha * f(x)),
        (
            {"norm_type": "none", "fixup_init": True},  # Zhang et al. 2019 Fig. 1: scalar biases and multiplier
            lambda x, r, n, f: x + r.fixup_scale * f(x + r.fixup_bias_in) + r.fixup_bias_out,
        ),
    ]:
        residual, norm, sublayer, x = residual_case(**overrides)
        got = residual(x, norm, sublayer, identity)
        torch.testing.assert_close(got, formula(x, residual, norm, sublayer), msg=str(overrides))


def test_deepnorm_constants_follow_the_paper():
    dec = config(norm_position="deepnorm", num_hidden_layers=6)
    assert deepnorm_constants(dec, False) == pytest.approx((12**0.25, 48**-0.25))
    encdec = FAMILIES["encoder-decoder"][0](**{**TINY, "num_hidden_layers": 6, "num_decoder_layers": 4})
    n, m = 6, 4
    assert deepnorm_constants(encdec, False) == pytest.approx(
        (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16))
    )
    assert deepnorm_constants(encdec, True) == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))
    assert num_residual_branches(encdec) == 2 * n + 3 * m


# ---------------------------------------------------------------- initialisation


def init_stats(family, **overrides):
    width = dict(hidden_size=128, intermediate_size=128, num_attention_heads=4, num_hidden_layers=3)
    return build_model(family, {**width, **overrides}), FAMILIES[family][0](**{**TINY, **width, **overrides})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_deepnorm_scales_value_output_and_ffn_init_by_beta(family):
    model, cfg = init_stats(family, norm_position="deepnorm")
    std = cfg.initializer_range
    for layer in model.modules():
        if type(layer).__name__ != "HfzooLayer":
            continue
        beta = layer.mlp_residual.deepnorm_beta
        assert beta < 1
        for name, expected in [
            ("self_attn.q_proj", std),
            ("self_attn.k_proj", std),
            ("self_attn.v_proj", std * beta),
            ("self_attn.o_proj", std * beta),
            ("mlp.up_proj", std * beta),
            ("mlp.down_proj", std * beta),
        ]:
            weight = layer.get_submodule(name).weight
            assert weight.std().item() == pytest.approx(expected, rel=0.05), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fixup_zeroes_branch_outputs_and_scales_the_rest(family):
    model, cfg = init_stats(family, norm_type="none", fixup_init=True, gated_mlp=True)
    scale = num_residual_branches(cfg) ** -0.5
    std = cfg.initializer_range
    layers = [m for m in model.modules() if type(m).__name__ == "HfzooLayer"]
    assert len(layers) == cfg.num_hidden_layers * (2 if family == "encoder-decoder" else 1)
    for layer in layers:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.q_proj.weight.std().item() == pytest.approx(std, rel=0.05)
        for name in ("self_attn.v_proj", "mlp.up_proj", "mlp.gate_proj"):
            assert layer.get_submodule(name).weight.std().item() == pytest.approx(std * scale, rel=0.05), name
        assert layer.mlp_residual.fixup_scale.item() == 1 and layer.mlp_residual.fixup_bias_in.item() == 0
    # every residual branch is zero at init: each layer is the identity
    batch = make_batch(family)
    with torch.no_grad():
        out = run(model, batch, output_hidden_states=True)
    states = out.hidden_states if family != "encoder-decoder" else out.decoder_hidden_states
    for before, after in zip(states[:-1], states[1:], strict=True):
        torch.testing.assert_close(before, after)


def test_rezero_layers_are_identity_at_init():
    model = build_model("decoder", {"norm_type": "none", "rezero": True})
    with torch.no_grad():
        out = run(model, make_batch("decoder"), output_hidden_states=True)
    assert len(out.hidden_states) == TINY["num_hidden_layers"] + 1
    for state in out.hidden_states[1:]:
        torch.testing.assert_close(state, out.hidden_states[0])


@pytest.mark.parametrize(
    "overrides",
    [
        {"norm_type": "none", "fixup_init": True},
        {"norm_position": "deepnorm"},
        {"norm_type": "rms_norm", "rezero": True},
        {"num_experts": 3, "num_experts_per_tok": 2, "gated_mlp": True},
    ],
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_from_pretrained_never_reinitialises_loaded_weights(family, overrides, tmp_path):
    """Custom initialisation (zeros, rescaling, ReZero/Fixup scalars) must not touch loaded tensors."""
    model = build_model(family, overrides)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.rand_like(param) + 0.1)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    expected, got = model.state_dict(), loaded.state_dict()
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


# ---------------------------------------------------------------- mixture of experts


def test_top_k_moe_matches_mixtral_sparse_moe_block():
    cfg = config(num_experts=4, num_experts_per_tok=2, gated_mlp=True, hidden_act="silu", mlp_bias=False)
    torch.manual_seed(0)
    ours = SparseMoeFeedForward(cfg).eval()
    mixtral = MixtralSparseMoeBlock(
        MixtralConfig(hidden_size=H, intermediate_size=FF, num_local_experts=4, num_experts_per_tok=2)
    ).eval()
    with torch.no_grad():
        mixtral.gate.weight.copy_(ours.router.classifier.weight)
        for e, expert in enumerate(ours.experts):
            mixtral.experts.gate_up_proj[e].copy_(torch.cat([expert.gate_proj.weight, expert.up_proj.weight]))
            mixtral.experts.down_proj[e].copy_(expert.down_proj.weight)
    x = torch.randn(2, 9, H)
    torch.testing.assert_close(ours(x), mixtral(x), rtol=1e-5, atol=1e-6)


def switch_reference(moe: SparseMoeFeedForward, x: torch.Tensor, mask: torch.Tensor, factor: float) -> torch.Tensor:
    """Fedus et al. 2021 written out token by token: top-1, gate = p, first come first served up to capacity."""
    num_experts = len(moe.experts)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        capacity = math.ceil(factor * int(mask[b].sum()) / num_experts)
        load = [0] * num_experts
        for t in range(x.shape[1]):
            if not mask[b, t]:
                continue
            probs = torch.softmax(x[b, t] @ moe.router.classifier.weight.T, dim=-1)
            e = int(probs.argmax())
            load[e] += 1
            if load[e] <= capacity:
                out[b, t] = probs[e] * moe.experts[e](x[b, t])
    return out


def test_switch_routing_matches_the_written_out_algorithm_and_drops_tokens():
    factor = 0.75
    cfg = config(num_experts=3, router_type="switch", expert_capacity_factor=factor)
    torch.manual_seed(1)
    moe = SparseMoeFeedForward(cfg).eval()
    with torch.no_grad():
        moe.router.classifier.weight.mul_(20)  # confident, unbalanced routing: some experts overflow
    x = torch.randn(3, 10, H)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False
    mask[2, 3:] = False
    with torch.no_grad():
        got = moe(x, padding_mask=mask)
        expected = switch_reference(moe, x, mask, factor)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    dropped = (expected.abs().sum(-1) == 0) & mask
    assert dropped.any(), "the test should exercise token dropping"
    assert not got[~mask].any(), "padding is never dispatched"


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("with_mask", [False, True])
def test_load_balancing_loss_matches_mixtral(top_k, with_mask):
    torch.manual_seed(0)
    logits = torch.randn(3 * 5, 4)
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]]) if with_mask else None
    ours = load_balancing_loss(logits, top_k, mask)
    torch.testing.assert_close(ours, mixtral_load_balancing_loss((logits,), 4, top_k, mask))


def test_load_balancing_loss_is_switch_eq_4():
    """alpha N sum_i f_i P_i with f the argmax fractions and P the mean probabilities (Fedus et al. 2021)."""
    torch.manual_seed(0)
    logits = torch.randn(40, 5)
    probs = logits.softmax(-1)
    f = torch.bincount(probs.argmax(-1), minlength=5).float() / 40
    expected = 5 * (f * probs.mean(0)).sum()
    torch.testing.assert_close(load_balancing_loss(logits, 1), expected)
    uniform = torch.zeros(8, 4)  # equal probabilities: P_i = 1/N, and sum_i f_i = 1
    assert load_balancing_loss(uniform, 1).item() == pytest.approx(1.0)


def test_router_z_loss_matches_switch_transformers():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 4) * 3
    torch.testing.assert_close(router_z_loss(logits.reshape(12, 4)), router_z_loss_func(logits))
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4])
    expected = router_z_loss_func(logits[1:, :2]) * 2 / 8 + router_z_loss_func(logits[:1]) * 6 / 8
    torch.testing.assert_close(router_z_loss(logits.reshape(12, 4), mask), expected)


@pytest.mark.parametrize("router_type", ["top_k", "switch"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_aux_loss_is_added_to_the_loss_and_reported(family, router_type):
    overrides = {
        "num_experts": 3,
        "num_experts_per_tok": 2 if router_type == "top_k" else 1,
        "router_type": router_type,
        "num_hidden_layers": 4,
        "moe_layer_interval": 2,
        "router_aux_loss_coef": 0.5,
        "router_z_loss_coef": 0.25,
    }
    model = build_model(family, overrides)
    batch = make_batch(family)
    with torch.no_grad():
        plain = run(model, batch, labels=batch.labels)
        out = run(model, batch, labels=batch.labels, output_router_logits=True)
    assert getattr(plain, "router_logits", None) is None and getattr(plain, "encoder_router_logits", None) is None
    torch.testing.assert_close(plain.loss, out.loss)
    cfg = model.config
    if family == "encoder-decoder":
        stacks = [(out.encoder_router_logits, batch.attention_mask), (out.decoder_router_logits, None)]
    else:
        stacks = [(out.router_logits, batch.attention_mask)]
    expected_aux = 0.0
    for router_logits, mask in stacks:
        assert len(router_logits) == 2  # layers 1 and 3 of 4
        balance = torch.stack([load_balancing_loss(x, cfg.num_experts_per_tok, mask) for x in router_logits]).mean()
        z = torch.stack([router_z_loss(x, mask) for x in router_logits]).mean()
        expected_aux = expected_aux + 0.5 * balance + 0.25 * z
    torch.testing.assert_close(out.aux_loss, expected_aux)
    if family == "encoder-decoder":
        aux, balance, z = router_aux_losses(out.decoder_router_logits, cfg)
        torch.testing.assert_close(out.decoder_aux_loss, balance)
        torch.testing.assert_close(out.decoder_z_loss, z)
    model_without_aux = build_model(family, {**overrides, "router_aux_loss_coef": 0.0, "router_z_loss_coef": 0.0})
    with torch.no_grad():
        base = run(model_without_aux, batch, labels=batch.labels)
    torch.testing.assert_close(out.loss, base.loss + out.aux_loss)


HEADS = [
    pytest.param(config_class, model_class, id=model_class.__name__)
    for config_class, models in AUTO_CLASSES.items()
    for auto_class, model_class in models.items()
    if auto_class is not AutoModel
]


@pytest.mark.parametrize("config_class, model_class", HEADS)
def test_every_head_adds_the_aux_loss(config_class, model_class):
    """Every task head (LM, sequence and token classification, spans) of every family adds the routers' losses."""
    family = {HfzooDecoderConfig: "decoder", HfzooEncoderDecoderConfig: "encoder-decoder"}.get(config_class, "encoder")
    moe = {"num_experts": 3, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.5, "router_z_loss_coef": 0.25}
    batch = make_batch(family)
    lengths = batch.attention_mask.sum(-1)
    batch.input_ids[torch.arange(len(lengths)), lengths - 1] = TINY["eos_token_id"]  # encoder-decoder pooling
    name, kwargs = model_class.__name__, {}
    if name.endswith("SequenceClassification"):
        kwargs["labels"] = torch.tensor([2, 0])
    elif name.endswith("TokenClassification"):
        kwargs["labels"] = (batch.attention_mask + 1).masked_fill(batch.attention_mask == 0, -100)
    elif name.endswith("QuestionAnswering"):
        kwargs.update(start_positions=torch.tensor([1, 0]), end_positions=torch.tensor([2, 1]))
    else:  # the family's language-model head
        kwargs["labels"] = batch.labels
        if family == "encoder-decoder":
            kwargs["decoder_input_ids"] = batch.decoder_input_ids
    outs = {}
    for coef in (0.0, 1.0):
        torch.manual_seed(0)
        cfg = config_class(
            **{**TINY, **moe, "router_aux_loss_coef": 0.5 * coef, "router_z_loss_coef": 0.25 * coef, "num_labels": 3}
        )
        model = model_class(cfg).eval()
        with torch.no_grad():
            outs[coef] = model(
                batch.input_ids, attention_mask=batch.attention_mask, output_router_logits=True, **kwargs
            )
    out = outs[1.0]
    if family == "encoder-decoder" and not name.endswith("TokenClassification"):  # that one: the encoder alone
        decoder_mask = batch.attention_mask if name.endswith("SequenceClassification") else None
        stacks = [(out.encoder_router_logits, batch.attention_mask), (out.decoder_router_logits, decoder_mask)]
    else:
        stacks = [(out.router_logits, batch.attention_mask)]
    expected = sum(router_aux_losses(logits, cfg, mask)[0] for logits, mask in stacks)
    assert expected > 0
    torch.testing.assert_close(out.aux_loss, expected)
    torch.testing.assert_close(out.loss, outs[0.0].loss + out.aux_loss)
    assert outs[0.0].aux_loss == 0


def test_aux_loss_trains_the_router_under_gradient_checkpointing():
    grads = []
    for checkpointing in (False, True):
        model = build_model("decoder", {"num_experts": 4, "num_experts_per_tok": 1}).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        batch = make_batch("decoder")
        run(model, batch, labels=batch.labels).loss.backward()
        # top-1 of top_k routing has gate 1: the router learns only from the auxiliary loss
        grads.append(model.model.layers[0].mlp.router.classifier.weight.grad)
    assert grads[0] is not None and grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"hidden_act": "gelu2"}, "hidden_act"),
        ({"norm_type": "batch_norm"}, "norm_type"),
        ({"norm_position": "middle"}, "norm_position"),
        ({"norm_type": "none", "norm_position": "sandwich"}, "norm_position"),
        ({"norm_type": "none", "norm_position": "deepnorm"}, "norm_position"),
        ({"norm_type": "none", "embedding_norm": True}, "embedding_norm"),
        ({"fixup_init": True}, "fixup_init"),
        ({"fixup_init": True, "norm_type": "none", "rezero": True}, "fixup_init"),
        ({"rezero": True, "norm_position": "deepnorm"}, "rezero"),
        ({"num_experts": 1}, "num_experts"),
        ({"num_experts": -2}, "num_experts"),
        ({"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok"),
        ({"num_experts": 4, "router_type": "switch", "num_experts_per_tok": 2}, "num_experts_per_tok"),
        ({"num_experts": 4, "router_type": "hash"}, "router_type"),
        ({"num_experts": 4, "expert_capacity_factor": 0}, "expert_capacity_factor"),
        ({"num_experts": 4, "router_aux_loss_coef": -0.1}, "router_aux_loss_coef"),
        ({"num_experts": 4, "router_z_loss_coef": -1}, "router_z_loss_coef"),
        ({"num_experts": 4, "moe_layer_interval": 0}, "moe_layer_interval"),
        ({"num_experts": 4, "moe_layer_interval": 3}, "moe_layer_interval"),
    ],
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_invalid_combinations_are_refused_naming_the_field(family, bad, field):
    with pytest.raises(StrictDataclassClassValidationError, match=field):
        FAMILIES[family][0](**{**TINY, **bad})


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"gated_mlp": True}, "gated_mlp"),
        ({"rezero": True}, "rezero"),
        ({"norm_type": "none", "fixup_init": True}, "norm_type"),
        ({"num_experts": 2}, "num_experts"),
        ({"norm_position": "sandwich"}, "norm_position"),
    ],
)
def test_gpt2_conversion_refuses_what_gpt2_cannot_express(overrides, field):
    with pytest.raises(ValueError, match=field):
        gpt2_config_from_hfzoo(HfzooDecoderConfig(**{**TINY, **overrides}))
