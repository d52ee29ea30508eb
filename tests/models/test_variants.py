"""Every value of every architecture field, in every family it applies to (see `variant_checks.py`).

Each row of `VARIANTS` is `(overrides, families, backends)`; a test runs `check_variant` for each
row x family, and another loads each row x family exported for `trust_remote_code` in a clean
interpreter without hfzoo (all of them in one subprocess per session). A new modification adds its rows
here (one per value); the checks come for free. The coverage guards fail when a registry entry or a
config field has no row.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from helpers.remote_code import run_remote_code
from helpers.variant_checks import FAMILIES, TINY, check_variant, checked_model, make_batch, run
from safetensors.torch import load_file, save_file
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from hfzoo import AUTO_CLASSES
from hfzoo.export import export_for_remote_code, family_source_files, flatten_source
from hfzoo.modules.experts import ROUTERS
from hfzoo.modules.feed_forward import ACTIVATIONS
from hfzoo.modules.layer import NORM_POSITIONS, RESIDUAL_GATES, sandwich_pattern
from hfzoo.modules.linformer import LINFORMER_SHARING
from hfzoo.modules.memory import MEMORY_QUERY_NORMS
from hfzoo.modules.mixers import TOKEN_MIXERS
from hfzoo.modules.norms import NORM_CLASSES, QK_NORMS
from hfzoo.modules.positions import POSITION_ATTENTION_BACKENDS, POSITION_EMBEDDING_TYPES
from hfzoo.modules.stack import BLOCK_SHARING, LAYER_STACKS, LAYER_TYPES
from hfzoo.modules.synthesizer import SYNTHESIZER_MIXINGS, SYNTHESIZERS

ALL = tuple(FAMILIES)
BOTH = ("eager", "sdpa")
#: A product key memory small enough for `TINY`: 16 values, 2 heads reading 3 each.
TINY_MEMORY = {"memory_num_keys": 4, "memory_heads": 2, "memory_top_k": 3, "memory_key_dim": 8}


def backends_of(kind: str) -> tuple[str, ...]:
    """The CPU-testable backends (eager, SDPA) a position scheme supports."""
    return tuple(b for b in BOTH if b in POSITION_ATTENTION_BACKENDS[kind])


VARIANTS: list[tuple[dict, tuple[str, ...], tuple[str, ...]]] = [
    ({}, ALL, BOTH),
    # ---- feed-forward
    *[
        ({"hidden_act": act}, ALL, BOTH)
        for act in ("relu", "gelu", "silu", "swish", "gelu_new", "elu", "selu", "sigmoid", "softplus")
    ],
    ({"mlp_bias": False}, ALL, BOTH),
    # GLU, ReGLU, GeGLU, SwiGLU, LiGLU (Shazeer 2020)
    *[({"gated_mlp": True, "hidden_act": act}, ALL, BOTH) for act in ("sigmoid", "relu", "gelu", "silu", "linear")],
    # mixture of experts: top-k (Shazeer et al. 2017 / GShard), Switch (Fedus et al. 2021) with token dropping
    ({"num_experts": 4, "num_experts_per_tok": 2, "router_type": "top_k"}, ALL, BOTH),
    ({"num_experts": 3, "num_experts_per_tok": 1, "gated_mlp": True}, ALL, BOTH),
    ({"num_experts": 4, "router_type": "switch", "expert_capacity_factor": 0.5, "moe_layer_interval": 2}, ALL, BOTH),
    # ---- normalization
    *[({"norm_type": norm}, ALL, BOTH) for norm in NORM_CLASSES],
    *[({"norm_position": position}, ALL, BOTH) for position in NORM_POSITIONS],
    ({"norm_position": "sandwich", "norm_type": "rms_norm"}, ALL, BOTH),
    # ReZero alone, + LayerNorm, + RMSNorm (Narang et al. 2021's three rows)
    *[({"rezero": True, "norm_type": norm}, ALL, BOTH) for norm in NORM_CLASSES],
    ({"fixup_init": True, "norm_type": "none"}, ALL, BOTH),
    ({"embedding_norm": True}, ALL, BOTH),
    # ---- positions
    *[({"position_embedding_type": kind}, ALL, backends_of(kind)) for kind in POSITION_EMBEDDING_TYPES],
    ({"position_embedding_type": "relative_attention_bias", "share_relative_attention_bias": False}, ALL, BOTH),
    # few buckets and a short max distance, so 11 tokens reach the logarithmic and the last bucket
    (
        {
            "position_embedding_type": "relative_attention_bias",
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 6,
        },
        ALL,
        BOTH,
    ),
    ({"position_embedding_type": "shaw", "max_relative_positions": 2}, ALL, ("eager",)),  # clipping in reach
    ({"position_embedding_type": "rotary", "rope_theta": 100.0}, ALL, BOTH),
    ({"position_embedding_type": "alibi", "num_attention_heads": 8, "head_dim": 4}, ALL, BOTH),  # 8 slopes
    ({"position_embedding_type": "alibi", "num_attention_heads": 3, "head_dim": 8}, ALL, BOTH),  # not a power of 2
    ({"scale_attention_scores": False}, ALL, BOTH),
    ({"scale_lm_head_input": True}, ALL, BOTH),
    # ---- attention shape
    ({"head_dim": 12}, ALL, BOTH),
    ({"attention_bias": False}, ALL, BOTH),
    # ---- modifications in use today: QK-norm (Dehghani et al. 2023; OLMo 2) with every position scheme and with
    # sliding-window attention, attention / final logit soft-capping (Gemma 2; no SDPA for the attention cap),
    # squared ReLU (So et al. 2021, Primer), dense and gated
    # grouped-query attention (Ainslie et al. 2023) and multi-query attention (Shazeer 2019): 4 query heads
    ({"num_key_value_heads": 2, "position_embedding_type": "rotary"}, ALL, BOTH),
    ({"num_key_value_heads": 1}, ALL, BOTH),
    *[({"qk_norm": kind}, ALL, BOTH) for kind in QK_NORMS],
    ({"qk_norm": "rms_norm", "qk_norm_learnable_scale": False, "position_embedding_type": "rotary"}, ALL, BOTH),
    (
        {
            "qk_norm": "layer_norm",
            "qk_norm_learnable_scale": False,
            "position_embedding_type": "relative_attention_bias",
        },
        ALL,
        BOTH,
    ),
    ({"qk_norm": "rms_norm", "position_embedding_type": "alibi"}, ALL, BOTH),
    ({"qk_norm": "layer_norm", "position_embedding_type": "shaw", "max_relative_positions": 2}, ALL, ("eager",)),
    ({"qk_norm": "rms_norm", "token_mixer": "sliding_window", "attention_window": 4}, ALL, BOTH),
    (
        {
            "attn_logit_softcapping": 1.0,
            "token_mixer": "sliding_window",
            "attention_window": 4,
            "position_embedding_type": "alibi",
        },
        ALL,
        ("eager",),
    ),
    ({"attn_logit_softcapping": 0.5}, ALL, ("eager",)),
    ({"attn_logit_softcapping": 1.0, "qk_norm": "rms_norm", "position_embedding_type": "rotary"}, ALL, ("eager",)),
    ({"attn_logit_softcapping": 1.0, "position_embedding_type": "relative_attention_bias"}, ALL, ("eager",)),
    ({"attn_logit_softcapping": 1.0, "position_embedding_type": "shaw"}, ALL, ("eager",)),
    ({"final_logit_softcapping": 0.5}, ALL, BOTH),
    ({"final_logit_softcapping": 30.0, "embedding_size": 16}, ALL, BOTH),
    ({"final_logit_softcapping": 0.5, "attn_logit_softcapping": 0.5}, ALL, ("eager",)),
    ({"qk_norm": "rms_norm", "attn_logit_softcapping": 1.0, "token_mixer": "branched_attention"}, ALL, ("eager",)),
    (
        {
            "qk_norm": "rms_norm",
            "attn_logit_softcapping": 1.0,
            "token_mixer": "bigbird",
            "bigbird_block_size": 2,
            "bigbird_num_random_blocks": 1,
        },
        ("encoder",),
        ("eager",),
    ),
    ({"qk_norm": "rms_norm", "layer_type": "evolved_transformer"}, ALL, BOTH),
    ({"final_logit_softcapping": 1.0, "adaptive_input_cutoffs": [20, 50], "tie_word_embeddings": False}, ALL, BOTH),
    ({"hidden_act": "relu2"}, ALL, BOTH),
    ({"gated_mlp": True, "hidden_act": "relu2"}, ALL, BOTH),
    # ---- embeddings
    ({"tie_word_embeddings": False}, ALL, BOTH),
    ({"embedding_size": 16}, ALL, BOTH),
    ({"embedding_size": 16, "tie_word_embeddings": False}, ALL, BOTH),
    ({"scale_embeddings": True}, ALL, BOTH),
    *[
        ({"tie_encoder_decoder_embeddings": False, "tie_word_embeddings": tied}, ("encoder-decoder",), BOTH)
        for tied in (True, False)
    ],
    ({"tie_encoder_decoder_embeddings": False, "embedding_size": 16}, ("encoder-decoder",), BOTH),
    # ---- parameter sharing
    *[
        ({"block_sharing": choice}, ALL if choice in ("none", "all") else ("encoder-decoder",), BOTH)
        for choice in BLOCK_SHARING
    ],
    # ---- output
    # adaptive input embeddings (Baevski & Auli 2019): tied (one softmax through the clusters) and untied
    ({"adaptive_input_cutoffs": [20, 50]}, ALL, BOTH),
    ({"adaptive_input_cutoffs": [20, 50], "adaptive_input_factor": 2, "tie_word_embeddings": False}, ALL, BOTH),
    ({"adaptive_input_cutoffs": [20, 50], "tie_encoder_decoder_embeddings": False}, ("encoder-decoder",), BOTH),
    # adaptive softmax (Grave et al. 2017): output only; tied to adaptive inputs; without projection (factor 1)
    ({"adaptive_softmax_cutoffs": [20, 50, 90], "tie_word_embeddings": False}, ALL, BOTH),
    ({"adaptive_input_cutoffs": [20, 50, 90], "adaptive_softmax_cutoffs": [20, 50, 90]}, ALL, BOTH),
    (
        {
            "adaptive_input_cutoffs": [20, 50, 90],
            "adaptive_softmax_cutoffs": [20, 50, 90],
            "adaptive_input_factor": 1,
            "adaptive_softmax_factor": 1,
        },
        ALL,
        BOTH,
    ),
    ({"num_softmaxes": 3}, ALL, BOTH),
    ({"num_softmaxes": 3, "embedding_size": 16}, ALL, BOTH),
    # ---- what the decoder's cross-attention reads: transparent attention (Bapna et al. 2018)
    ({"transparent_attention": True}, ("encoder-decoder",), BOTH),
    ({"transparent_attention": True, "num_decoder_layers": 3, "block_sharing": "encoder"}, ("encoder-decoder",), BOTH),
    # ---- layer structure: token mixers (Press et al. 2020 sublayer orders in the patterns)
    *[({"token_mixer": name}, ALL, BOTH) for name in ("self_attention",)],
    ({"token_mixer": "self_attention", "decoder_token_mixer": "self_attention"}, ("encoder-decoder",), BOTH),
    # FNet (Lee-Thorp et al. 2022): bidirectional stacks only; in the encoder-decoder with a self-attention decoder
    ({"token_mixer": "fourier"}, ("encoder",), BOTH),
    ({"token_mixer": "fourier", "decoder_token_mixer": "self_attention"}, ("encoder-decoder",), BOTH),
    # Linformer (Wang et al. 2020): k = 4 projected positions for 11 tokens; bidirectional stacks only
    *[
        ({"token_mixer": "linformer", "linformer_k": 4, "linformer_sharing": sharing}, ("encoder",), BOTH)
        for sharing in LINFORMER_SHARING
    ],
    (
        {"token_mixer": "linformer", "linformer_k": 4, "decoder_token_mixer": "self_attention"},
        ("encoder-decoder",),
        BOTH,
    ),
    # sliding-window attention (Beltagy et al. 2020): 2 tokens on each side, inside the 11 and 7 tokens and the
    # 5 + 4 of generation; also in the encoder only (self-attention in the decoder), and with ALiBi
    ({"token_mixer": "sliding_window", "attention_window": 4}, ALL, BOTH),
    (
        {"token_mixer": "sliding_window", "attention_window": 4, "decoder_token_mixer": "self_attention"},
        ("encoder-decoder",),
        BOTH,
    ),
    ({"token_mixer": "sliding_window", "attention_window": 2, "position_embedding_type": "alibi"}, ALL, BOTH),
    # BigBird (Zaheer et al. 2020): blocks of 2 tokens, so 11 tokens have window, global and random blocks
    ({"token_mixer": "bigbird", "bigbird_block_size": 2, "bigbird_num_random_blocks": 1}, ("encoder",), BOTH),
    (
        {
            "token_mixer": "bigbird",
            "decoder_token_mixer": "self_attention",
            "bigbird_block_size": 2,
            "bigbird_num_random_blocks": 2,
            "bigbird_num_global_blocks": 1,
        },
        ("encoder-decoder",),
        BOTH,
    ),
    (
        {
            "token_mixer": "bigbird",
            "bigbird_block_size": 3,
            "bigbird_num_global_blocks": 0,
            "position_embedding_type": "shaw",
        },
        ("encoder",),
        ("eager",),
    ),
    # lightweight / dynamic convolutions (Wu et al. 2019): Wu et al.'s kernel widths, then per-layer widths (an
    # even one: asymmetric padding), fewer heads, the pointwise projection and weight dropout (train-mode checks)
    ({"token_mixer": "lightweight_convolution"}, ALL, BOTH),
    ({"token_mixer": "dynamic_convolution"}, ALL, BOTH),
    (
        {
            "token_mixer": "dynamic_convolution",
            "conv_kernel_size": [4, 2],
            "conv_num_heads": 2,
            "conv_pointwise_projection": True,
            "conv_weight_dropout": 0.1,
        },
        ALL,
        BOTH,
    ),
    (
        {"token_mixer": "lightweight_convolution", "conv_kernel_size": 5, "decoder_token_mixer": "self_attention"},
        ("encoder-decoder",),
        BOTH,
    ),
    # Synthesizer (Tay et al. 2020): every synthesis and mixing (Narang et al.'s seven rows), other heads without
    # positions, rotary in a mixture, a score bias added to random logits
    *[
        ({"token_mixer": "synthesizer", "synthesizer_type": kind, "synthesizer_mixing": mixing}, ALL, BOTH)
        for kind in ("dense", "random")
        for mixing in ("none", "plus", "plus_alpha")
    ],
    (
        {"token_mixer": "synthesizer", "synthesizer_type": "factorized_random", "synthesizer_factorized_rank": 3},
        ALL,
        BOTH,
    ),
    (
        {
            "token_mixer": "synthesizer",
            "synthesizer_type": "factorized_random",
            "synthesizer_mixing": "plus_alpha",
            "synthesizer_num_heads": 2,
            "synthesizer_head_dim": 12,
            "position_embedding_type": "none",
        },
        ALL,
        BOTH,
    ),
    (
        {"token_mixer": "synthesizer", "synthesizer_mixing": "plus", "position_embedding_type": "rotary"},
        ALL,
        BOTH,
    ),
    (
        {
            "token_mixer": "synthesizer",
            "synthesizer_type": "random",
            "position_embedding_type": "relative_attention_bias",
        },
        ALL,
        BOTH,
    ),
    # layer types: the Transformer layer (default) and the layers of other architectures
    *[({"layer_type": name}, ALL, BOTH) for name in LAYER_TYPES],
    # Evolved Transformer (So et al. 2019): with T5's shared relative bias and ALiBi (a shared score bias is
    # repeated for the decoder cell's 2H-head attention), RMSNorm and no biases; rotary positions
    (
        {
            "layer_type": "evolved_transformer",
            "position_embedding_type": "relative_attention_bias",
            "norm_type": "rms_norm",
            "mlp_bias": False,
        },
        ALL,
        BOTH,
    ),
    ({"layer_type": "evolved_transformer", "position_embedding_type": "rotary"}, ALL, BOTH),
    ({"layer_type": "evolved_transformer", "position_embedding_type": "alibi"}, ALL, BOTH),
    ({"sublayer_pattern": sandwich_pattern(TINY["num_hidden_layers"], 1)}, ALL, BOTH),  # sandwich "ssff"
    ({"sublayer_pattern": "s" * 2 * TINY["num_hidden_layers"]}, ALL, BOTH),  # attention only
    ({"sublayer_pattern": "f" * 2 * TINY["num_hidden_layers"], "use_cache": False}, ("decoder", "encoder"), BOTH),
    ({"sublayer_pattern": "fssf", "num_experts": 2, "moe_layer_interval": 2}, ALL, BOTH),  # any order
    # ---- Narang et al. 2021's Table 1: Universal Transformer (Dehghani et al. 2019; ACT, Graves 2016), with the
    # gated residuals of Narang et al.'s configuration; Funnel Transformer (Dai et al. 2020, bidirectional stacks);
    # Weighted Transformer (Ahmed et al. 2017); product key memory (Lample et al. 2019)
    ({"layer_stack": "universal", "num_recurrent_steps": 3}, ALL, BOTH),
    ({"layer_stack": "universal", "act_threshold": 0.6, "act_loss_coef": 0.1, "num_recurrent_steps": 4}, ALL, BOTH),
    (
        {
            "layer_stack": "universal",
            "adaptive_computation_time": False,
            "num_recurrent_steps": 2,
            "residual_gating": "gru",
        },
        ALL,
        BOTH,
    ),
    ({"decoder_layer_stack": "universal", "num_recurrent_steps": 2}, ("encoder-decoder",), BOTH),
    *[({"residual_gating": gate}, ALL, BOTH) for gate in RESIDUAL_GATES],
    ({"layer_stack": "funnel"}, ("encoder",), BOTH),
    ({"layer_stack": "standard", "decoder_layer_stack": "standard"}, ("encoder-decoder",), BOTH),
    ({"layer_stack": "funnel", "decoder_layer_stack": "standard"}, ("encoder-decoder",), BOTH),
    # three blocks (two poolings) of one layer, a score bias at pooled positions, one up-sampling layer
    (
        {
            "layer_stack": "funnel",
            "num_hidden_layers": 3,
            "funnel_block_sizes": [1, 1, 1],
            "funnel_upsampling_layers": 1,
            "position_embedding_type": "relative_attention_bias",
        },
        ("encoder",),
        BOTH,
    ),
    (
        {
            "layer_stack": "funnel",
            "decoder_layer_stack": "standard",
            "num_hidden_layers": 3,
            "position_embedding_type": "alibi",
        },
        ("encoder-decoder",),
        BOTH,
    ),
    ({"token_mixer": "branched_attention"}, ALL, BOTH),
    *[({"memory_layers": [-1], "memory_query_norm": norm, **TINY_MEMORY}, ALL, BOTH) for norm in MEMORY_QUERY_NORMS],
    ({"decoder_memory_layers": [0], **TINY_MEMORY}, ("encoder-decoder",), BOTH),
    # ---- depth and token types
    ({"num_decoder_layers": 3}, ("encoder-decoder",), BOTH),
    ({"type_vocab_size": 0}, ("encoder",), BOTH),
    # ---- connections across a stack's layers (hfzoo/modules/connections.py): value residual learning (ResFormer,
    # Zhou et al. 2024) and U-Net skips (modded-nanogpt); an odd depth leaves the middle layer without a skip
    ({"value_residual": True}, ALL, BOTH),
    ({"value_residual": True, "token_mixer": "sliding_window", "attention_window": 4}, ALL, BOTH),
    ({"value_residual": True, "block_sharing": "all"}, ALL, BOTH),
    ({"unet_skips": True}, ALL, BOTH),
    (
        {"unet_skips": True, "value_residual": True, "num_hidden_layers": 3, "position_embedding_type": "rotary"},
        ALL,
        BOTH,
    ),
]


def case_id(family: str, overrides: dict) -> str:
    """The test id of one row x family, e.g. `decoder:norm_position=post`."""
    return f"{family}:" + (",".join(f"{k}={v}" for k, v in overrides.items()) or "defaults")


CASES = [
    pytest.param(family, overrides, backends, id=case_id(family, overrides))
    for overrides, families, backends in VARIANTS
    for family in families
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one CPU thread than on two shared with other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family, overrides, backends", CASES)
def test_variant(family, overrides, backends, tmp_path):
    check_variant(family, overrides, tmp_path, backends)


@pytest.fixture(scope="session")
def remote_code_outputs(clean_python, tmp_path_factory) -> dict[str, tuple]:
    """Every case loaded with `trust_remote_code` code in ONE subprocess of a clean interpreter without hfzoo.

    The first case of each family is exported with `export_for_remote_code`; the source files are the
    same for every case of a family (checked here), so the other cases' `save_pretrained` folders are
    loaded by the model class of that export's remote code (imported once per family in the subprocess).

    Returns:
        `{case id: (in-package logits or the error, remote-code logits or None, the remote error or None)}`;
        both sides run in fp32 with eager attention on the same batch (`make_batch`).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both sides run on one thread, so that their logits are bit-identical
    try:
        return _load_every_case_as_remote_code(clean_python, tmp_path_factory.mktemp("variant_exports"))
    finally:
        torch.set_num_threads(threads)


