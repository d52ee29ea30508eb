"""hfzoo on every transformers release it accepts: the cache under both names, the keyword contract, generation
with and without the cache, and gradient checkpointing, for every head.

transformers 5.24 renamed the cache from `past_key_values` to `cache` (the argument `generate` passes, the output
field); these tests run on whichever release is installed (CI runs them on the lowest and the newest).
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from helpers.trainer import HEADS, build, dataset, train
from helpers.variant_checks import check_cached_generation
from peft import TaskType
from transformers import DynamicCache
from transformers.utils.generic import TransformersKwargs

from hfzoo.compat import CACHE_NAME, LEGACY_CACHE_NAME, output_cache, peft_cache_name
from hfzoo.finetuning.adapters import build_peft_config, wrap_with_peft
from hfzoo.modeling_utils import IGNORED_KWARGS, PASSED_DOWN_KWARGS, accepted_keywords

pytestmark = pytest.mark.compat  # also run with the lowest accepted versions (scripts/test_lowest.sh)

GENERATORS = ("decoder-clm", "encoder-decoder-seq2seq")


def batch_of(head: str, size: int = 4) -> dict[str, torch.Tensor]:
    examples = dataset(head)[:size]
    return {key: torch.stack([e[key] for e in examples]) for key in examples[0]}


def main_output(out) -> torch.Tensor:
    """The logits, or a span head's `(batch, seq_len, 2)` start and end logits."""
    if getattr(out, "start_logits", None) is not None:
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits


def recorded_keywords(model) -> list[set[str]]:
    """Record the keyword arguments of every call of `model` (a forward pre-hook)."""
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(set(kwargs)), with_kwargs=True)
    return calls


# The keyword contract -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", list(HEADS))
def test_an_unknown_keyword_is_refused_naming_it(head):
    model = build(head).eval()
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'cahce'"):
        model(**batch_of(head), cahce=DynamicCache())


@pytest.mark.parametrize("head", list(HEADS))
def test_an_ignored_keyword_changes_nothing(head):
    model = build(head).eval()
    batch = batch_of(head)
    assert set(IGNORED_KWARGS) == {"cache_position"}
    with torch.no_grad():
        expected = main_output(model(**batch))
        got = main_output(model(**batch, cache_position=torch.arange(batch["input_ids"].shape[1])))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("head", list(HEADS))
def test_the_keywords_passed_down_are_used(head):
    """`output_hidden_states`, `output_attentions`, `return_dict` and Trainer's `num_items_in_batch` change the result."""
    model = build(head, attn_implementation="eager").eval()
    batch = batch_of(head)
    with torch.no_grad():
        plain = model(**batch)
        more = model(**batch, output_hidden_states=True, output_attentions=True)
        as_tuple = model(**batch, return_dict=False)
        normalised = model(**batch, num_items_in_batch=torch.tensor(1000))
    prefix = "decoder_" if head.startswith("encoder-decoder") and head != "encoder-decoder-tokcls" else ""
    assert getattr(plain, f"{prefix}hidden_states") is None and getattr(more, f"{prefix}hidden_states") is not None
    assert getattr(plain, f"{prefix}attentions") is None and getattr(more, f"{prefix}attentions") is not None
    assert isinstance(as_tuple, tuple)
    assert normalised.loss < plain.loss  # the summed loss over 1000 items instead of this batch's mean


def test_every_keyword_transformers_declares_is_passed_down_or_refused():
    """A keyword transformers adds to `TransformersKwargs` in a new release is a decision, not an accident."""
    refused = {"position_ids", "is_causal", "seq_idx"}  # named where used; bidirectional decoders; Mamba's packing
    assert set(TransformersKwargs.__annotations__) <= PASSED_DOWN_KWARGS.keys() | refused


@pytest.mark.parametrize("head", list(HEADS))
def test_the_cache_is_accepted_under_both_names_and_not_twice(head):
    model = build(head).eval()
    batch = batch_of(head)
    names = set(inspect.signature(model.forward).parameters)
    assert "cache" in accepted_keywords(model) and LEGACY_CACHE_NAME in accepted_keywords(model)
    if "cache" in names:  # PEFT's prefix tuning and `generate` look for the names in the signature
        assert LEGACY_CACHE_NAME in names
    if head.startswith("decoder"):
        with torch.no_grad():
            prompt = model.model(batch["input_ids"][:, :4], use_cache=True)
            rest = {"input_ids": batch["input_ids"][:, 4:], "attention_mask": batch["attention_mask"]}
            new = main_output(model(**rest, cache=output_cache(prompt)))
            prompt = model.model(batch["input_ids"][:, :4], use_cache=True)
            old = main_output(model(**rest, past_key_values=output_cache(prompt)))
        torch.testing.assert_close(new, old, rtol=0, atol=0)
    with pytest.raises(ValueError, match="past_key_values"):
        model(**batch, cache=DynamicCache(), past_key_values=DynamicCache())


@pytest.mark.parametrize("head", GENERATORS)
def test_outputs_carry_the_cache_under_the_installed_name(head):
    model = build(head).eval()
    with torch.no_grad():
        out = model(**batch_of(head), use_cache=True)
    assert CACHE_NAME in out.keys() and out[CACHE_NAME].get_seq_length() > 0


# What transformers and PEFT pass ---------------------------------------------------------------------------------


@pytest.mark.parametrize("head", GENERATORS)
@pytest.mark.parametrize("num_beams", [1, 2])
def test_generate_passes_only_accepted_keywords(head, num_beams):
    model = build(head).eval()
    calls = recorded_keywords(model)
    batch = batch_of(head, 2)
    model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3, num_beams=num_beams)
    assert len(calls) == 3 and CACHE_NAME in calls[1]
    assert set().union(*calls) <= accepted_keywords(model) | IGNORED_KWARGS.keys()


