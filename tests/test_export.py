"""`hfzoo.export.export_for_remote_code`: checkpoints that load with `trust_remote_code=True` WITHOUT hfzoo.

The remote-code checks run in a real clean environment (the `clean_python` fixture of `conftest.py`: a
`venv --without-pip` that sees this venv's packages without hfzoo's editable-install hook, so
`import hfzoo` fails there, asserted in the subprocess; the script is `remote_code.CLEAN_ENV_SCRIPT`).
One subprocess per family loads every head of the family and writes its outputs back, which must be
bit-identical to the in-package model's (fp32, eager attention, same number of threads).
"""

from __future__ import annotations

import ast
import json
import re
import sys

import pytest
import torch
import transformers
from helpers.remote_code import run_remote_code
from helpers.variant_checks import TINY as VARIANT_TINY
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import hfzoo
from hfzoo import AUTO_CLASSES, HfzooDecoderConfig, HfzooEncoderConfig, HfzooEncoderDecoderConfig
from hfzoo.export import ExportError, export_for_remote_code, family_source_files, flatten_source
from hfzoo.tokenization import train_bpe_tokenizer

TINY = {**VARIANT_TINY, "vocab_size": 100, "bos_token_id": 2}  # the tokenizer below has 100 tokens
FAMILIES = {
    "decoder": HfzooDecoderConfig,
    "encoder": HfzooEncoderConfig,
    "encoder_decoder": HfzooEncoderDecoderConfig,
}
# The main (pretraining) head of each family: generation is also checked for the generative ones.
GENERATIVE = {"decoder": "AutoModelForCausalLM", "encoder_decoder": "AutoModelForSeq2SeqLM"}
TEXT = "The quick brown fox jumps over the lazy dog. " * 20 + "It was a dark and stormy night; the rain fell. " * 20
pytestmark = pytest.mark.compat  # the whole file


def family_inputs(family: str) -> dict[str, torch.Tensor]:
    """A padded batch (right padding, eos at each row's end), decoder inputs, and generation prompts."""
    g = torch.Generator().manual_seed(0)
    lengths = [7, 4]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, TINY["vocab_size"], (n,), generator=g)
        ids[row, n - 1] = TINY["eos_token_id"]
        mask[row, :n] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family == "encoder_decoder":
        inputs["decoder_input_ids"] = torch.randint(3, TINY["vocab_size"], (2, 5), generator=g)
        inputs["gen_input_ids"], inputs["gen_attention_mask"] = ids.clone(), mask.clone()
    if family == "decoder":  # left-padded prompts for generation
        prompt = torch.randint(3, TINY["vocab_size"], (2, 5), generator=g)
        prompt[1, :2] = TINY["pad_token_id"]
        gen_mask = torch.ones_like(prompt)
        gen_mask[1, :2] = 0
        inputs["gen_input_ids"], inputs["gen_attention_mask"] = prompt, gen_mask
    return inputs


def model_input_names(family: str, auto_name: str) -> list[str]:
    names = ["input_ids", "attention_mask"]
    # the sequence classifier builds its decoder inputs from the source; the token classifier has no decoder
    if family == "encoder_decoder" and auto_name not in ("AutoModelForSequenceClassification",
                                                         "AutoModelForTokenClassification"):  # fmt: skip
        names.append("decoder_input_ids")
    return names


def build_model(config_class, model_class, seed: int):
    torch.manual_seed(seed)
    model = model_class(config_class(**TINY, num_labels=3))
    model.set_attn_implementation("eager")
    return model.eval()


def first_output(out) -> torch.Tensor:
    """The logits, a span head's `(batch, seq_len, 2)` start and end logits, or the last hidden states."""
    if getattr(out, "start_logits", None) is not None:
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer([TEXT], vocab_size=300, min_frequency=1, model_family="decoder")


