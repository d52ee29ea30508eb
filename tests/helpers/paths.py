"""Where the checkout and the real data are."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository's root folder.
REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """Return the real-data folder: $HFZOO_DATA_DIR, else `../shared/data` beside the checkout."""
    return Path(os.environ.get("HFZOO_DATA_DIR", REPO_ROOT.parent / "shared" / "data")).resolve()
