"""Adaptive input embeddings and the adaptive softmax (`hfzoo/modules/embeddings.py`).

Numerics against written-out formulas (Baevski & Auli 2019's cluster lookup + projection, the tied
one-softmax output through the same factors) and against torch's `nn.AdaptiveLogSoftmaxWithLoss.log_prob`
(Grave et al. 2017), the loss as the negative log-likelihood of the returned log-probabilities in every
family, the ties, the refused configurations and the refused vocabulary resize. The generic checks (fp32/bf16,
round trip, padding, causality, generation with and without the cache, backends, remote code) are rows of
`tests/models/test_variants.py`.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import TINY
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForSequenceClassification,
)
from hfzoo.models.narang import ClusterCutoffs
from hfzoo.models.presets import build_config
from hfzoo.modules.embeddings import (
    AdaptiveEmbedding,
    AdaptiveLogSoftmax,
    AdaptiveVocabProjection,
    VocabProjection,
    vocab_clusters,
)

CUTOFFS = [20, 50, 90]  # clusters of 20 / 30 / 40 / 7 ids; widths 32 / 8 / 2 / 1 with factor 4
TIED_SOFTMAX = {"adaptive_input_cutoffs": CUTOFFS, "adaptive_softmax_cutoffs": CUTOFFS}
FAMILIES = {
    "decoder": (HfzooDecoderConfig, HfzooDecoderForCausalLM),
    "encoder": (HfzooEncoderConfig, HfzooEncoderForMaskedLM),
    "encoder-decoder": (HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration),
}


def build(family: str, seed: int = 0, **overrides):
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    return model_class(config_class(**{**TINY, **overrides})).eval()


def head_of(model):
    return model.lm_head.decoder if isinstance(model, HfzooEncoderForMaskedLM) else model.lm_head


def randomize(module: torch.nn.Module) -> None:
    """Weights far from the small initialisation, so that every term of a formula matters."""
    torch.manual_seed(1)
    for param in module.parameters():
        torch.nn.init.normal_(param)


# ---- clusters


def test_clusters_shrink_by_the_factor_and_keep_a_width_of_at_least_one():
    config = HfzooDecoderConfig(**TINY, adaptive_input_cutoffs=CUTOFFS)
    clusters = vocab_clusters(config, CUTOFFS, 4)
    assert [(c.start, c.end, c.embedding_size) for c in clusters] == [
        (0, 20, 32),
        (20, 50, 8),
        (50, 90, 2),
        (90, 97, 1),
    ]
    assert [c.embedding_size for c in vocab_clusters(config, CUTOFFS, 1)] == [32] * 4
    assert [c.embedding_size for c in vocab_clusters(config, CUTOFFS, 2.5)] == [32, 12, 5, 2]  # 32 // 2.5 ** i


def test_narang_cluster_cutoffs_keep_their_fraction_of_any_vocabulary():
    softmax = ClusterCutoffs((2500, 6000, 23500, 128))
    assert softmax.resolve({"vocab_size": 32128}) == [2500, 8500, 32000]  # the paper's clusters on T5's vocabulary
    assert ClusterCutoffs((2500, 6000, 23628)).resolve({"vocab_size": 32128}) == [2500, 8500]
    assert softmax.resolve({"vocab_size": 8192}) == [637, 2167, 8159]
    assert softmax.resolve({"vocab_size": 64}) == [5, 17, 63]  # 63.7 rounds to 64: the last cluster keeps 1 id
    with pytest.raises(ValueError, match="vocab_size=3 cannot hold 4 clusters"):
        softmax.resolve({"vocab_size": 3})


# ---- adaptive input embeddings (Baevski & Auli 2019)


def test_adaptive_embedding_is_each_clusters_row_projected_and_scaled():
    config = HfzooDecoderConfig(**TINY, adaptive_input_cutoffs=[20, 50], scale_embeddings=True)
    embedding = AdaptiveEmbedding(config)
    randomize(embedding)
    ids = torch.tensor([[0, 19, 20, 49], [50, 96, 33, 7]])
    expected = torch.empty(2, 4, 32)
    for (b, t), token in zip(torch.cartesian_prod(torch.arange(2), torch.arange(4)).tolist(), ids.flatten().tolist()):
        if token < 20:  # full width: no projection
            vector = embedding.clusters[0].weight[token]
        elif token < 50:
            vector = embedding.projections[1].weight @ embedding.clusters[1].weight[token - 20]  # (32, 8) @ (8,)
        else:
            vector = embedding.projections[2].weight @ embedding.clusters[2].weight[token - 50]  # (32, 2) @ (2,)
        expected[b, t] = vector * math.sqrt(32)
    assert isinstance(embedding.projections[0], torch.nn.Identity)
    assert [tuple(c.weight.shape) for c in embedding.clusters] == [(20, 32), (30, 8), (47, 2)]
    torch.testing.assert_close(embedding(ids), expected)


def test_adaptive_embedding_refuses_ids_outside_the_vocabulary():
    embedding = AdaptiveEmbedding(HfzooDecoderConfig(**TINY, adaptive_input_cutoffs=[20, 50]))
    with pytest.raises(
        ValueError, match=r"token id 97 is outside the vocabulary: input ids must be in \[0, vocab_size=97\)"
    ):
        embedding(torch.tensor([[3, 97]]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tied_adaptive_head_scores_each_cluster_through_the_input_factors(family):
    """Mesh TensorFlow's `AdaptiveVocabEmbedding.hidden_to_logits`: concat_i (h P_i) E_i^T, one softmax."""
    model = build(family, adaptive_input_cutoffs=[20, 50])
    embed, head = model.get_input_embeddings(), head_of(model)
    assert isinstance(head, AdaptiveVocabProjection)
    for i in range(3):
        assert head.clusters[i].weight is embed.clusters[i].weight
    for i in (1, 2):
        assert head.projections[i].weight is embed.projections[i].weight
    randomize(model)
    hidden = torch.randn(2, 5, 32)
    expected = torch.cat(
        [
            hidden @ embed.clusters[0].weight.T,
            hidden @ embed.projections[1].weight @ embed.clusters[1].weight.T,  # (.., 32) @ (32, 8) @ (8, 30)
            hidden @ embed.projections[2].weight @ embed.clusters[2].weight.T,
        ],
        dim=-1,
    )
    if head.clusters[0].bias is not None:  # the masked-LM head's per-token bias
        expected = expected + torch.cat([c.bias for c in head.clusters])
    torch.testing.assert_close(head(hidden), expected)


