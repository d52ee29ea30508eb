"""The module paths of the training code before the jobs had folders still work, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from hfzoo.training import MOVED_MODULES

#: Run in a fresh interpreter (importing the moved modules again here would give this process two copies).
CHECK_SCRIPT = """
import importlib, json, sys, warnings
from hfzoo.training import MOVED_MODULES

results = {}
for old, new in sorted(MOVED_MODULES.items()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(f"import {old} as module", namespace := {})
        package, _, child = old.rpartition(".")
        del sys.modules[old]
        delattr(sys.modules[package], child)
        exec(f"from {package} import {child} as again", namespace)
    results[old] = {
        "same": namespace["module"] is importlib.import_module(new) is namespace["again"],
        "warnings": [(str(w.message), w.category.__name__, w.filename) for w in caught],
    }
print(json.dumps(results))
"""


def test_an_old_path_imports_the_moved_module_with_a_warning():
    out = subprocess.run([sys.executable, "-c", CHECK_SCRIPT], capture_output=True, text=True, check=True).stdout
    results = json.loads(out)
    assert set(results) == set(MOVED_MODULES)
    for old, new in MOVED_MODULES.items():
        assert results[old]["same"], old
        moved = [w for w in results[old]["warnings"] if f"{old} moved to {new}" in w[0]]
        # `import old` and `from package import child` each warn once, attributed to the importing line
        assert [(category, filename) for _, category, filename in moved] == [("DeprecationWarning", "<string>")] * 2


def test_python_m_under_an_old_name_runs_the_command():
    proc = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "hfzoo.training.study", "--help"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: hfzoo-study")
    assert "hfzoo.training.study moved to hfzoo.study.runner" in proc.stderr
    assert "RuntimeWarning" not in proc.stderr


def test_a_name_that_never_existed_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hfzoo.training.no_such_module")
