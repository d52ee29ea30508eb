"""`pip install hfzoo` without extras gives working models: a clean venv with only the core requirements.

The clean venv (`clean_env.make_clean_venv`) sees a folder of links to the distributions that hfzoo's
requirements without extras pull in, recursively, as installed here (torch included); hfzoo itself is
built as a wheel from a copy of the checkout and installed into the venv with pip. There, `pip check`
must find every requirement satisfied, the training packages must be absent, and a saved decoder
checkpoint must load with `AutoModelForCausalLM.from_pretrained` and generate what it generates here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import clean_env
import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from transformers import AutoModelForCausalLM, AutoTokenizer

import hfzoo  # noqa: F401
from hfzoo.models.presets import build_config
from hfzoo.tokenization import train_bpe_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Installed with the `train` extra only: `import hfzoo` must not need them.
TRAINING_ONLY = ("datasets", "accelerate", "peft", "evaluate", "sklearn", "matplotlib")
PROMPT = "It was the best of times"

CLEAN_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys

    job = json.loads(sys.argv[1])
    result = {"absent": [m for m in job["training_only"] if importlib.util.find_spec(m) is None]}
    import hfzoo
    result["hfzoo_file"] = hfzoo.__file__
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(job["checkpoint"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(job["checkpoint"])
    inputs = tokenizer(job["prompt"], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    result["class"] = type(model).__name__
    result["generated"] = output[0].tolist()
    result["text"] = tokenizer.decode(output[0], skip_special_tokens=True)
    result["loaded"] = sorted({m.split(".")[0] for m in sys.modules} & set(job["training_only"]))
    print("RESULT " + json.dumps(result))
    """
)


def core_distributions() -> dict[str, metadata.Distribution]:
    """The installed distributions that hfzoo's requirements without extras need, recursively (hfzoo excluded)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in metadata.requires("hfzoo")]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or one for another platform / Python
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found[name] = metadata.distribution(requirement.name)
        todo.extend(Requirement(r) for r in found[name].requires or [])
    return found


def link_site(distributions: dict[str, metadata.Distribution], folder: Path) -> Path:
    """A folder of links to the top-level files of `distributions` (packages, modules, .dist-info)."""
    folder.mkdir()
    for dist in distributions.values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".." and not f.name.endswith(".pth")}:
            if not (folder / top).exists():
                (folder / top).symlink_to(Path(dist.locate_file(top)))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("decoder")
    tokenizer = train_bpe_tokenizer([[f"{PROMPT}, it was the worst of times. " * 30]], vocab_size=280)
    config = build_config("decoder-tiny", "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64",
                          vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_core_install_imports_loads_and_generates_without_training_packages(checkpoint, tmp_path):
    core = core_distributions()
    assert {"torch", "transformers", "safetensors", "huggingface-hub"} <= set(core)
    assert not {canonicalize_name(m) for m in ("datasets", "accelerate", "peft", "evaluate", "scikit-learn")} & set(
        core
    )

    source = tmp_path / "src"  # a copy, so that the build leaves no build/ or egg-info in the checkout
    shutil.copytree(REPO_ROOT / "hfzoo", source / "hfzoo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
                    str(tmp_path / "wheels"), str(source)], check=True, capture_output=True)  # fmt: skip
    python = clean_env.make_clean_venv(tmp_path / "venv", [link_site(core, tmp_path / "core_site")])
    (wheel,) = (tmp_path / "wheels").glob("hfzoo-*.whl")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    check = subprocess.run([*pip, "--python", str(python), "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # every core requirement there, in its range

    workdir = tmp_path / "work"
    workdir.mkdir()
    job = {"checkpoint": str(checkpoint), "prompt": PROMPT, "training_only": list(TRAINING_ONLY)}
    result = clean_env.run_clean(python, CLEAN_SCRIPT, job, workdir)
    assert result["absent"] == list(TRAINING_ONLY) and result["loaded"] == []
    assert Path(result["hfzoo_file"]).is_relative_to(tmp_path / "venv")  # the installed wheel, not the checkout
    assert result["class"] == "HfzooDecoderForCausalLM"

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    with torch.no_grad():
        expected = model.generate(**tokenizer(PROMPT, return_tensors="pt"), max_new_tokens=8, min_new_tokens=8,
                                  do_sample=False)  # fmt: skip
    assert result["generated"] == expected[0].tolist() and result["text"].startswith(PROMPT)
