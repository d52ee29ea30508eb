"""The Universal Transformer layer stack (`hfzoo.modules.universal`, `layer_stack="universal"`) and the GRU residual gate."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import HfzooDecoderConfig
from hfzoo.modules.universal import AdaptiveComputationTime, GRUResidualGate

UNIVERSAL = {"layer_stack": "universal", "num_recurrent_steps": 3}


def graves_act(probabilities: list[float], threshold: float) -> tuple[list[float], float]:
    """One position's ACT weights per step and ponder cost N + R, written out (Graves 2016, eq. 5-8)."""
    accumulated, weights = 0.0, []
    for step, p in enumerate(probabilities, start=1):
        if step == len(probabilities) or accumulated + p > threshold:
            remainder = 1.0 - accumulated
            return weights + [remainder] + [0.0] * (len(probabilities) - step), step + remainder
        accumulated += p
        weights.append(p)
    raise AssertionError("unreachable")


def test_act_weights_and_ponder_cost_follow_graves():
    torch.manual_seed(0)
    steps, threshold = 5, 0.9
    probabilities = torch.rand(3, 4, steps) * 0.6  # (batch, seq_len, steps); some positions reach the last step
    probabilities[0, 0] = torch.tensor([0.95, 0.5, 0.5, 0.5, 0.5])  # halts at once
    valid = torch.ones(3, 4, dtype=torch.bool)
    valid[2, 3] = False  # padding: halted from the start, left out of the ponder cost
    act = AdaptiveComputationTime(torch.zeros(3, 4), valid, threshold)
    weights = torch.stack([act.step(probabilities[..., t], last=t == steps - 1) for t in range(steps)], dim=-1)
    costs = []
    for b in range(3):
        for i in range(4):
            if not valid[b, i]:
                assert weights[b, i].abs().sum() == 0
                continue
            expected, cost = graves_act(probabilities[b, i].tolist(), threshold)
            torch.testing.assert_close(weights[b, i], torch.tensor(expected))
            costs.append(cost)
    assert act.all_halted()
    torch.testing.assert_close(act.ponder_cost(), torch.tensor(sum(costs) / len(costs)))


def test_one_block_serves_every_step():
    """Only the timestep signals grow with the steps; each step's copy is tied to the first and owns its cache."""
    two = build_model("decoder", {**UNIVERSAL, "num_recurrent_steps": 2})
    five = build_model("decoder", {**UNIVERSAL, "num_recurrent_steps": 5})
    assert five.num_parameters() - two.num_parameters() == 3 * TINY["hidden_size"]  # three more step embeddings
    layers = five.model.layers
    assert len(layers) == 5 * TINY["num_hidden_layers"]
    assert layers[7].self_attn.q_proj.weight is layers[1].self_attn.q_proj.weight
    assert [layer.self_attn.layer_idx for layer in layers] == list(range(10))
    assert five.config.get_text_config(decoder=True).num_hidden_layers == 10  # the generation cache's layers
    ed = FAMILIES["encoder-decoder"][0](**{**TINY, **UNIVERSAL, "num_decoder_layers": 1})
    assert ed.get_text_config(decoder=True).num_hidden_layers == 3


def test_without_act_the_block_runs_every_step_with_the_timing_signals():
    """The written-out recurrence: `h = layer(h + P_pos + S_t)` for t = 1..T, then the final norm."""
    model = build_model("encoder", {**UNIVERSAL, "adaptive_computation_time": False, "num_hidden_layers": 1})
    stack = model.model
    ids = make_batch("encoder").input_ids[:1, :6]  # no padding
    embedded = {}
    stack.embed_dropout.register_forward_hook(lambda module, args, output: embedded.setdefault("h", output))
    with torch.no_grad():
        out = stack(ids).last_hidden_state
        h, positions = embedded["h"], stack.embed_positions(torch.arange(6)[None])
        for t in range(3):
            h = stack.layers[t](h + stack.layer_stack.step_embeddings.weight[t] + positions)
        expected = stack.norm(h)
    torch.testing.assert_close(out, expected)
    assert stack.layer_stack.halting is None


