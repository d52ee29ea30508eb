"""hfzoo models inside transformers' `Trainer`: gradient accumulation, gradient checkpointing, PEFT, best model."""

from __future__ import annotations

import pytest
import torch
from helpers.trainer import HEADS, build, dataset, train
from peft import LoraConfig, PeftModel, get_peft_model

from hfzoo import (
    HfzooDecoderForCausalLM,
)
from hfzoo.finetuning.adapters import default_lora_target_modules

FAMILY_LMS = ("decoder-clm", "encoder-mlm", "encoder-decoder-seq2seq")


def count_layer_runs(model) -> dict[str, int]:
    """Count, per layer the checkpointing flag is set on, the calls of its sub-blocks (in forward passes and in the
    backward pass's recomputation, which calls the layer's `forward` and so its sub-blocks again)."""
    runs = {}
    for name, layer in model.named_modules():
        if name and hasattr(layer, "gradient_checkpointing"):
            runs[name] = 0
            for block in layer.children():
                block.register_forward_pre_hook(lambda block, args, name=name: runs.__setitem__(name, runs[name] + 1))
    assert runs
    return runs


def assert_same_training(run_a, run_b, atol: float) -> None:
    (model_a, losses_a), (model_b, losses_b) = run_a, run_b
    assert len(losses_a) == len(losses_b) == 3
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), rtol=0, atol=atol)
    params_b = dict(model_b.named_parameters())
    for name, param in model_a.named_parameters():
        torch.testing.assert_close(param, params_b[name], rtol=0, atol=atol, msg=name)


@pytest.mark.compat
@pytest.mark.parametrize("head", list(HEADS))
def test_gradient_accumulation_equals_one_big_batch(tmp_path, head):
    examples = dataset(head)
    model = build(head)
    assert model.accepts_loss_kwargs
    # the first step's logged loss is the model's own mean loss over the first 8 examples
    batch = {key: torch.stack([e[key] for e in examples[:8]]) for key in examples[0]}
    with torch.no_grad():
        expected_first = model.train()(**batch).loss.item()
    # A span head's start/end biases (and the final norm's and the key projections' biases) shift every position's
    # logit alike, so their gradients are zero up to rounding, which AdamW would scale up to full steps: plain SGD.
    optimizer = {"optim": "sgd"} if head.endswith("-qa") else {}
    runs = []
    for batch_size, accumulation in ((8, 1), (2, 4)):
        model = build(head)
        _, losses = train(
            model,
            tmp_path / f"bs{batch_size}",
            examples,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            **optimizer,
        )
        runs.append((model, losses))
    assert runs[0][1][0] == pytest.approx(expected_first, abs=1e-5)
    assert_same_training(runs[0], runs[1], atol=1e-5)


@pytest.mark.parametrize("head", FAMILY_LMS)
def test_gradient_checkpointing_changes_nothing(tmp_path, head):
    examples = dataset(head)
    runs, layer_runs = [], []
    for checkpointing in (False, True):
        model = build(head)
        layer_runs.append(count_layer_runs(model))
        trainer, losses = train(
            model,
            tmp_path / str(checkpointing),
            examples,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            activation_checkpointing=checkpointing,
        )
        assert model.is_activation_checkpointing is checkpointing
        runs.append((model, losses))
    assert_same_training(runs[0], runs[1], atol=1e-6)
    # ... and checkpointing did happen: the backward passes ran every layer's sub-blocks again
    assert set(layer_runs[1]) == set(layer_runs[0])
    assert all(layer_runs[1][name] > count > 0 for name, count in layer_runs[0].items()), layer_runs


@pytest.mark.compat
@pytest.mark.parametrize("head", FAMILY_LMS)
def test_gradient_checkpointing_gives_the_same_gradients(head):
    batch = {key: torch.stack([e[key] for e in dataset(head)[:4]]) for key in dataset(head)[0]}
    grads = []
    for checkpointing in (False, True):
        model = build(head).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        runs = count_layer_runs(model)
        loss = model(**batch).loss
        forward_runs = dict(runs)
        assert all(forward_runs.values())
        loss.backward()
        # the backward pass recomputes every layer under checkpointing (and none without)
        assert all((runs[name] > count) is checkpointing for name, count in forward_runs.items()), runs
        grads.append({name: param.grad for name, param in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-6, msg=name)


@pytest.mark.compat
@pytest.mark.parametrize("head", FAMILY_LMS)
def test_lora_trains_in_trainer_and_its_adapter_reloads(tmp_path, head):
    examples = dataset(head)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=default_lora_target_modules(build(head).config))
    model = get_peft_model(build(head), config)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    lora_before = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_B" in name}
    trainer, losses = train(
        model, tmp_path / "run", examples, per_device_train_batch_size=4, gradient_accumulation_steps=2
    )
    assert len(losses) == 3 and all(loss == loss for loss in losses)
    for name, param in model.named_parameters():
        if name in frozen:
            torch.testing.assert_close(param, frozen[name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if n in lora_before)
    trainer.save_model(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    batch = {key: torch.stack([e[key] for e in examples[:4]]) for key in examples[0]}
    model.eval()
    with torch.no_grad():
        expected = model(**batch)
    reloaded = PeftModel.from_pretrained(build(head), tmp_path / "adapter").eval()
    with torch.no_grad():
        got = reloaded(**batch)
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=0)


def test_bf16_and_load_best_model_at_end(tmp_path):
    examples = dataset("decoder-clm")
    model = build("decoder-clm")
    trainer, losses = train(
        model,
        tmp_path,
        examples[:16],
        eval_examples=examples[16:],
        max_steps=4,
        per_device_train_batch_size=4,
        bf16=True,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    assert all(loss == loss for loss in losses)
    evals = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    best_step = min(evals, key=evals.get)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied after reloading the best
    best = HfzooDecoderForCausalLM.from_pretrained(trainer.state.best_model_checkpoint)
    for name, param in best.named_parameters():
        torch.testing.assert_close(param, dict(model.named_parameters())[name], rtol=0, atol=0, msg=name)
