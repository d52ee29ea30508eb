"""`generate` on PEFT prefix-tuned models: the tokens the prefix-tuned forward pass implies, for each family.

The reference is greedy decoding by hand: one full forward pass of the PEFT model per new token (no cache), the
prefix applied by PEFT's forward as in training. Runs on the newest and the lowest accepted transformers and PEFT.
"""

from __future__ import annotations

import pytest
import torch
from helpers.trainer import build
from peft import TaskType

from hfzoo.finetuning.adapters import build_peft_config, wrap_with_peft

pytestmark = pytest.mark.compat  # also run with the lowest accepted versions (scripts/test_lowest.sh)

NEW_TOKENS, NUM_VIRTUAL_TOKENS = 6, 3


def prefix_tuned(head: str, task_type: str):
    """A tiny model of `head` under a prefix far from zero (so that it changes the tokens), in eval mode."""
    base = build(head, seed=1, initializer_range=0.3).eval()
    model = wrap_with_peft(base, build_peft_config("prefix", base.config, task_type=task_type, num_virtual_tokens=3))
    with torch.no_grad():
        model.prompt_encoder["default"].embedding.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(0))
    return model.eval()


def prompts(left_padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if left_padded:
        ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


def greedy_by_full_forward_passes(model, ids, mask) -> torch.Tensor:
    """Causal LM: each new token is the argmax of a full forward pass over the prompt and the tokens so far.

    Positions follow `generate`'s convention for left padding (each row counts its own tokens from 0); PEFT's
    forward shifts them past the prefix, as it shifts those `generate` passes.
    """
    for _ in range(NEW_TOKENS):
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize("left_padded", [False, True])
def test_causal_lm_generates_what_the_prefix_tuned_forward_pass_implies(left_padded):
    model = prefix_tuned("decoder-clm", TaskType.CAUSAL_LM)
    ids, mask = prompts(left_padded)
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        expected = greedy_by_full_forward_passes(model, ids, mask)
        cached = model.generate(input_ids=ids, use_cache=True, **kwargs)
        without_prefix = model.get_base_model().generate(ids, use_cache=True, **kwargs)
    assert not torch.equal(expected, without_prefix)  # the prefix decides tokens: ignoring it would fail below
    assert torch.equal(cached, expected), (cached, expected)


@pytest.mark.parametrize("left_padded", [False, True])
@pytest.mark.parametrize("num_beams", [1, 2])
def test_seq2seq_generates_what_the_prefix_tuned_forward_pass_implies(left_padded, num_beams):
    """The encoder takes its share of the prefix in `generate` too (it runs before the decoder's first step)."""
    model = prefix_tuned("encoder-decoder-seq2seq", TaskType.SEQ_2_SEQ_LM)
    source, mask = prompts(left_padded)
    start = model.get_base_model().config.decoder_start_token_id
    decoded = torch.full((2, 1), start)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=decoded).logits
            decoded = torch.cat([decoded, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        generated = model.generate(input_ids=source, num_beams=1, **kwargs)
        beams = model.generate(input_ids=source, num_beams=num_beams, num_return_sequences=1, **kwargs)
        without_prefix = model.get_base_model().generate(source, **kwargs)
    assert not torch.equal(decoded, without_prefix)
    assert torch.equal(generated, decoded), (generated, decoded)
    assert beams.shape == decoded.shape  # beam search runs under the prefix too (its tokens may differ)


def test_the_encoder_prefix_reaches_generation():
    """Generated tokens depend on the encoder's share of the prefix (the first `num_hidden_layers` layers)."""
    model = prefix_tuned("encoder-decoder-seq2seq", TaskType.SEQ_2_SEQ_LM)
    source, mask = prompts(False)
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.no_grad():
        before = model(input_ids=source, attention_mask=mask, decoder_input_ids=torch.zeros(2, 1, dtype=torch.long))
        generated = model.generate(input_ids=source, **kwargs)
        weight = model.prompt_encoder["default"].embedding.weight  # (num_virtual_tokens, 2 * num_layers * width)
        width = weight.shape[1] // (2 * 4)  # 2 encoder + 2 decoder layers, keys and values
        weight[:, : 2 * 2 * width] *= 3  # the encoder's layers only
        after = model(input_ids=source, attention_mask=mask, decoder_input_ids=torch.zeros(2, 1, dtype=torch.long))
        changed = model.generate(input_ids=source, **kwargs)
    assert (before.encoder_last_hidden_state - after.encoder_last_hidden_state).abs().max() > 1e-2
    assert not torch.equal(generated, changed)


@pytest.mark.parametrize(
    ("head", "task_type"), [("decoder-clm", TaskType.CAUSAL_LM), ("encoder-decoder-seq2seq", TaskType.SEQ_2_SEQ_LM)]
)
def test_a_static_cache_under_prefix_tuning_is_refused(head, task_type):
    model = prefix_tuned(head, task_type)
    ids, mask = prompts(False)
    with pytest.raises(ValueError, match=r"prefix tuning needs a dynamic cache \(PEFT puts its prefix into one\), got"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, cache_implementation="static")


def test_generation_without_the_cache_under_prefix_tuning_is_refused():
    model = prefix_tuned("decoder-clm", TaskType.CAUSAL_LM)
    ids, mask = prompts(False)
    with pytest.raises(ValueError, match="prefix tuning needs use_cache=True"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, use_cache=False)


@pytest.mark.parametrize("task_type", [TaskType.CAUSAL_LM, TaskType.SEQ_2_SEQ_LM])
def test_an_encoder_is_refused_for_a_generation_task(task_type):
    base = build("encoder-mlm")
    with pytest.raises(ValueError, match=f"task_type {task_type} needs a model that generates, but HfzooEncoderFor"):
        wrap_with_peft(base, build_peft_config("prefix", base.config, task_type=task_type))