def test_act_stops_once_every_position_has_halted_without_a_cache():
    """Halted positions keep their output, so stopping early (no cache) gives what running every step gives."""
    model = build_model("decoder", {**UNIVERSAL, "num_recurrent_steps": 5})
    torch.nn.init.constant_(model.model.layer_stack.halting.bias, 3.0)  # p ~ 0.95: every position halts at step 2
    calls = []
    for layer in model.model.layers:
        layer.register_forward_hook(lambda module, args, output: calls.append(module))
    batch = make_batch("decoder")
    with torch.no_grad():
        early = run(model, batch, use_cache=False).logits
        assert len(calls) == 2 * TINY["num_hidden_layers"]
        calls.clear()
        every = run(model, batch, use_cache=True).logits  # a cache needs every step's keys and values
        assert len(calls) == 5 * TINY["num_hidden_layers"]
    torch.testing.assert_close(early, every)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_ponder_cost_is_added_to_the_loss(family):
    """`loss = task loss + act_loss_coef * ponder cost`, the weighted cost returned as `aux_loss`."""
    model = build_model(family, {**UNIVERSAL, "act_loss_coef": 0.5})
    batch = make_batch(family)
    with torch.no_grad():
        out = run(model, batch, labels=batch.labels)
        plain = run(model, batch)
        base = run(model.model, batch, output_ponder_cost=True)
    costs = [base.get(key) for key in ("ponder_cost", "encoder_ponder_cost", "decoder_ponder_cost")]
    costs = [cost for group in costs if group is not None for cost in group]
    assert len(costs) == (2 if family == "encoder-decoder" else 1)
    assert all(1 < cost <= 3 + 1 for cost in costs)  # N + R: N between 1 and the 3 steps, R in (0, 1]
    torch.testing.assert_close(out.aux_loss, 0.5 * sum(costs))
    task = torch.nn.functional.cross_entropy(
        plain.logits[:, :-1].flatten(0, 1) if family == "decoder" else plain.logits.flatten(0, 1),
        batch.labels[:, 1:].flatten() if family == "decoder" else batch.labels.flatten(),
        ignore_index=-100,
    )
    torch.testing.assert_close(out.loss, task + out.aux_loss)


def test_the_gru_gate_matches_its_formula():
    config = HfzooDecoderConfig(**TINY)
    torch.manual_seed(0)
    gate = GRUResidualGate(config)
    u, y = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    with torch.no_grad():
        z = torch.sigmoid(gate.update_gate(torch.cat([gate.input_norm(u), gate.output_norm(y)], -1)))
        r = torch.sigmoid(gate.reset_gate(torch.cat([gate.input_norm(u), gate.output_norm(y)], -1)))
        c = torch.sigmoid(gate.candidate(torch.cat([gate.reset_norm(r * u), gate.output_norm(y)], -1)))
        torch.testing.assert_close(gate(u, y), (1 - z) * y + z * c)


def test_a_gated_layer_gates_every_sublayer():
    model = build_model("encoder-decoder", {"residual_gating": "gru"})
    layer = model.model.decoder.layers[0]
    gates = [layer.self_attn_residual.gate, layer.cross_attn_residual.gate, layer.mlp_residual.gate]
    assert all(isinstance(gate, GRUResidualGate) for gate in gates)
    assert build_model("decoder", {}).model.layers[0].mlp_residual.gate is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({**UNIVERSAL, "act_threshold": 0}, r"act_threshold=0 must be in \(0, 1\]"),
        ({**UNIVERSAL, "act_threshold": 1.5}, r"act_threshold=1.5 must be in \(0, 1\]"),
        ({**UNIVERSAL, "num_recurrent_steps": 0}, r"num_recurrent_steps must be a positive integer, got 0"),
        ({**UNIVERSAL, "act_loss_coef": -1}, r"act_loss_coef must be >= 0"),
        (
            {**UNIVERSAL, "adaptive_computation_time": False, "act_threshold": 0.5},
            r"act_threshold=0.5 only applies with adaptive_computation_time=True",
        ),
        ({"num_recurrent_steps": 4}, r"num_recurrent_steps=4 only applies to layer_stack='universal'"),
        ({"act_threshold": 0.5}, r"act_threshold=0.5 only applies to layer_stack='universal'"),
        (
            {**UNIVERSAL, "num_experts": 2, "moe_layer_interval": 2},
            r"layer_stack='universal' applies the same layers at every step",
        ),
        ({"layer_stack": "recurrent"}, r"layer_stack='recurrent' is not supported; choose one of \['standard'"),
        ({"residual_gating": "lstm"}, r"residual_gating='lstm' is not supported; choose one of \['none', 'gru'\]"),
    ],
)
def test_bad_universal_transformer_settings_are_refused(overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        HfzooDecoderConfig(**{**TINY, **overrides})
