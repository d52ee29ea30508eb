"""Model FLOPs of GLUE finetuning: `count_classification_flops` against torch's FlopCounterMode, and the per-batch
lookup of `SequenceClassificationFlops` on padded batches.

The classifier's FLOPs follow the architecture as pretraining's count does: a Switch Transformer's token passes
one expert, not all of them; a Universal Transformer's block runs once per recurrent step; a product key memory
reads its values by lookup. Counting `6 N` over the parameters instead is off by 0.3x-8.7x on Table 1's rows.
"""

from __future__ import annotations

import pytest
import torch
from helpers.flop_counting import flop_counter, row_config
from transformers import AutoModelForSequenceClassification, BertConfig, T5Config

import hfzoo  # noqa: F401  (registers the Auto classes)
from hfzoo.models.flops import count_classification_flops, count_training_flops
from hfzoo.models.narang import TABLE_1_ROWS
from hfzoo.models.presets import build_config
from hfzoo.training.throughput import SequenceClassificationFlops

SMALL = "hidden_size=16,num_hidden_layers=2,num_attention_heads=2,head_dim=8,intermediate_size=32,vocab_size=64"
T = 12


def classifier(config, num_labels: int = 3):
    """The family's sequence classifier of `config` (eager attention, seeded)."""
    config.num_labels, config.pad_token_id, config.eos_token_id = num_labels, 0, 1
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")


def measured_flops(model, seq_len: int) -> int:
    """Matrix-product FLOPs of one training step (forward + backward) on one unpadded sequence."""
    ids = torch.randint(3, model.config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0))
    ids[0, -1] = model.config.eos_token_id  # an encoder-decoder classifies the state at the last eos
    with flop_counter() as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([1])).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("row", list(TABLE_1_ROWS))
def test_every_table_1_row_matches_flop_counter_mode(row):
    config = row_config(row)
    assert measured_flops(classifier(config), T) == count_classification_flops(config, T).total


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("decoder-tiny", ""),  # `score` on every position
        ("decoder-tiny", ",num_experts=4,num_experts_per_tok=2"),
        ("encoder-tiny", ""),
        ("encoder-tiny", ",gated_mlp=True"),
        ("encoder-decoder-tiny", ",num_decoder_layers=3"),
    ],
)
@pytest.mark.parametrize("seq_len", [1, 7])
def test_each_family_matches_flop_counter_mode(preset, overrides, seq_len):
    config = build_config(preset, SMALL + overrides)
    assert (
        measured_flops(classifier(config, num_labels=5), seq_len) == count_classification_flops(config, seq_len).total
    )


def test_the_classifier_head_replaces_the_lm_head():
    """Same stacks as pretraining's count, the vocabulary projection traded for the classification head."""
    config = build_config("encoder-tiny", SMALL)
    config.num_labels = 2
    lm = count_training_flops(config, T)
    head = 6 * T * (16 * 16 + 16 * 64)  # masked-LM transform + tied output layer, on every token
    assert count_classification_flops(config, T).total == lm.total - head + 6 * (16 * 16 + 16 * 2)
    with pytest.raises(ValueError, match="must be positive"):
        count_classification_flops(config, 0)


@pytest.mark.parametrize("preset", ["decoder-tiny", "encoder-decoder-tiny"])
def test_a_padded_batch_counts_each_row_at_its_real_length(preset):
    config = build_config(preset, SMALL)
    config.num_labels = 2
    flops = SequenceClassificationFlops(config, max_length=8)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])  # right- and left-padded
    total = flops(mask)
    assert total.dtype == torch.float64 and total.dim() == 0
    expected = sum(count_classification_flops(config, n).total for n in (3, 6, 4))
    assert total.item() == expected
    assert flops(torch.zeros(2, 4, dtype=torch.long)).item() == 0.0  # empty rows do nothing
    wide = torch.ones(1, 20, dtype=torch.long)  # wider than the table: it grows, from the shape alone
    assert flops(wide).item() == count_classification_flops(config, 20).total


def test_other_models_count_6n_plus_the_attention_term():
    """A model that is not hfzoo's (a BERT, a T5 from the Hub): 6 N per token + 12 d_attn T^2 per attention layer."""
    bert = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    flops = SequenceClassificationFlops(bert, non_embedding_parameters=1000, max_length=4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert flops(mask).item() == 6 * 1000 * 8 + 12 * 2 * 64 * (3**2 + 5**2)
    t5 = T5Config(d_model=64, d_kv=16, num_heads=4, num_layers=2, num_decoder_layers=3)
    # encoder self-attention (2 layers) + decoder self- and cross-attention (3 layers each)
    assert SequenceClassificationFlops(t5)(mask).item() == 12 * (2 + 2 * 3) * 64 * (9 + 25)
    with pytest.raises(ValueError, match="max_length must be at least 1 token, got 0"):
        SequenceClassificationFlops(bert, max_length=0)