@pytest.mark.parametrize("head", list(HEADS))
def test_trainer_passes_only_accepted_keywords(tmp_path, head):
    model = build(head)
    calls = recorded_keywords(model)
    train(model, tmp_path, dataset(head), max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    counted = "labels" in dataset(head)[0]  # Trainer counts a batch's `labels` only (a span head has positions)
    assert calls and all(("num_items_in_batch" in call) is counted for call in calls)
    assert set().union(*calls) <= accepted_keywords(model)


#: The task heads and their PEFT task types.
PEFT_TASKS = {"seqcls": TaskType.SEQ_CLS, "tokcls": TaskType.TOKEN_CLS, "qa": TaskType.QUESTION_ANS}


@pytest.mark.parametrize("head", [head for head in HEADS if head.rsplit("-", 1)[1] in PEFT_TASKS])
def test_peft_prefix_tuning_passes_its_prefix_as_the_cache(head):
    """PEFT hands its prefix over as the cache (under its name for it); it must reach the layers (the output changes)."""
    base = build(head).eval()
    batch = batch_of(head)
    with torch.no_grad():
        plain = main_output(base(**batch))
    task_type = PEFT_TASKS[head.rsplit("-", 1)[1]]
    model = wrap_with_peft(base, build_peft_config("prefix", base.config, task_type=task_type, num_virtual_tokens=3))
    calls = recorded_keywords(base)
    with torch.no_grad():
        prefixed = main_output(model.eval()(**batch))
    assert calls and peft_cache_name() in calls[0]
    assert not torch.allclose(prefixed, plain)


def test_the_cache_name_of_peft_follows_its_release(monkeypatch):
    """PEFT before 0.22 (no `get_transformers_cache_name`) says `past_key_values`; from 0.22 on, transformers' name."""
    import peft.import_utils

    if hasattr(peft.import_utils, "get_transformers_cache_name"):
        assert peft_cache_name() == CACHE_NAME
        monkeypatch.delattr(peft.import_utils, "get_transformers_cache_name")
    assert peft_cache_name() == LEGACY_CACHE_NAME


# Generation with the cache equals generation without it ----------------------------------------------------------


def padded_prompts(padding_side: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 97, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    pad = slice(0, 3) if padding_side == "left" else slice(4, 7)
    ids[1, pad], mask[1, pad] = 0, 0
    return ids, mask


# A decoder continues from the last position, so its prompts are left-padded (a right-padded row: below).
PROMPTS = [("decoder-clm", "left"), ("encoder-decoder-seq2seq", "left"), ("encoder-decoder-seq2seq", "right")]


@pytest.mark.parametrize(("head", "padding_side"), PROMPTS)
@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_with_the_cache_equals_generation_without(head, padding_side, cache_implementation, num_beams):
    model = build(head, seed=1).eval()
    ids, mask = padded_prompts(padding_side)
    # the same tokens and logits of every step, no token twice
    cache = {"cache_implementation": cache_implementation}
    cached = check_cached_generation(model, ids, mask, max_new_tokens=8, num_beams=num_beams, cache_kwargs=cache)
    assert cached.sequences.shape[1] == (ids.shape[1] if head == "decoder-clm" else 1) + 8


def test_right_padded_decoder_rows_continue_after_their_padding():
    """A right-padded decoder prompt is extended after its padding; the cache must not change that."""
    model = build("decoder-clm", seed=1).eval()
    ids, mask = padded_prompts("right")
    check_cached_generation(model, ids, mask, max_new_tokens=4)  # the same tokens and logits of every step


# Gradient checkpointing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", list(HEADS))
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(head):
    batch = batch_of(head)
    results = []
    for checkpointing in (False, True):
        model = build(head).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad for name, p in model.named_parameters()}))
    (loss, grads), (loss_checkpointed, grads_checkpointed) = results
    torch.testing.assert_close(loss_checkpointed, loss, rtol=0, atol=0)
    for name, grad in grads.items():
        if grad is None:
            assert grads_checkpointed[name] is None, name
        else:
            torch.testing.assert_close(grads_checkpointed[name], grad, rtol=0, atol=1e-6, msg=name)


def test_gradient_checkpointing_refuses_a_prefix_it_would_extend_twice():
    model = build("decoder-clm").train()
    model.activation_checkpointing_enable()
    prefix = DynamicCache()
    prefix.update(torch.zeros(4, 4, 3, 8), torch.zeros(4, 4, 3, 8), 0)
    prefix.update(torch.zeros(4, 4, 3, 8), torch.zeros(4, 4, 3, 8), 1)
    batch = batch_of("decoder-clm")
    batch["attention_mask"] = torch.cat([torch.ones(4, 3, dtype=torch.long), batch["attention_mask"]], 1)
    with pytest.raises(ValueError, match="gradient checkpointing .* cache of 3 positions"):
        model(**batch, cache=prefix)


def test_generate_from_a_model_in_training_mode_keeps_its_cache():
    """No gradients, nothing to replay: generation in training mode with checkpointing on still uses the cache."""
    model = build("decoder-clm", seed=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.activation_checkpointing_enable()
    model.train()
    ids, mask = padded_prompts("left")
    # the tokens and logits of every step of the model in eval mode without the cache, no token twice
    check_cached_generation(model, ids, mask, max_new_tokens=6, reference=copy.deepcopy(model).eval())
