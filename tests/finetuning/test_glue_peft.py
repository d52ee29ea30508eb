"""PEFT for the three families: prefix tuning reaches both encoder-decoder stacks and trains; LoRA save/reload/merge."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForSequenceClassification, DynamicCache

import hfzoo  # noqa: F401  (registers the hfzoo models with the Auto classes)
from hfzoo.finetuning.adapters import (
    build_peft_config,
    check_prefix_fits,
    count_parameters,
    load_peft_model,
    prefix_num_layers,
    wrap_with_peft,
)
from hfzoo.models.presets import build_config

FAMILIES = ["encoder-tiny", "decoder-tiny", "encoder-decoder-tiny"]
VOCAB, PAD, EOS = 40, 0, 1


def tiny_classifier(preset: str, seed: int = 0, num_labels: int = 2):
    torch.manual_seed(seed)
    config = build_config(
        preset,
        "hidden_size=32,intermediate_size=64,num_attention_heads=4,max_position_embeddings=64",
        vocab_size=VOCAB,
        num_labels=num_labels,
        pad_token_id=PAD,
        eos_token_id=EOS,
        **({"decoder_start_token_id": PAD} if preset.startswith("encoder-decoder") else {}),
    )
    return AutoModelForSequenceClassification.from_config(config).eval()


def toy_batch(n: int = 16, seq_len: int = 10, seed: int = 0):
    """Right-padded rows ending with EOS; label 1 iff token 7 occurs (a task attention must solve)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, VOCAB, (n, seq_len), generator=g)
    labels = torch.arange(n) % 2
    lengths = torch.randint(4, seq_len + 1, (n,), generator=g)
    mask = torch.zeros_like(ids)
    for row in range(n):
        length = int(lengths[row])
        if labels[row]:
            ids[row, int(torch.randint(0, length - 1, (1,), generator=g))] = 7
        ids[row, length - 1] = EOS
        mask[row, :length] = 1
    return {"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask, "labels": labels}


@pytest.mark.compat
def test_prefix_reaches_both_stacks_of_the_encoder_decoder():
    model = tiny_classifier("encoder-decoder-tiny")
    config = model.config
    peft_config = build_peft_config("prefix", config, num_virtual_tokens=3)
    assert peft_config.num_layers == config.num_hidden_layers + config.num_decoder_layers == prefix_num_layers(config)
    # its token classifier is the encoder alone: a prefix for the encoder's layers only, none left untrained
    tagger_config = build_peft_config("prefix", config, task_type="TOKEN_CLS", num_virtual_tokens=3)
    assert tagger_config.num_layers == config.num_hidden_layers != peft_config.num_layers
    peft_model = wrap_with_peft(model, peft_config).eval()
    with torch.no_grad():  # a prefix far from zero, so that it matters
        peft_model.prompt_encoder["default"].embedding.weight.normal_(0, 1.0)
    batch = toy_batch(4)
    batch.pop("labels")
    with torch.no_grad():
        with_prefix = peft_model(**batch)
        base = peft_model.get_base_model()
        without = base(**batch)
        # The encoder's states under the prefix equal the encoder run by hand with the first
        # num_hidden_layers prefix layers as its cache: the split routes the right layers.
        cache = peft_model.get_prompt(batch_size=4)
        encoder_cache = DynamicCache()
        for i in range(config.num_hidden_layers):
            encoder_cache.update(cache.layers[i].keys, cache.layers[i].values, i)
        prefix_mask = torch.cat([torch.ones(4, 3, dtype=torch.long), batch["attention_mask"]], dim=1)
        by_hand = base.model.encoder(batch["input_ids"], attention_mask=prefix_mask, cache=encoder_cache)
    real = batch["attention_mask"].bool()
    encoder_change = (with_prefix.encoder_last_hidden_state - without.encoder_last_hidden_state)[real].abs().max()
    assert encoder_change > 1e-2
    assert torch.allclose(with_prefix.encoder_last_hidden_state, by_hand.last_hidden_state, atol=1e-6)
    assert (with_prefix.logits - without.logits).abs().max() > 1e-3


@pytest.mark.compat
@pytest.mark.parametrize("preset", FAMILIES)
def test_prefix_changes_the_outputs_of_every_family(preset):
    model = tiny_classifier(preset)
    peft_model = wrap_with_peft(model, build_peft_config("prefix", model.config, num_virtual_tokens=4)).eval()
    trainable = {n.split(".")[0] for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable == {"base_model", "prompt_encoder"}  # the prefix and the classification head only
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.normal_(0, 1.0)
        batch = toy_batch(4)
        batch.pop("labels")
        with_prefix = peft_model(**batch).logits
        without = peft_model.get_base_model()(**batch).logits
    assert (with_prefix - without).abs().max() > 1e-3


@pytest.mark.compat
@pytest.mark.parametrize("preset", FAMILIES)
def test_prefix_tuning_drives_the_training_loss_down(preset):
    peft_model = wrap_with_peft(tiny_classifier(preset), build_peft_config("prefix", tiny_classifier(preset).config))
    prefix = peft_model.prompt_encoder["default"].embedding.weight
    start = prefix.detach().clone()
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=3e-2)
    batch = toy_batch(16)
    peft_model.train()
    losses = []
    for _ in range(60):
        loss = peft_model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    print(f"\n{preset}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert sum(losses[-5:]) / 5 < 0.85 * losses[0]
    assert (prefix - start).abs().max() > 1e-2  # the prefix itself was trained


@pytest.mark.compat
@pytest.mark.parametrize("preset", FAMILIES)
def test_lora_adapter_saved_reloaded_and_merged_gives_the_same_predictions(preset, tmp_path):
    base = tiny_classifier(preset)
    base.save_pretrained(tmp_path / "base")
    peft_model = wrap_with_peft(base, build_peft_config("lora", base.config, lora_r=4, lora_alpha=8))
    trainable, total = count_parameters(peft_model)
    assert 0 < trainable < total
    with torch.no_grad():  # trained-looking adapter and head: LoRA B starts at zero
        for param in peft_model.parameters():
            if param.requires_grad:
                param.add_(0.2 * torch.randn_like(param))
    peft_model.eval()
    batch = toy_batch(8)
    batch.pop("labels")
    with torch.no_grad():
        trained = peft_model(**batch).logits
        base_only = peft_model.get_base_model()
    peft_model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = load_peft_model(tmp_path / "adapter", tmp_path / "base")
    merged = load_peft_model(tmp_path / "adapter", tmp_path / "base", merge=True)
    assert isinstance(reloaded, PeftModel) and not isinstance(merged, PeftModel)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    with torch.no_grad():
        reloaded_logits = reloaded(**batch).logits
        merged_logits = merged(**batch).logits
        plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base").eval()(**batch).logits
    assert (reloaded_logits - trained).abs().max() < 1e-5
    assert (merged_logits - trained).abs().max() < 1e-5
    assert (plain - trained).abs().max() > 1e-3  # the adapter matters
    del base_only


def test_lora_default_targets_cover_every_block_projection_of_each_family():
    """Default LoRA: the 4 projections of every attention and the 2 of every (dense) feed-forward; never the head."""
    for preset in FAMILIES:
        model = tiny_classifier(preset)
        peft_model = wrap_with_peft(model, build_peft_config("lora", model.config))
        targeted = {n.split(".lora_A", 1)[0].removeprefix("base_model.model.")
                    for n, _ in peft_model.named_parameters() if ".lora_A." in n}  # fmt: skip
        attention = [n for n, _ in model.named_modules() if n.endswith(("self_attn", "cross_attn"))]
        feed_forward = {n: m for n, m in model.named_modules() if type(m).__name__ == "FeedForward"}
        assert attention and feed_forward
        expected = {f"{a}.{p}" for a in attention for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        for name, module in feed_forward.items():
            gated = ("gate_proj",) if module.gate_proj is not None else ()
            expected |= {f"{name}.{p}" for p in ("up_proj", "down_proj", *gated)}
        assert targeted == expected, preset
        assert not any("classifier" in n or "score" in n for n in targeted)


def test_prefix_longer_than_the_position_table_is_refused():
    config = tiny_classifier("encoder-tiny").config
    check_prefix_fits(config, 14, 50)
    with pytest.raises(ValueError, match=r"--num_virtual_tokens 20 \+ --max_length 50 = 70 positions exceeds"):
        check_prefix_fits(config, 20, 50)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="--peft 'adalora' is not supported"):
        build_peft_config("adalora", tiny_classifier("encoder-tiny").config)


def test_a_lora_target_that_names_no_module_is_refused():
    """PEFT adapts the entries that match and ignores the rest: a misspelt one would leave its layers unadapted."""
    model = tiny_classifier("decoder-tiny")
    with pytest.raises(ValueError) as excinfo:
        wrap_with_peft(model, build_peft_config("lora", model.config, target_modules=["q_proj", "v_prj", "ffn"]))
    assert str(excinfo.value) == (
        "target_modules ['ffn', 'v_prj']: no module of HfzooDecoderForSequenceClassification has that name (PEFT "
        "would adapt the other entries and ignore these); its linear layers are named ['down_proj', 'k_proj', "
        "'o_proj', 'q_proj', 'score', 'up_proj', 'v_proj']"
    )
    # A full module name and a dotted suffix match as in PEFT; a regular expression (a string) is PEFT's to check.
    targets = ["model.layers.0.self_attn.q_proj", "mlp.up_proj"]
    peft_model = wrap_with_peft(model, build_peft_config("lora", model.config, target_modules=targets))
    adapted = [n for n, _ in peft_model.named_modules() if n.endswith(".lora_A")]
    assert len(adapted) == 1 + model.config.num_hidden_layers, adapted
    model = tiny_classifier("decoder-tiny")
    assert wrap_with_peft(model, build_peft_config("lora", model.config, target_modules=r".*\.v_proj"))
    # hfzoo's projection names stand for every variant: this one's feed-forward has no gate.
    model = tiny_classifier("decoder-tiny")
    assert not any(n.endswith("gate_proj") for n, _ in model.named_modules())
    assert wrap_with_peft(model, build_peft_config("lora", model.config, target_modules=["q_proj", "gate_proj"]))
