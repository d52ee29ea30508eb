"""The package's layers: imports run one way (modules -> models -> training core -> jobs), with no cycles.

The import graph is read from the source (every `import` and `from ... import`, local and `TYPE_CHECKING`
imports included), so a cycle hidden in a function body fails here too. The rules are checked on
synthetic packages first, so that a broken checker cannot pass the real package silently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hfzoo

#: Each top-level part of `hfzoo` and its layer: a module may import its own layer and the layers below.
#: Layer 4 holds the jobs users run; one job uses another only through its package's public names.
LAYERS = {
    "choices": 0,
    "compat": 0,
    "integrity": 0,
    "outputs": 0,
    "yaml_input": 0,
    "tokenization": 0,
    "data": 0,
    "metrics": 0,
    "modules": 1,
    "": 2,  # hfzoo/__init__.py: the public API, registers the models with the Auto classes
    "configuration_utils": 2,
    "modeling_utils": 2,
    "models": 2,
    "hub": 2,
    "export": 2,
    "pipelines": 2,
    "convert": 2,
    "training": 3,
    "pretraining": 4,
    "finetuning": 4,
    "study": 4,
}
JOBS = {"pretraining", "finetuning", "study"}


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under `root` (a folder named `package`), dotted name -> file."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (a name imported from a package counts as the
    package unless it is a submodule)."""
    modules = module_names(root, package)
    graph = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.add(submodule if submodule in modules else source)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (each as a path that ends where it starts), found by depth-first search."""
    cycles, state, path = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def layer_violations(graph: dict[str, set[str]], package: str, layers: dict[str, int], jobs: set[str]) -> list[str]:
    """Imports that run up the layers, or into another job's internals (one line each)."""

    def part(module: str) -> str:
        return module[len(package) + 1 :].split(".")[0] if module != package else ""

    problems = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = part(source), part(target)
            if a not in layers or b not in layers:
                problems.append(f"{source} -> {target}: {a or b!r} has no layer")
            elif layers[b] > layers[a]:
                problems.append(f"{source} -> {target}: layer {layers[a]} ({a!r}) imports layer {layers[b]} ({b!r})")
            elif a in jobs and b in jobs and a != b and target != f"{package}.{b}":
                problems.append(f"{source} -> {target}: a job imports another job's internals (use {package}.{b})")
    return problems


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A synthetic package `pkg` under `root`: relative path -> source."""
    for relative, source in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


SYNTHETIC_LAYERS = {"": 2, "modules": 1, "models": 2, "training": 3, "pretraining": 4, "study": 4}
SYNTHETIC_JOBS = {"pretraining", "study"}
CLEAN = {
    "__init__.py": "from .models import net\n",
    "modules/__init__.py": "",
    "modules/attention.py": "import math\n",
    "modules/mixers.py": "from .attention import math\n",
    "models/__init__.py": "",
    "models/net.py": "from ..modules.mixers import math\n",
    "training/__init__.py": "",
    "training/core.py": "from ..models import net\n",
    "pretraining/__init__.py": "from .loop import main\n",
    "pretraining/loop.py": "from ..training import core\n\ndef main():\n    pass\n",
    "study/__init__.py": "",
    "study/runner.py": "from ..pretraining import main\n",
}


def test_a_clean_synthetic_package_passes(tmp_path):
    graph = import_graph(write_package(tmp_path, CLEAN), "pkg")
    assert graph["pkg.study.runner"] == {"pkg.pretraining"}  # a name from a package is an edge to the package
    assert find_cycles(graph) == []
    assert layer_violations(graph, "pkg", SYNTHETIC_LAYERS, SYNTHETIC_JOBS) == []


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"modules/attention.py": "def f():\n    from .mixers import math\n"}, "cycle"),  # a local import
        ({"modules/attention.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import mixers\n"}, "cycle"),
        ({"modules/attention.py": "from ..models import net\n"}, "layer 1 ('modules') imports layer 2 ('models')"),
        ({"training/core.py": "from ..pretraining.loop import main\n"}, "layer 3 ('training') imports layer 4"),
        ({"study/runner.py": "from ..pretraining.loop import main\n"}, "another job's internals"),
        ({"study/runner.py": "import pkg.pretraining.loop\n"}, "another job's internals"),
        ({"models/net.py": "from ..modules.mixers import math\nfrom .. import net\n"}, "cycle"),
    ],
    ids=["local-cycle", "type-checking-cycle", "modules-import-models", "core-imports-job", "job-internals",
         "absolute-job-internals", "package-cycle"],
)  # fmt: skip
def test_the_checker_finds_cycles_and_upward_imports(tmp_path, change, expected):
    graph = import_graph(write_package(tmp_path, {**CLEAN, **change}), "pkg")
    cycles = find_cycles(graph)
    problems = layer_violations(graph, "pkg", SYNTHETIC_LAYERS, SYNTHETIC_JOBS)
    if expected == "cycle":
        assert cycles, graph
    else:
        assert any(expected in p for p in problems), problems


def test_hfzoo_has_no_import_cycle():
    graph = import_graph(Path(hfzoo.__file__).parent, "hfzoo")
    assert len(graph) > 50  # the whole package was read
    assert find_cycles(graph) == []


def test_hfzoo_imports_run_down_the_layers():
    root = Path(hfzoo.__file__).parent
    parts = {path.name.removesuffix(".py") for path in root.iterdir() if path.suffix == ".py" or path.is_dir()}
    parts -= {"__init__", "__pycache__"}
    assert parts <= set(LAYERS), f"give each new top-level part a layer: {sorted(parts - set(LAYERS))}"
    assert layer_violations(import_graph(root, "hfzoo"), "hfzoo", LAYERS, JOBS) == []


TRAINING_LIBRARIES = ("accelerate", "deepspeed", "peft")


def test_below_the_training_core_no_module_imports_a_training_library():
    root = Path(hfzoo.__file__).parent
    found = []
    for name, path in module_names(root, "hfzoo").items():
        if LAYERS[name.split(".")[1] if "." in name else ""] >= LAYERS["training"]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            found += [f"{name}: {m}" for m in imported if m.split(".")[0] in TRAINING_LIBRARIES]
    assert found == []


def test_importing_hfzoo_loads_no_training_code():
    """`import hfzoo` loads none of the training core or the jobs, nor PEFT or DeepSpeed, and accelerate only if
    transformers' own model code imports it (it does when accelerate is installed; without the `train` extra see
    `test_packaging.py`)."""
    accelerate = "print('accelerate' in sys.modules)"
    code = (
        "import sys, hfzoo\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('deepspeed', 'peft') or m.split('.')[:2] in "
        "(['hfzoo', 'training'], ['hfzoo', 'pretraining'], ['hfzoo', 'finetuning'], ['hfzoo', 'study'])))\n"
        + accelerate
    )
    baseline = "import sys, transformers.modeling_utils, transformers.generation\n" + accelerate
    out, transformers_only = (
        subprocess.run([sys.executable, "-c", c], capture_output=True, text=True, check=True).stdout.splitlines()
        for c in (code, baseline)
    )
    assert out[-2:] == ["[]", transformers_only[-1]]
    assert hfzoo.__version__