def test_untied_head_of_adaptive_input_model_is_a_full_matrix():
    model = build("decoder", adaptive_input_cutoffs=[20, 50], tie_word_embeddings=False)
    assert type(model.lm_head) is VocabProjection and model.lm_head.weight.shape == (97, 32)


# ---- the adaptive softmax (Grave et al. 2017)


@pytest.mark.parametrize("factor", [4, 2])
def test_adaptive_log_softmax_matches_torch_adaptive_log_softmax_with_loss(factor):
    """The same computation as torch's `AdaptiveLogSoftmaxWithLoss.log_prob`, weights copied over."""
    fields = {**TINY, "hidden_size": 64}  # torch gives the last tail 64 // 4 ** 3 = 1 unit (32 would give it 0)
    config = HfzooDecoderConfig(
        **fields, adaptive_softmax_cutoffs=CUTOFFS, adaptive_softmax_factor=factor, tie_word_embeddings=False
    )
    ours = AdaptiveLogSoftmax(config, bias=False)
    randomize(ours)
    reference = torch.nn.AdaptiveLogSoftmaxWithLoss(64, 97, CUTOFFS, div_value=float(factor), head_bias=False)
    with torch.no_grad():
        reference.head.weight.copy_(ours.clusters[0].weight)
        for i, (down, out) in enumerate(reference.tail, start=1):
            down.weight.copy_(ours.projections[i].weight.T)  # torch stores h -> E_i as (E_i, h); hfzoo as (h, E_i)
            out.weight.copy_(ours.clusters[i].weight)
    hidden = torch.randn(6, 64)
    log_probs = ours(hidden)
    torch.testing.assert_close(log_probs, reference.log_prob(hidden))
    targets = torch.tensor([0, 19, 20, 55, 90, 96])  # one target in every cluster
    output, loss = reference(hidden, targets)
    torch.testing.assert_close(log_probs.gather(1, targets[:, None])[:, 0], output)
    torch.testing.assert_close(torch.nn.functional.cross_entropy(log_probs, targets), loss)