def _load_every_case_as_remote_code(clean_python, root: Path) -> dict[str, tuple]:
    tensors = {}
    for family in FAMILIES:
        batch = make_batch(family)
        tensors[f"{family}.input_ids"], tensors[f"{family}.attention_mask"] = batch.input_ids, batch.attention_mask
        if batch.decoder_input_ids is not None:
            tensors[f"{family}.decoder_input_ids"] = batch.decoder_input_ids
    save_file(tensors, root / "inputs.safetensors")
    auto_names = {model: auto.__name__ for models in AUTO_CLASSES.values() for auto, model in models.items()}
    code_dirs: dict[str, Path] = {}
    expected, entries = {}, []
    for index, case in enumerate(CASES):
        family, overrides, _ = case.values
        key = f"case{index}"
        try:
            model = checked_model(family, overrides, "eager")  # ReZero / Fixup branches switched on
            if family not in code_dirs:
                code_dirs[family] = export_for_remote_code(model, root / key)
            else:
                model.save_pretrained(root / key)
                sources = {path.name: path.read_bytes() for path in code_dirs[family].glob("*.py")}
                assert sources == {name: source.encode() for name, source in exported_sources(type(model)).items()}
            with torch.no_grad():
                expected[case.id] = run(model, make_batch(family)).logits
        except Exception as error:  # reported by this case's test; the others still run
            expected[case.id] = error
            continue
        names = [name.split(".")[1] for name in tensors if name.startswith(f"{family}.")]
        entries.append(
            {
                "key": key,
                "case": case.id,
                "auto": auto_names[type(model)],
                "dir": str(root / key),
                "code_dir": str(code_dirs[family]),
                "inputs": {name: f"{family}.{name}" for name in names},
            }
        )
    workdir = root / "clean"
    workdir.mkdir()
    job = {
        "models": entries,
        "inputs": str(root / "inputs.safetensors"),
        "outputs": str(root / "outputs.safetensors"),
        "threads": 1,
        "keep_going": True,
    }
    result = run_remote_code(clean_python, job, workdir, timeout=900)
    assert result["hfzoo"] == "ModuleNotFoundError" and result["hfzoo_modules_loaded"] == []
    got = load_file(root / "outputs.safetensors")
    outputs = {case_id: (value, None, None) for case_id, value in expected.items()}
    for entry in entries:
        key = entry["key"]
        outputs[entry["case"]] = (expected[entry["case"]], got.get(key), result["errors"].get(key))
        if key in result["classes"]:
            assert result["classes"][key][0].startswith("transformers_modules."), result["classes"][key]
    return outputs


