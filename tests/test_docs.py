"""Every dotted `hfzoo...` name the README and the docs mention can be imported as written."""

from __future__ import annotations

import importlib
import re
import warnings

import pytest
from helpers.paths import REPO_ROOT

from hfzoo.training import MOVED_MODULES

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"`(hfzoo(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def documented_names() -> list[str]:
    """The `hfzoo.x.y` names that open a code span in the documents, deduplicated, sorted."""
    return sorted({m.group(1) for doc in DOCUMENTS for m in NAME.finditer(doc.read_text())})


def resolve(name: str):
    """Import the longest module prefix of `name`, then look up the rest as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(name)


def test_the_documents_name_hfzoo_objects():
    assert len(documented_names()) > 30


@pytest.mark.parametrize("name", documented_names())
def test_a_documented_name_imports_without_a_deprecation(name):
    if name in MOVED_MODULES:  # the table of moved modules (docs/architecture.md); tests/training/test_moved_modules.py
        name = MOVED_MODULES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert resolve(name) is not None
