"""`--torch_compile` of the recipes: compile the model's repeated layers (or the whole model) in place, or run eagerly.

`compile_model(model, args, accelerator)` compiles before `accelerator.prepare`, by default regionally
(`--torch_compile_scope regions`, PyTorch's regional compilation recipe,
https://pytorch.org/tutorials/recipes/regional_compilation.html): each block of a repeated layer list
(`HfzooStack.layers`: a `torch.nn.ModuleList` of one class, as accelerate's `is_repeated_blocks` finds them)
is compiled, and since the blocks run the same code on parameters of the same shapes, dynamo traces and
optimizes one layer and every other layer reuses that graph. Compiling takes the time of one layer instead
of all of them. The training loss is compiled as a region of its own (`compile_output_layer`): an hfzoo head
computes it chunk by chunk, and the scores over the vocabulary, their softmax and their gradient make it the
largest non-repeated part of a small model's step; one chunk's work is the compiled graph, while the loop over
chunks, the weight gradient's accumulation, the embeddings and the final norm run eagerly.
`--torch_compile_scope model` compiles the whole model as one graph instead (slower to compile; it can fuse
across layers).

Both compile in place (`torch.nn.Module.compile`, through accelerate's in-place `compile_regions_fsdp2` for
the blocks) rather than wrapping modules in `torch.compile`'s `OptimizedModule`: the module tree is kept, so
`state_dict` keys, `save_pretrained`, checkpoints and DDP's parameter hooks stay those of the eager model
(no `_orig_mod.` prefix, which accelerate's `compile_regions` would add to every compiled block's keys).

A layer that extends a KV cache specializes on it (the cache's layers are indexed by the layer's index,
and each cache layer starts empty), so every layer would compile its own graph: the recipes' training and
evaluation passes build no cache (`no_cache_kwargs`), so each stack's layers share one graph there.
Generation with a `DynamicCache` still compiles a few graphs per layer (dynamo's recompile limit, 8 per
code object, then runs the remaining layers eagerly: same tokens, less speed-up).

Configurations that do not compile cleanly (`compile_blocker`, registry `COMPILE_BLOCKERS` at the bottom;
docs/modifications.md lists them with the reason) run eagerly with a warning, as does a run under
DeepSpeed, whose engine hooks into the module's forward pass.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, compile_regions_fsdp2, extract_model_from_parallel
from accelerate.utils.other import is_repeated_blocks

from ..modeling_utils import accepted_keywords
from .arguments import TORCH_COMPILE_SCOPES, compile_requested
from .precision import aten_cpu_capability

logger = logging.getLogger(__name__)

__all__ = [
    "COMPILE_BLOCKERS",
    "compile_blocker",
    "compile_model",
    "compile_output_layer",
    "compile_regions",
    "compile_repeated_blocks",
    "compile_requested",
    "no_cache_kwargs",
    "separate_compile_caches_by_cpu_capability",
]


def separate_compile_caches_by_cpu_capability() -> str | None:
    """Key `torch.compile`'s on-disk caches by `ATEN_CPU_CAPABILITY` when it is set, before hfzoo compiles.

    Inductor generates its CPU kernels for the vector width `ATEN_CPU_CAPABILITY` allows (`avx2`: 8 floats;
    an AVX-512 host's default: 16), but torch 2.13's FX graph cache leaves that setting out of its key. On
    a host where some runs are capped (`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`, how an AVX-512 or
    AMX host behaves as an AVX2 one) and others are not, a run then loads the other width's kernels from the
    cache: an uncapped run after a capped one corrupted the heap and aborted, a capped run after an uncapped
    one computed wrong losses or NaN (`tests/training/test_compile.py`). Adding the setting to
    `torch.compiler.config.cache_key_tag` (torch's own tag "included in the cache key generation for all
    torch compile caching") gives each its own entries. Without the variable, nothing changes.

    Returns:
        The tag now in effect when the variable is set (a tag already there is kept, with this appended),
        else None.
    """
    value = aten_cpu_capability()
    if not value:
        return None
    part = f"ATEN_CPU_CAPABILITY={value}"
    tag = torch.compiler.config.cache_key_tag
    if part not in tag.split(";"):
        torch.compiler.config.cache_key_tag = f"{tag};{part}" if tag else part
    return torch.compiler.config.cache_key_tag


def compile_blocker(config) -> str | None:
    """Why a model config cannot compile without graph breaks (None: it can).

    Args:
        config: any transformers config (fields an hfzoo config lacks are read as absent).

    Returns:
        The reason of the first matching `COMPILE_BLOCKERS` entry, or None.
    """
    for field, (matches, reason) in COMPILE_BLOCKERS.items():
        if hasattr(config, field) and matches(getattr(config, field)):
            return f"{field}={getattr(config, field)!r}: {reason}"
    return None


def compile_repeated_blocks(model: torch.nn.Module, **compile_kwargs) -> list[str]:
    """Compile in place every block of each repeated layer list of `model` (PyTorch's regional compilation recipe).

    A repeated layer list is a `torch.nn.ModuleList` whose modules are all of one class (accelerate's
    `is_repeated_blocks`); the search runs from the root down and does not look inside a list it compiles. Each
    list is compiled with accelerate's `compile_regions_fsdp2`, which calls `torch.nn.Module.compile` on each
    block: the blocks stay where they are (state-dict keys unchanged), and as they run the same code on
    parameters of the same shapes, the first block's graph serves the others (no recompilation per layer).

    Unlike accelerate's `compile_regions`, modules outside the lists are not compiled: an hfzoo stack's layer
    stack (`HfzooStack.layer_stack`) has no children of its own, so compiling it as a leaf would trace all the
    layers it calls into one graph again; the embeddings, final norm, head and loss run eagerly.

    Args:
        model: any module (an hfzoo model, a `PeftModel` around one).
        **compile_kwargs: `torch.compile` options (`backend`, `mode`, ...).

    Returns:
        The qualified names of the compiled lists (`["model.layers"]` for a decoder, `["model.encoder.layers",
        "model.decoder.layers"]` for an encoder-decoder); empty when the model has none (nothing compiled).
    """
    separate_compile_caches_by_cpu_capability()
    compiled, seen = [], set()

    def visit(name: str, module: torch.nn.Module) -> None:
        if id(module) in seen:
            return
        seen.add(id(module))
        if is_repeated_blocks(module):
            compile_regions_fsdp2(module, **compile_kwargs)
            compiled.append(name)
            return
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", model)
    return compiled


def compile_output_layer(model: torch.nn.Module, **compile_kwargs) -> str | None:
    """Compile the training loss of `model`'s output layer (`get_output_embeddings()`), a region of its own.

    An hfzoo language-modelling head computes its training loss inside that module, chunk by chunk
    (`hfzoo.modules.embeddings.chunked_linear_cross_entropy`); its `compile_loss` compiles the work of one
    chunk (`hfzoo.modules.embeddings.linear_cross_entropy_chunk`: the scores' matrix product, the float32
    log-softmax, the loss and the gradients of the scores and the hidden states; eager, each is a pass over the
    scores with tensors allocated op by op), the largest part of a small model's step outside the repeated
    layers (e.g. a vocabulary of 8,192 at hidden size 256). The loop over chunks and the weight gradient's
    accumulation stay eager, so the graph does not grow with the number of tokens. Other output layers (a plain
    `nn.Linear`, whose loss is computed outside it) are left as they are.

    Args:
        model: an hfzoo or transformers model, or a `PeftModel` around one.
        **compile_kwargs: `torch.compile` options (`backend`, `mode`, ...).

    Returns:
        The output layer's qualified name (`"lm_head"`) when its loss was compiled, else None.
    """
    separate_compile_caches_by_cpu_capability()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None or not hasattr(head, "compile_loss") or not head.compile_loss(**compile_kwargs):
        return None
    return next(name for name, module in model.named_modules() if module is head)


def compile_regions(model: torch.nn.Module, **compile_kwargs) -> list[str]:
    """Regional compilation of `model` in place: its repeated layer lists and its output layer.

    `compile_repeated_blocks` (one graph for all the blocks of a list) and `compile_output_layer` (an hfzoo
    head's training loss); what `--torch_compile` does by default.

    Args:
        model: any module (an hfzoo model, a `PeftModel` around one).
        **compile_kwargs: `torch.compile` options (`backend`, `mode`, ...).

    Returns:
        The compiled lists' qualified names, then the output layer's when its loss was compiled; empty when the
        model has no repeated layers (nothing compiled: compile the whole model instead).
    """
    regions = compile_repeated_blocks(model, **compile_kwargs)
    if regions and (head := compile_output_layer(model, **compile_kwargs)) is not None:
        regions.append(head)
    return regions


def compile_model(model: torch.nn.Module, args: argparse.Namespace, accelerator: Accelerator) -> bool:
    """Compile `model` in place, by its repeated layers or whole, when the run asks for it and the model allows it.

    Source: PyTorch's regional compilation recipe (https://pytorch.org/tutorials/recipes/regional_compilation.html),
    through accelerate's in-place block compilation (`compile_regions`: the repeated layers, then the output
    layer). State-dict keys and
    `save_pretrained` output stay those of the eager model in both scopes.

    Args:
        model: the model, before `accelerator.prepare` (a `PeftModel` is searched for repeated layers, or
            compiled whole; its base model's config decides whether it can be compiled).
        args: `torch_compile`, `torch_compile_mode`, `torch_compile_backend` (transformers' names) and
            `torch_compile_scope` (`hfzoo.training.arguments.TORCH_COMPILE_SCOPES`; default `"regions"`).
        accelerator: the run's accelerator (DeepSpeed runs stay eager).

    Returns:
        True when the model (or its repeated layers) was compiled; False when not asked for, or when it falls back
        to eager execution (with a warning naming the reason). A model without repeated layers is compiled
        whole under `"regions"` too (logged).

    Raises:
        ValueError: a `torch_compile_scope` not in `TORCH_COMPILE_SCOPES`.
    """
    if not compile_requested(args):
        return False
    scope = getattr(args, "torch_compile_scope", None) or "regions"
    if scope not in TORCH_COMPILE_SCOPES:
        raise ValueError(f"torch_compile_scope={scope!r}: expected one of {list(TORCH_COMPILE_SCOPES)}")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    reason = compile_blocker(base.config)
    if reason is None and accelerator.distributed_type == DistributedType.DEEPSPEED:
        reason = "the DeepSpeed engine hooks into the forward pass of every module"
    if reason is not None:
        logger.warning(f"--torch_compile: running eagerly ({reason})")
        return False
    options = {"backend": getattr(args, "torch_compile_backend", None) or "inductor"}
    if getattr(args, "torch_compile_mode", None):
        options["mode"] = args.torch_compile_mode
    if scope == "regions":
        regions = compile_regions(model, **options)
        if regions:
            logger.info(f"--torch_compile: {', '.join(regions)} compiled as regions ({options})")
            return True
        logger.info("--torch_compile: no repeated layers to compile regionally, compiling the whole model")
    separate_compile_caches_by_cpu_capability()
    model.compile(**options)
    logger.info(f"--torch_compile: model compiled ({options})")
    return True


def no_cache_kwargs(model: torch.nn.Module) -> dict[str, bool]:
    """Keyword arguments that stop a training or evaluation forward pass from building a KV cache.

    A causal stack builds a `DynamicCache` whenever `use_cache` is on (the config's default), training
    included, as transformers' models do; nothing reads it there. Each compiled layer would specialize on
    that cache (one graph per layer instead of one for all, up to dynamo's recompile limit), and it holds
    every layer's keys and values until the output is dropped.

    Args:
        model: the model the batches go to, as prepared (DDP and DeepSpeed wrappers are looked through, and a
            `PeftModel`'s base model is read).

    Returns:
        `{"use_cache": False}` when the model's `forward` names `use_cache` (hfzoo's decoder and
        encoder-decoder families), else `{}` (an encoder, whose `forward` would refuse it).
    """
    model = extract_model_from_parallel(model, keep_torch_compile=False)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {"use_cache": False} if "use_cache" in accepted_keywords(base) else {}


#: config field -> (predicate on its value, why such a model does not compile cleanly). Checked by
#: `tests/training/test_compile.py`, which also checks that every other configuration it covers has no graph break.
COMPILE_BLOCKERS: dict[str, tuple[Callable[[object], bool], str]] = {
    "num_experts": (
        lambda value: bool(value),
        "mixture-of-experts layers hand their router logits to the load-balancing loss through transformers' "
        "output-capturing hooks, which read a ContextVar that torch.compile cannot trace (graph breaks in every "
        "expert layer)",
    ),
}
