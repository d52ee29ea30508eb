"""`pip install hfzoo` without extras gives working models: a clean venv with only the core requirements.

The clean venv (`clean_env.make_clean_venv`) sees a folder of links to the distributions that hfzoo's
requirements without extras pull in, recursively, as installed here (torch included); hfzoo itself is
built as a wheel from a copy of the checkout and installed into the venv with pip. There, `pip check`
must find every requirement satisfied, the training packages must be absent, and a saved decoder
checkpoint must load with `AutoModelForCausalLM.from_pretrained` and generate what it generates here.

The pip constraint files: constraints/lowest.txt is exactly what scripts/constraints.py generates from
pyproject.toml (each dependency at its lower bound); constraints/tested.txt pins a version inside the range
of every dependency, without local version labels.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch
from helpers import clean_env
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
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

    job = json.loads(open(sys.argv[1]).read())  # the job file (clean_env.run_clean)
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


@pytest.mark.compat
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


def load_constraints_script():
    """scripts/constraints.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("constraints_script", REPO_ROOT / "scripts" / "constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_pins(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    pins = {}
    for line in (line for line in lines if line and not line.startswith("#")):
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", line
        pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def test_lowest_constraints_are_generated_from_pyproject():
    constraints = load_constraints_script()
    expected = constraints.lowest()
    assert (REPO_ROOT / "constraints" / "lowest.txt").read_text(encoding="utf-8") == expected, (
        "constraints/lowest.txt differs from the lower bounds of pyproject.toml; regenerate it: "
        "python scripts/constraints.py lowest --write"
    )
    pins = read_pins(REPO_ROOT / "constraints" / "lowest.txt")
    requirements = constraints.pyproject_requirements()
    assert set(pins) == {canonicalize_name(r.name) for r in requirements}  # every dependency, every extra
    for requirement in requirements:
        pin = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pin, prereleases=True), (requirement, pin)
        assert any(s.operator == ">=" and s.version == pin for s in requirement.specifier), (requirement, pin)


def test_a_requirement_without_a_lower_bound_is_refused(tmp_path):
    constraints = load_constraints_script()
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["torch<3"]\n', encoding="utf-8")
    with pytest.raises(constraints.ConstraintError, match="torch<3 needs exactly one lower bound"):
        constraints.lowest(pyproject)
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["a>=1"]\n[project.optional-dependencies]\n'
                         'b = ["a>=2", "x[b]"]\n', encoding="utf-8")  # fmt: skip
    with pytest.raises(constraints.ConstraintError, match="a is listed with two lower bounds"):
        constraints.lowest(pyproject)


def test_tested_constraints_pin_public_versions_inside_the_ranges():
    constraints = load_constraints_script()
    pins = read_pins(REPO_ROOT / "constraints" / "tested.txt")
    assert not {"hfzoo", "pip", "setuptools"} & set(pins)
    assert all(Version(v).local is None for v in pins.values()), "local version labels (+cpu) are dropped"
    for requirement in constraints.pyproject_requirements():
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"constraints/tested.txt has no pin for {requirement.name}"
        assert requirement.specifier.contains(pin, prereleases=True), (requirement, pin)


def test_installed_mismatches_compare_public_versions(tmp_path):
    constraints = load_constraints_script()
    torch_version = Version(metadata.version("torch"))
    path = tmp_path / "pins.txt"
    path.write_text(f"# a comment\ntorch=={torch_version.public}\npytest==0.1\nno-such-package==1.0\n"
                    'psutil==0.1; python_version < "3"\n', encoding="utf-8")  # fmt: skip
    problems = constraints.installed_mismatches(path)
    assert [p.split(":")[0] for p in problems] == ["pytest", "no-such-package"], problems
    assert [p.split(":")[0] for p in constraints.installed_mismatches(path, ignore_missing=True)] == ["pytest"]


def test_python_floor_conflicts_name_a_pin_that_needs_a_newer_python(tmp_path):
    constraints = load_constraints_script()
    needs = metadata.metadata("transformers")["Requires-Python"]  # e.g. ">=3.11.0"
    (lowest_python,) = [Version(s.version) for s in SpecifierSet(needs) if s.operator == ">="]
    pins = tmp_path / "pins.txt"
    pins.write_text('transformers==5.23.0\nno-such-package==1.0\npytest==0.1; python_version < "3"\n', encoding="utf-8")
    pyproject = tmp_path / "pyproject.toml"
    older = f"{lowest_python.major}.{lowest_python.minor - 1}"
    pyproject.write_text(f'[project]\nname = "x"\nrequires-python = ">={older}"\n', encoding="utf-8")
    (problem,) = constraints.python_floor_conflicts(pins, pyproject)
    assert problem.startswith(f"transformers {metadata.version('transformers')} requires Python {needs}"), problem
    assert f"admits Python {older}" in problem
    pyproject.write_text(f'[project]\nname = "x"\nrequires-python = ">={lowest_python}"\n', encoding="utf-8")
    assert constraints.python_floor_conflicts(pins, pyproject) == []
    pyproject.write_text('[project]\nname = "x"\nrequires-python = "<4"\n', encoding="utf-8")
    with pytest.raises(constraints.ConstraintError, match="requires-python '<4' needs exactly one >= bound"):
        constraints.python_floor_conflicts(pins, pyproject)