def exported_sources(model_class: type) -> dict[str, str]:
    """The flat source files `export_for_remote_code` writes for `model_class`'s family (cached per family)."""
    family = next(config_class for config_class, models in AUTO_CLASSES.items() if model_class in models.values())
    if family not in _SOURCES:
        _SOURCES[family] = {name: flatten_source(module) for name, module in family_source_files(family).items()}
    return _SOURCES[family]


_SOURCES: dict[type, dict[str, str]] = {}


@pytest.mark.parametrize("family, overrides, backends", CASES)
def test_variant_loads_as_remote_code(family, overrides, backends, remote_code_outputs):
    """The row exported with `trust_remote_code` code gives identical logits in an interpreter without hfzoo."""
    expected, got, error = remote_code_outputs[case_id(family, overrides)]
    if isinstance(expected, Exception):
        raise expected
    assert error is None, error
    assert got is not None and torch.equal(got, expected), (got - expected).abs().max()


def test_every_registered_choice_has_a_row():
    """A registry entry without a row in `VARIANTS` would be an untested option."""
    covered = {(k, str(v)) for overrides, _, _ in VARIANTS for k, v in overrides.items()}  # str: lists too
    for fields, choices in (
        (("norm_type",), NORM_CLASSES),
        (("norm_position",), NORM_POSITIONS),
        (("hidden_act",), [name for name in ACTIVATIONS if name not in ACT2FN]),  # hfzoo's own activations
        (("router_type",), ROUTERS),
        (("position_embedding_type",), POSITION_EMBEDDING_TYPES),
        (("block_sharing",), BLOCK_SHARING),
        (("layer_type",), LAYER_TYPES),
        (("token_mixer", "decoder_token_mixer"), TOKEN_MIXERS),
        (("linformer_sharing",), LINFORMER_SHARING),
        (("synthesizer_type",), SYNTHESIZERS),
        (("synthesizer_mixing",), SYNTHESIZER_MIXINGS),
        (("layer_stack", "decoder_layer_stack"), LAYER_STACKS),
        (("residual_gating",), RESIDUAL_GATES),
        (("memory_query_norm",), MEMORY_QUERY_NORMS),
        (("qk_norm",), QK_NORMS),
    ):
        missing = [c for c in choices if not any((field, str(c)) in covered for field in fields)]
        assert not missing, f"{' / '.join(fields)} values without a VARIANTS row: {missing}"


