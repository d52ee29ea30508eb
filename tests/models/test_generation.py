"""Static-cache generation, eager and compiled, in the generative families (decoder, encoder-decoder).

The encoder family is a masked LM without `generate`; its compiled forward is covered by
tests/training/test_compile.py. Here:

- with `model.forward = torch.compile(model.forward, fullgraph=True)` (transformers' recipe for fast generation,
  whose prefill then runs compiled too) two `generate` calls with `cache_implementation="static"` give the tokens
  of eager dynamic-cache greedy decoding, and the second call compiles nothing new;
- the compiled graphs mutate no input but the static cache's own tensors, and those are static inputs
  (`torch._dynamo.mark_static_address`), which is what CUDA graphs (`mode="reduce-overhead"`) need to update them
  in place instead of skipping the graph ("skipping cudagraphs due to mutated inputs");
- variants whose positions or token mixers read the cache (per-layer relative biases, Shaw, the synthesizer,
  convolutions, the Evolved Transformer, a sliding window) step through a static cache as through a dynamic one.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing
from helpers.variant_checks import FAMILIES as ALL_FAMILIES
from helpers.variant_checks import TINY as VARIANT_TINY
from torch._dynamo.backends.common import aot_autograd
from transformers import EncoderDecoderCache, StaticCache

TINY = {**VARIANT_TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
FAMILIES = {name: ALL_FAMILIES[name] for name in ("decoder", "encoder-decoder")}  # the generative families


def tiny(family: str, **overrides):
    config_class, model_class = FAMILIES[family]
    extra = {"decoder_start_token_id": 0} if family == "encoder-decoder" else {}
    torch.manual_seed(0)
    return model_class(config_class(**{**TINY, **extra, **overrides})).eval()


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, 97, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0  # left padding in the second row
    return ids, mask


class MutationRecorder:
    """A `torch.compile` backend (AOT autograd, no code generation) that records each graph's mutated inputs.

    `graphs` holds, per compiled graph, `(input name, is a static input)` for every input the graph mutates,
    as AOT autograd's metadata reports them to inductor (whose CUDA-graph check refuses a mutated input that is
    not static).
    """

    def __init__(self) -> None:
        self.graphs: list[list[tuple[str, bool]]] = []

    def __call__(self, gm, example_inputs):
        names = [node.name for node in gm.graph.nodes if node.op == "placeholder"]

        def forward_compiler(graph, inputs):
            metadata = torch._guards.TracingContext.try_get().fw_metadata
            static = set(metadata.static_input_indices or ())
            mutated = [i for i, info in enumerate(metadata.input_info) if info.mutates_data or info.mutates_metadata]
            self.graphs.append([(names[i], i in static) for i in mutated])
            return graph.forward

        return aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)(gm, example_inputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_static_cache_generation_equals_eager_and_compiles_once(family):
    model = tiny(family)
    ids, mask = prompt()
    options = dict(attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    with torch.no_grad():
        eager = model.generate(ids, **options)
    recorder = MutationRecorder()
    torch._dynamo.reset()
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, backend=recorder, fullgraph=True)
    with torch.no_grad():
        first = model.generate(ids, **options)
        compiled_graphs = len(recorder.graphs)
        second = model.generate(ids, **options)
    assert torch.equal(first, eager) and torch.equal(second, eager)
    assert compiled_graphs == 2  # the prefill and the decoding step
    assert len(recorder.graphs) == compiled_graphs  # the second call reuses them
    for mutated in recorder.graphs:
        assert mutated, "the cache is updated in place"
        for name, static in mutated:
            assert name.rsplit("_layers_", 1)[-1].split("_", 1)[-1] in ("keys", "values", "cumulative_length"), name
            assert static, f"{name} is mutated but not a static input: CUDA graphs would be skipped"


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_inductor_static_cache_generation_equals_eager(family):
    """The same with inductor and `mode="reduce-overhead"` (on CPU: inductor's C++ code, no CUDA graphs)."""
    model = tiny(family)
    ids, mask = prompt()
    options = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    with torch.no_grad():
        eager = model.generate(ids, **options)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, backend=counter, fullgraph=True)
    with torch.no_grad():
        first = model.generate(ids, **options)
        frames = counter.frame_count
        second = model.generate(ids, **options)
    assert torch.equal(first, eager) and torch.equal(second, eager)
    assert counter.frame_count == frames == 2


STEPPED_VARIANTS = [
    {},
    {"position_embedding_type": "relative_attention_bias", "share_relative_attention_bias": False},
    {"position_embedding_type": "shaw", "max_relative_positions": 2},
    {"position_embedding_type": "alibi"},
    {"token_mixer": "synthesizer", "synthesizer_type": "random"},
    {"token_mixer": "lightweight_convolution"},
    {"layer_type": "evolved_transformer"},
    {"token_mixer": "sliding_window", "attention_window": 4},
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("overrides", STEPPED_VARIANTS, ids=lambda o: ",".join(map(str, o.values())) or "default")
def test_stepping_through_a_static_cache_gives_the_full_forward_logits(family, overrides):
    """Prefill then one token at a time: the static cache gives the logits of one full forward pass.

    Weights scaled up so that a misplaced position changes the logits by far more than rounding.
    """
    model = tiny(family, **overrides)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3)
        ids = torch.randint(5, 97, (2, 9), generator=torch.Generator().manual_seed(0))
        if family == "decoder":
            cache = StaticCache(config=model.config, max_cache_len=12)

            def step(tokens, cache):
                return model(input_ids=tokens, cache=cache).logits
        else:
            source = torch.randint(5, 97, (2, 6), generator=torch.Generator().manual_seed(1))
            encoder_outputs = model.get_encoder()(input_ids=source)
            cache = EncoderDecoderCache(
                StaticCache(config=model.config, max_cache_len=12), StaticCache(config=model.config, max_cache_len=6)
            )

            def step(tokens, cache):
                return model(decoder_input_ids=tokens, encoder_outputs=encoder_outputs, cache=cache).logits

        full = step(ids, None)
        stepped = torch.cat([step(ids[:, :5], cache)] + [step(ids[:, t : t + 1], cache) for t in range(5, 9)], 1)
    torch.testing.assert_close(stepped, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_cache_generation_of_a_sliding_window_keeps_the_window(family):
    """`generate` prepares the static cache's 4-D mask with the stack's window (`create_masks_for_generate`)."""
    model = tiny(family, token_mixer="sliding_window", attention_window=4)
    ids, mask = prompt()
    options = dict(attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3)
        dynamic = model.generate(ids, **options)
        static = model.generate(ids, cache_implementation="static", **options)
    assert torch.equal(static, dynamic)


def test_generate_allocates_the_static_cache_before_the_first_forward():
    model = tiny("encoder-decoder")
    seen = []
    forward = model.forward

    def recording_forward(*args, **kwargs):
        cache = kwargs["cache"]
        layers = [*cache.self_attention_cache.layers, *cache.cross_attention_cache.layers]
        seen.append(all(layer.is_initialized for layer in layers))
        return forward(*args, **kwargs)

    model.forward = recording_forward
    ids, mask = prompt()
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, cache_implementation="static")
    assert seen and all(seen)