def test_adaptive_softmax_without_projection_is_a_two_level_softmax_of_full_width_clusters():
    """Factor 1 ("Adaptive softmax without projection"): no projections; p(t) = p(cluster | h) p(t | cluster, h)."""
    config = HfzooDecoderConfig(
        **TINY, adaptive_softmax_cutoffs=CUTOFFS, adaptive_softmax_factor=1, tie_word_embeddings=False
    )
    head = AdaptiveLogSoftmax(config, bias=False)
    randomize(head)
    assert all(isinstance(p, torch.nn.Identity) for p in head.projections)
    assert sum(p.numel() for p in head.parameters()) == (97 + 3) * 32  # the vocabulary + one row per tail cluster
    hidden = torch.randn(4, 32)
    top = torch.softmax(hidden @ head.clusters[0].weight.T, dim=-1)  # (4, 20 + 3)
    probs = [top[:, :20]] + [
        top[:, 19 + i : 20 + i] * torch.softmax(hidden @ head.clusters[i].weight.T, dim=-1) for i in (1, 2, 3)
    ]
    torch.testing.assert_close(head(hidden).exp(), torch.cat(probs, dim=-1))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_adaptive_softmax_logits_are_log_probabilities_and_the_loss_their_nll(family):
    model = build(family, **TIED_SOFTMAX)
    randomize(model)
    ids = torch.randint(2, 97, (2, 9))
    if family == "encoder-decoder":
        out = model(ids, decoder_input_ids=ids[:, :6], labels=ids[:, 1:7])
        logits, labels = out.logits, ids[:, 1:7]
    elif family == "decoder":
        out = model(ids, labels=ids)
        logits, labels = out.logits[:, :-1], ids[:, 1:]
    else:
        labels = ids.masked_fill(torch.rand(2, 9) < 0.5, -100)
        out = model(ids, labels=labels)
        logits = out.logits
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits.exp().sum(-1), torch.ones(out.logits.shape[:-1]))
    keep = labels != -100
    nll = -logits[keep].gather(-1, labels[keep][:, None]).mean()
    torch.testing.assert_close(out.loss, nll)


@pytest.mark.parametrize("overrides", [{"adaptive_input_cutoffs": [20, 50]}, TIED_SOFTMAX])
def test_adaptive_heads_with_labels_return_the_summed_nll_of_their_scores(overrides):
    model = build("decoder", **overrides)
    randomize(model)
    head = model.lm_head
    hidden = torch.randn(2, 5, TINY["hidden_size"])
    labels = torch.randint(0, 97, (2, 5)).masked_fill(torch.rand(2, 5) < 0.3, -100)
    log_probs = torch.log_softmax(head(hidden).float(), dim=-1)
    keep = labels != -100
    expected = -log_probs[keep].gather(-1, labels[keep][:, None]).sum()
    summed = head(hidden, labels=labels)
    assert summed.dtype == torch.float32 and summed.dim() == 0
    torch.testing.assert_close(summed, expected)


def test_tied_adaptive_softmax_shares_every_cluster_with_the_input_and_saves_it_once(tmp_path):
    model = build("encoder-decoder", **TIED_SOFTMAX)
    shared, head = model.model.shared, model.lm_head
    assert shared.clusters[0].weight.shape == (20 + 3, 32)  # the head's cluster entries, never looked up
    for i in range(4):
        assert (
            head.clusters[i].weight is shared.clusters[i].weight is model.model.decoder.embed_tokens.clusters[i].weight
        )
    model.save_pretrained(tmp_path)
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert not any(key.startswith("lm_head.") and key.endswith("weight") for key in keys), keys
    loaded = HfzooEncoderDecoderForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.clusters[2].weight is loaded.model.shared.clusters[2].weight
    ids = torch.randint(2, 97, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, decoder_input_ids=ids).logits, model(ids, decoder_input_ids=ids).logits)


@pytest.mark.compat
def test_adaptive_softmax_generates_with_beam_search_and_sampling():
    model = build("decoder", **TIED_SOFTMAX)
    prompt = torch.randint(2, 97, (2, 4))
    with torch.no_grad():
        beams = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, num_beams=3, do_sample=False)
        sampled = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=True, top_k=5)
    assert beams.shape == sampled.shape == (2, 7)
    assert ((sampled[:, 4:] >= 0) & (sampled[:, 4:] < 97)).all()


def test_classification_heads_read_adaptive_input_embeddings_and_have_no_vocabulary_output():
    """Adaptive inputs feed every model; the adaptive softmax is an LM-head output, which a classifier lacks."""
    config = HfzooEncoderConfig(**TINY, num_labels=3, **TIED_SOFTMAX)
    model = HfzooEncoderForSequenceClassification(config)
    assert isinstance(model.get_input_embeddings(), AdaptiveEmbedding)
    out = model(torch.randint(2, 97, (2, 5)), labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)


