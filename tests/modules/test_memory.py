"""Product key memory (`hfzoo.modules.memory`, Lample et al. 2019) in place of chosen feed-forward sublayers."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import HfzooDecoderConfig
from hfzoo.modules.feed_forward import FeedForward
from hfzoo.modules.memory import ProductKeyMemory

MEMORY = {"memory_num_keys": 6, "memory_heads": 2, "memory_top_k": 3, "memory_key_dim": 8}


def memory_module(**overrides) -> ProductKeyMemory:
    config = HfzooDecoderConfig(**{**TINY, **MEMORY, "memory_layers": [0], **overrides})
    torch.manual_seed(0)
    module = ProductKeyMemory(config)
    torch.nn.init.uniform_(module.keys, -1, 1)
    torch.nn.init.normal_(module.values.weight)
    return module


def test_the_product_key_search_finds_the_exact_top_k():
    """§3.2: the top k of the k^2 candidates are the top k of all |K|^2 product keys `(s1_i + s2_j)`."""
    module = memory_module().eval()
    x = torch.randn(7, TINY["hidden_size"])
    with torch.no_grad():
        scores, indices = module.lookup(x)
        query = module.query_norm(module.query_proj(x)).view(7, 2, 2, 4)  # (tokens, heads, half, d_q / 2)
        for head in range(2):
            sub1 = query[:, head, 0] @ module.keys[head, 0].T  # (tokens, |K|)
            sub2 = query[:, head, 1] @ module.keys[head, 1].T
            every = (sub1[:, :, None] + sub2[:, None, :]).flatten(1)  # value i * |K| + j
            best, where = every.topk(3, dim=-1)
            torch.testing.assert_close(scores[:, head], best)
            assert torch.equal(indices[:, head], where)


def test_the_memory_reads_the_softmax_weighted_values_summed_over_heads():
    module = memory_module().eval()
    x = torch.randn(2, 5, TINY["hidden_size"])
    with torch.no_grad():
        out = module(x)
        scores, indices = module.lookup(x.reshape(-1, x.shape[-1]))
        weights = torch.softmax(scores, dim=-1)  # (tokens, heads, k)
        expected = (weights[..., None] * module.values.weight[indices]).sum(dim=(1, 2)).view_as(x)
    torch.testing.assert_close(out, expected)


def test_query_batch_norm_statistics_leave_padding_out():
    """In training, a real token's output does not depend on the padding beside it."""
    module = memory_module().train()
    x = torch.randn(2, 6, TINY["hidden_size"])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    padded = module(x, padding_mask=mask)
    changed = x.clone()
    changed[1, 3:] = 100.0  # different padding
    torch.testing.assert_close(module(changed, padding_mask=mask)[mask], padded[mask])
    assert not torch.allclose(module(changed)[mask], padded[mask])  # without the mask the padding would count


def test_the_layer_norm_query_normalises_each_sub_key():
    module = memory_module(memory_query_norm="layer_norm")
    query = module.query_norm(torch.randn(3, 16) * 5 + 2).view(3, 2, 2, 4)
    torch.testing.assert_close(query.mean(-1), torch.zeros(3, 2, 2), atol=1e-5, rtol=0)


def test_memories_replace_the_chosen_feed_forwards():
    model = build_model("decoder", {**MEMORY, "num_hidden_layers": 3, "memory_layers": [0, -1]})
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [ProductKeyMemory, FeedForward, ProductKeyMemory]
    model = build_model("encoder-decoder", {**MEMORY, "decoder_memory_layers": [-2]})
    assert [type(layer.mlp) for layer in model.model.encoder.layers] == [FeedForward, FeedForward]
    assert [type(layer.mlp) for layer in model.model.decoder.layers] == [ProductKeyMemory, FeedForward]
    batch = make_batch("encoder-decoder")
    assert torch.isfinite(run(model, batch, labels=batch.labels).loss)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"memory_layers": [2]}, r"memory_layers=\[2\]: 2 is not the index of one of the 2 feed-forward sublayers"),
        ({"memory_layers": [1, -1]}, r"memory_layers=\[1, -1\] names a layer twice"),
        ({"memory_layers": [0], "memory_top_k": 7}, r"memory_top_k=7 exceeds memory_num_keys=6"),
        ({"memory_layers": [0], "memory_key_dim": 7}, r"memory_key_dim=7 must be even"),
        ({"memory_layers": [0], "memory_heads": 0}, r"memory_heads must be a positive integer"),
        ({"memory_layers": [0], "memory_query_norm": "rms"}, r"memory_query_norm='rms' is not supported"),
        ({"memory_layers": None}, r"memory_num_keys=6 only applies to a product key memory"),
    ],
)
def test_bad_memory_settings_are_refused(overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        HfzooDecoderConfig(**{**TINY, **MEMORY, **overrides})


def test_the_decoder_memory_field_is_checked_against_the_decoder():
    with pytest.raises(StrictDataclassClassValidationError, match=r"decoder_memory_layers=\[5\]: 5 is not the index"):
        FAMILIES["encoder-decoder"][0](**{**TINY, **MEMORY, "decoder_memory_layers": [5]})
