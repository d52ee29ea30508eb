"""`--optim muon`: which parameters Muon updates, and the Muon + AdamW optimizer seen as one."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from helpers.variant_checks import build_model, make_batch, run

from hfzoo.training.optimization import (
    MuonSettings,
    MuonWithAdamW,
    create_optimizer,
    create_scheduler,
    muon_parameters,
    no_weight_decay,
    warmup_outlasts_training,
)

# The hidden layers' linear maps of the tiny models: attention (self and cross) and feed-forward matrices.
HIDDEN_MATRIX = re.compile(
    r"\.layers\.\d+\.(self_attn|cross_attn)\.[qkvo]_proj\.weight$|\.layers\.\d+\.mlp\.\w+_proj\.weight$"
)


def _groups(model, optimizer):
    """Name -> "muon" / "adamw" / "adamw-decay" for every parameter of the optimizer (each once)."""
    names = {id(p): n for n, p in model.named_parameters()}
    seen = {}
    for name, child in optimizer.optimizers.items():
        for group in child.param_groups:
            for p in group["params"]:
                assert names[id(p)] not in seen, f"{names[id(p)]} in two groups"
                seen[names[id(p)]] = name + ("-decay" if name == "adamw" and group["weight_decay"] > 0 else "")
    return seen


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize(
    "family, overrides",
    [
        ("decoder", {}),
        ("encoder", {}),
        ("encoder-decoder", {}),
        # Modules beyond the plain layer: a gated MLP's third matrix, ReZero's scalar gain and Shaw's relative
        # position embeddings inside attention, ALBERT's factorised embedding and shared layers.
        ("decoder", {"gated_mlp": True, "rezero": True, "position_embedding_type": "shaw"}),
        ("encoder", {"embedding_size": 16, "block_sharing": "all"}),
    ],
    ids=["decoder", "encoder", "encoder-decoder", "decoder-gated-rezero-shaw", "encoder-factorised-shared"],
)
def test_muon_takes_exactly_the_hidden_layer_matrices(family, overrides, tied):
    model = build_model(family, {**overrides, "tie_word_embeddings": tied}, attn="eager")
    optimizer = create_optimizer(model, learning_rate=1e-3, weight_decay=0.1, muon=MuonSettings())
    assert isinstance(optimizer, MuonWithAdamW)
    groups = _groups(model, optimizer)
    named = dict(model.named_parameters())  # shared parameters (tied embeddings, shared layers) once
    assert set(groups) == set(named)  # every trainable parameter, in exactly one group
    muon = {n for n, g in groups.items() if g == "muon"}
    assert muon == {n for n in named if HIDDEN_MATRIX.search(n)}
    assert muon and all(named[n].ndim == 2 for n in muon)
    # The embeddings and the vocabulary projection (tied or not) stay with AdamW; so do the heads' own matrices.
    output = model.get_output_embeddings()
    output = getattr(output, "decoder", output)  # the MLM head's projection
    for param in (model.get_input_embeddings().weight, output.weight):
        assert groups[next(n for n, p in named.items() if p is param)] == "adamw-decay"
    assert (output.weight is model.get_input_embeddings().weight) == tied
    # AdamW's weight decay follows `no_weight_decay` (no decay on vectors and norms).
    modules = dict(model.named_modules())
    for name in set(named) - muon:
        module = modules[name.rsplit(".", 1)[0]]
        assert groups[name] == ("adamw" if no_weight_decay(named[name], module) else "adamw-decay"), name
    if overrides.get("rezero"):
        assert any("rezero_alpha" in n for n in named) and all(
            groups[n] == "adamw" for n in named if "rezero_alpha" in n
        )
    if overrides.get("position_embedding_type") == "shaw":  # embeddings inside a layer: AdamW
        assert [n for n in named if "relative_positions" in n and groups[n] == "adamw-decay"]


def test_frozen_parameters_are_left_out_and_a_model_without_hidden_matrices_is_refused():
    model = build_model("decoder", {})
    for name, param in model.named_parameters():
        param.requires_grad_(not name.endswith("q_proj.weight"))
    muon, adamw = muon_parameters(model)
    assert len(muon) == 2 * 5 and all(p.requires_grad for p in muon)  # k, v, o, up, down of 2 layers
    assert all(p.requires_grad for p, _ in adamw)
    with pytest.raises(ValueError, match="--optim muon: Sequential has no trainable hidden-layer matrix"):
        create_optimizer(torch.nn.Sequential(torch.nn.Linear(4, 4)), learning_rate=1e-3, weight_decay=0.0,
                         muon=MuonSettings())  # fmt: skip


def _train(model, optimizer, scheduler, family, steps):
    batch = make_batch(family)
    losses = []
    for _ in range(steps):
        loss = run(model, batch, labels=batch.labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _build(seed=0):
    model = build_model("decoder", {}, seed=seed)  # eval mode: no dropout, so runs are deterministic
    settings = MuonSettings(learning_rate=0.02, weight_decay=0.01)
    optimizer = create_optimizer(model, learning_rate=1e-3, weight_decay=0.01, muon=settings)
    scheduler = create_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=10)
    return model, optimizer, scheduler


def test_schedule_scales_both_learning_rates_and_state_dict_round_trips():
    model, optimizer, scheduler = _build()
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, 0.0, 0.0]  # warmup starts at 0 in every group
    _train(model, optimizer, scheduler, "decoder", 3)
    factor = scheduler.lr_lambdas[0](3)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-3 * factor, 1e-3 * factor, 0.02 * factor])
    assert scheduler.get_last_lr()[0] == optimizer.adamw.param_groups[0]["lr"]  # the logged rate is AdamW's
    # Muon's momentum buffers and AdamW's moments are in the state dict; loading it into a fresh optimizer
    # (after 3 steps) and training on gives the same parameters as the uninterrupted optimizer.
    saved_state = {k: v.clone() for k, v in model.state_dict().items()}
    state = copy.deepcopy(optimizer.state_dict())  # the live tensors otherwise
    assert set(state) == {"adamw", "muon"}
    assert all("momentum_buffer" in s for s in state["muon"]["state"].values()) and state["muon"]["state"]
    sched_state, saved_lrs = scheduler.state_dict(), [g["lr"] for g in optimizer.param_groups]
    _train(model, optimizer, scheduler, "decoder", 3)
    expected = model.state_dict()

    model2, optimizer2, scheduler2 = _build(seed=1)
    model2.load_state_dict(saved_state)
    optimizer2.load_state_dict(state)
    scheduler2.load_state_dict(sched_state)
    assert [g["lr"] for g in optimizer2.param_groups] == saved_lrs
    _train(model2, optimizer2, scheduler2, "decoder", 3)
    for name, value in model2.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="not a Muon \\+ AdamW state"):
        optimizer2.load_state_dict(torch.optim.AdamW(model2.parameters()).state_dict())


def test_each_parameter_steps_as_its_own_optimizer_alone_would():
    """Two steps of the combined optimizer equal, parameter by parameter, `torch.optim.Muon` (the hidden-layer
    matrices) or `torch.optim.AdamW` (the rest, with its weight-decay group) stepped alone on the same gradients."""
    model, optimizer, _ = _build()
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    named = dict(model.named_parameters())
    groups = _groups(model, optimizer)
    copies = {n: p.detach().clone().requires_grad_() for n, p in named.items()}
    alone = {}
    for n, c in copies.items():
        if groups[n] == "muon":
            alone[n] = torch.optim.Muon([c], lr=0.02, weight_decay=0.01)
        else:
            alone[n] = torch.optim.AdamW([c], lr=1e-3, weight_decay=0.01 if groups[n] == "adamw-decay" else 0.0)
    batch = make_batch("decoder")
    for _ in range(2):
        run(model, batch, labels=batch.labels).loss.backward()
        for n, c in copies.items():
            c.grad = named[n].grad.clone()
            alone[n].step()
        optimizer.step()
        optimizer.zero_grad()
    for n, p in named.items():
        torch.testing.assert_close(p.detach(), copies[n].detach(), rtol=0, atol=0, msg=n)
    assert sorted(set(groups.values())) == ["adamw", "adamw-decay", "muon"]


def test_a_warmup_that_outlasts_training_is_reported():
    assert warmup_outlasts_training(0, 10) is None and warmup_outlasts_training(9, 10) is None
    assert warmup_outlasts_training(10, 10).startswith("--num_warmup_steps 10 is not below the run's 10 optimizer")
    assert "(at most 25% of --learning_rate)" in warmup_outlasts_training(40, 10)