@pytest.mark.parametrize("release", ["installed", "other"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_loads_without_hfzoo_with_identical_outputs(family, release, request, tmp_path, tokenizer):
    """An export made here loads without hfzoo, with this transformers and with another release (CI: the lowest)."""
    python = request.getfixturevalue("clean_python" if release == "installed" else "other_release_python")
    config_class = FAMILIES[family]
    inputs = family_inputs(family)
    save_file(inputs, tmp_path / "inputs.safetensors")
    expected, jobs = {}, []
    for seed, (auto_class, model_class) in enumerate(AUTO_CLASSES[config_class].items()):
        auto_name = auto_class.__name__
        model = build_model(config_class, model_class, seed)
        out_dir = tmp_path / f"{family}-{auto_name}"
        if family == "decoder" and auto_name == "AutoModelForCausalLM":
            # The checkpoint-folder route: a saved folder (with its tokenizer) is exported.
            saved = tmp_path / "saved"
            model.save_pretrained(saved)
            tokenizer.save_pretrained(saved)
            assert export_for_remote_code(str(saved), out_dir) == out_dir
        else:
            export_for_remote_code(model, out_dir)
        names = model_input_names(family, auto_name)
        with torch.no_grad():
            expected[auto_name] = first_output(model(**{n: inputs[n] for n in names}))
            if GENERATIVE.get(family) == auto_name:
                expected["generate"] = model.generate(
                    input_ids=inputs["gen_input_ids"],
                    attention_mask=inputs["gen_attention_mask"],
                    max_new_tokens=8,
                    min_new_tokens=8,
                    do_sample=False,
                )
        jobs.append(
            {"auto": auto_name, "dir": str(out_dir), "inputs": names, "generate": GENERATIVE.get(family) == auto_name}
        )
        if family == "decoder" and auto_name == "AutoModelForCausalLM":
            jobs[-1]["resave"] = str(tmp_path / "resaved")
        auto_map = json.loads((out_dir / "config.json").read_text())["auto_map"]
        assert auto_map["AutoConfig"] == f"{config_class.__module__.rpartition('.')[2]}.{config_class.__name__}"
        assert auto_map[auto_name] == f"{model_class.__module__.rpartition('.')[2]}.{model_class.__name__}"
        assert set(auto_map) == {"AutoConfig", *(a.__name__ for a in AUTO_CLASSES[config_class])}
        assert (out_dir / "model.safetensors").is_file()

    workdir = tmp_path / "clean"
    workdir.mkdir()
    job = {
        "models": jobs,
        "inputs": str(tmp_path / "inputs.safetensors"),
        "outputs": str(tmp_path / "outputs.safetensors"),
        "threads": torch.get_num_threads(),
    }
    if family == "decoder":
        job.update(tokenizer_dir=str(tmp_path / "decoder-AutoModelForCausalLM"), text=TEXT[:60])
    result = run_remote_code(python, job, workdir)

    assert (result["transformers"] == transformers.__version__) == (release == "installed")
    assert result["hfzoo"] == "ModuleNotFoundError"
    assert result["hfzoo_modules_loaded"] == []
    got = load_file(tmp_path / "outputs.safetensors")
    for auto_class, model_class in AUTO_CLASSES[config_class].items():
        name = auto_class.__name__
        module, class_name = result["classes"][name]
        assert module.startswith("transformers_modules.") and class_name == model_class.__name__
        assert result["config_classes"][name][1] == config_class.__name__
        assert got[name].shape == expected[name].shape, name
        assert torch.equal(got[name], expected[name]), (name, (got[name] - expected[name]).abs().max())
    if family in GENERATIVE:
        prefix = inputs["gen_input_ids"].shape[1] if family == "decoder" else 1  # the prompt / the start token
        assert got["generate_cache"].shape == (2, prefix + 8)
        assert torch.equal(got["generate_cache"], got["generate_no_cache"])
        assert torch.equal(got["generate_cache"], expected["generate"])
    if family == "decoder":
        assert result["tokenizer_ids"] == tokenizer(TEXT[:60])["input_ids"]
        assert torch.equal(got["resaved"], expected["AutoModelForCausalLM"])
        assert (
            result["resaved_auto_map"]
            == json.loads((tmp_path / "decoder-AutoModelForCausalLM/config.json").read_text())["auto_map"]
        )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_exported_code_has_no_hfzoo_imports(family, tmp_path):
    config_class = FAMILIES[family]
    model_class = next(iter(AUTO_CLASSES[config_class].values()))
    export_for_remote_code(build_model(config_class, model_class, 0), tmp_path)
    py_files = sorted(tmp_path.glob("*.py"))
    assert {p.name for p in py_files} == set(family_source_files(config_class))
    assert "stack.py" in {p.name for p in py_files} and "configuration_utils.py" in {p.name for p in py_files}
    for path in py_files:
        text = path.read_text()
        assert not re.search(r"^\s*(import\s+hfzoo|from\s+hfzoo)\b", text, flags=re.MULTILINE), path.name
        assert not re.search(r"^\s*from\s+\.\.", text, flags=re.MULTILINE), path.name  # no multi-level imports
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "hfzoo" for a in node.names), path.name
            elif isinstance(node, ast.ImportFrom):
                assert node.level in (0, 1), path.name
                assert (node.module or "").split(".")[0] != "hfzoo", path.name
                if node.level == 1:
                    assert (tmp_path / f"{node.module}.py").is_file(), (path.name, node.module)


def test_family_files_follow_imports():
    decoder = family_source_files(HfzooDecoderConfig)
    assert decoder["modeling_decoder.py"] == "hfzoo.models.decoder.modeling_decoder"
    assert decoder["attention.py"] == "hfzoo.modules.attention"  # reached through modeling_utils and layer
    assert "modeling_encoder.py" not in decoder and "modeling_encoder_decoder.py" not in decoder
    assert all(module.startswith("hfzoo.") for module in decoder.values())
    flat = flatten_source("hfzoo.models.decoder.modeling_decoder")
    assert "from .stack import HfzooStack" in flat
    assert "from .embeddings import build_vocab_projection, tied_embedding_keys" in flat
    assert decoder["embeddings.py"] == "hfzoo.modules.embeddings"
    assert "from .configuration_decoder import HfzooDecoderConfig" in flat


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package `fakezoo` with two modules named `x.py` and a module importing from a package `__init__`."""
    root = tmp_path / "fakezoo"
    for sub in ("", "one", "two"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / "__init__.py").write_text("")
    (root / "one" / "x.py").write_text("A = 1\n")
    (root / "two" / "x.py").write_text("B = 2\n")
    (root / "one" / "collide.py").write_text("from .x import A\nfrom ..two.x import B\n")
    (root / "one" / "from_init.py").write_text("from ..two import x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m == "fakezoo" or m.startswith("fakezoo.")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    "module, message",
    [("fakezoo.one.collide", "would both be written as x.py"), ("fakezoo.one.from_init", "imports from the package")],
)
def test_family_files_fail_loudly(fake_package, monkeypatch, module, message):
    fake_config = type("FakeConfig", (), {"__module__": module})
    fake_model = type("FakeModel", (), {"__module__": module})
    monkeypatch.setitem(hfzoo.export.AUTO_CLASSES, fake_config, {AutoModelForCausalLM: fake_model})
    with pytest.raises(ExportError, match=message):
        family_source_files(fake_config)


def test_export_rejects_non_hfzoo_models(tmp_path):
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="not an hfzoo family"):
        export_for_remote_code(model, tmp_path / "gpt2")
    with pytest.raises(KeyError, match="not an hfzoo family"):
        family_source_files(GPT2Config)
    with pytest.raises(OSError, match="no config.json"):
        export_for_remote_code(str(tmp_path), tmp_path / "out")


def test_export_in_place_keeps_weights(tmp_path):
    model = build_model(HfzooEncoderConfig, hfzoo.HfzooEncoderForMaskedLM, 0)
    model.save_pretrained(tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    export_for_remote_code(str(tmp_path), tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"] == (
        "modeling_encoder.HfzooEncoderForMaskedLM"
    )
    assert (tmp_path / "modeling_encoder.py").is_file()