def test_every_mixer_applying_score_options_has_a_row_with_them():
    """A token mixer whose entry applies QK-norm / soft-capping (`score_options`) is run with each of them."""
    for name, entry in TOKEN_MIXERS.items():
        for option in entry.score_options:
            rows = [o for o, _, _ in VARIANTS if option in o and o.get("token_mixer", "self_attention") == name]
            assert rows, f"token_mixer={name!r} applies {option} but no VARIANTS row sets both"


def test_every_sublayer_order_has_a_row():
    """The sandwich, attention-only, feed-forward-only and an arbitrary order each have a row (Press et al. 2020)."""
    patterns = [overrides["sublayer_pattern"] for overrides, _, _ in VARIANTS if "sublayer_pattern" in overrides]
    kinds = {
        "sandwich": lambda p: re.fullmatch(r"(s+)(sf)*(f+)", p) and p.count("s") == p.count("f"),
        "attention only": lambda p: set(p) == {"s"},
        "feed-forward only": lambda p: set(p) == {"f"},
        "other order": lambda p: set(p) == {"s", "f"} and not re.fullmatch(r"s*(sf)*f*", p),
    }
    missing = [kind for kind, matches in kinds.items() if not any(matches(p) for p in patterns)]
    assert not missing, f"sublayer_pattern kinds without a VARIANTS row: {missing}"