# ---- refusals


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"adaptive_input_cutoffs": [20, 50]}, "adaptive_input_cutoffs"),
        ({"adaptive_softmax_cutoffs": CUTOFFS, "tie_word_embeddings": False}, "adaptive_softmax_cutoffs"),
    ],
)
def test_resizing_an_adaptive_vocabulary_is_refused(family, overrides, field):
    from hfzoo.modules import embeddings

    if not hasattr(embeddings, "check_vocab_resizable"):
        pytest.skip("this checkout's resize_token_embeddings has no refusal hook (vocab_resize_refusal)")
    model = build(family, **overrides)
    with pytest.raises(ValueError, match=f"cannot change its vocabulary size: .*{field}"):
        model.resize_token_embeddings(120)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"adaptive_input_cutoffs": [50, 20]}, r"adaptive_input_cutoffs=\[50, 20\] must be strictly increasing"),
        ({"adaptive_input_cutoffs": [20, 20]}, r"adaptive_input_cutoffs=\[20, 20\] must be strictly increasing"),
        ({"adaptive_input_cutoffs": [20, 97]}, r"each in \[1, vocab_size=97\)"),
        ({"adaptive_input_cutoffs": [0, 20]}, r"adaptive_input_cutoffs=\[0, 20\] must be strictly increasing"),
        ({"adaptive_input_cutoffs": []}, "adaptive_input_cutoffs must be None or a non-empty list of token ids"),
        (
            {"adaptive_softmax_cutoffs": [20, 120], "tie_word_embeddings": False},
            r"adaptive_softmax_cutoffs=\[20, 120\] must be strictly increasing ids inside the vocabulary",
        ),
        ({"adaptive_input_cutoffs": [20], "adaptive_input_factor": 0.5}, "adaptive_input_factor must be a number >= 1"),
        ({"adaptive_softmax_factor": 2}, "adaptive_softmax_factor=2 only applies with adaptive_softmax_cutoffs"),
        (
            {"adaptive_input_cutoffs": [20], "embedding_size": 8},
            "embedding_size=8 and adaptive_input_cutoffs both factorize the vocabulary matrix",
        ),
        (
            {"adaptive_softmax_cutoffs": [20], "tie_word_embeddings": False, "num_softmaxes": 3},
            "num_softmaxes=3 .* adaptive_softmax_cutoffs makes the LM head adaptive",
        ),
        (
            {"adaptive_input_cutoffs": [20], "num_softmaxes": 3},
            "adaptive_input_cutoffs makes the LM head adaptive; use num_softmaxes=1 or tie_word_embeddings=False",
        ),
        (
            {"adaptive_softmax_cutoffs": [20, 50]},
            r"ties the softmax's clusters to the input embeddings, so adaptive_input_cutoffs must be \[20, 50\]",
        ),
        (
            {**TIED_SOFTMAX, "adaptive_input_factor": 2},
            r"adaptive_input_factor=4 \(got adaptive_input_cutoffs=\[20, 50, 90\], adaptive_input_factor=2\)",
        ),
    ],
)
@pytest.mark.parametrize("config_class", [HfzooDecoderConfig, HfzooEncoderDecoderConfig])
def test_invalid_adaptive_settings_are_refused(config_class, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        config_class(**{**TINY, **overrides})


def test_mixture_of_softmaxes_with_an_untied_head_over_adaptive_inputs_is_allowed():
    model = build("decoder", adaptive_input_cutoffs=[20], num_softmaxes=2, tie_word_embeddings=False)
    assert type(model.lm_head) is VocabProjection and model.lm_head.num_softmaxes == 2


def test_cutoffs_are_given_as_a_bracketed_list_in_config_overrides():
    """`--config_overrides` splits on commas outside brackets, so a list keeps its commas."""
    config = build_config(
        "decoder-tiny", "adaptive_input_cutoffs=[64,160],adaptive_softmax_cutoffs=[64, 160]", vocab_size=300
    )
    assert config.adaptive_input_cutoffs == config.adaptive_softmax_cutoffs == [64, 160]
    with pytest.raises(ValueError, match=r"adaptive_input_cutoffs='64': expected a list of ints in brackets"):
        build_config("decoder-tiny", "adaptive_input_cutoffs=64")
    with pytest.raises(ValueError, match=r"adaptive_input_cutoffs=\[160, 64\] must be strictly increasing"):
        build_config("decoder-tiny", "adaptive_input_cutoffs=[160,64]", vocab_size=300)