# Config fields that no row needs to vary: they change no module structure (dropout rates, epsilons and the
# initialisation scale, loss weights, token ids, output switches); their effects are tested in the test file
# of their module. A new architecture field must get a row instead of an entry here.
NO_ROW_FIELDS = {
    "layer_norm_eps": "epsilon of the norms the norm_type rows build",
    "rms_norm_eps": "epsilon of the norms the norm_type rows build",
    "initializer_range": "initialisation scale (tests/modules/test_positions.py, tests/modules/test_ffn_norms.py)",
    "hidden_dropout_prob": "dropout rate; the checks run in eval mode",
    "attention_probs_dropout_prob": "dropout rate; the checks run in eval mode",
    "activation_dropout": "dropout rate; the checks run in eval mode",
    "classifier_dropout": "dropout rate of the classification heads",
    "use_cache": "runtime switch (set by rows whose variant has no KV cache)",
    "output_router_logits": "output switch (tests/modules/test_ffn_norms.py)",
    "router_aux_loss_coef": "loss weight (tests/modules/test_ffn_norms.py)",
    "router_z_loss_coef": "loss weight (tests/modules/test_ffn_norms.py)",
    "bos_token_id": "token id",
    "decoder_start_token_id": "token id",
}


def test_every_config_field_has_a_row():
    """Every hfzoo config field is set by some row (or by `TINY`), or listed in `NO_ROW_FIELDS` with its reason."""
    covered = {k for overrides, _, _ in VARIANTS for k in overrides} | set(TINY) | set(NO_ROW_FIELDS)
    inherited = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    for config_class, _ in FAMILIES.values():
        fields = [field.name for field in dataclasses.fields(config_class) if field.name not in inherited]
        missing = [name for name in fields if name not in covered]
        assert not missing, f"{config_class.__name__} fields without a VARIANTS row: {missing}"
