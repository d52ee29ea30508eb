#!/usr/bin/env bash
# Install hfzoo with its dev extra into .venv and run the whole test suite (what CI runs).
# The newest versions the ranges of pyproject.toml allow are installed (not constraints/tested.txt). Once
# every test passed, the installed versions are compared with constraints/tested.txt: where they differ,
# the difference and the command that records the new versions are printed, and the script fails.
# Real data is read from $HFZOO_DATA_DIR, default ../shared/data beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
HFZOO_CONSTRAINTS=none bash scripts/install.sh dev
. .venv/bin/activate
ruff check .
# one pytest-xdist worker per core, each with its share of the cores' threads (tests/conftest.py sets torch's
# threads and OMP_NUM_THREADS, which the processes a test starts inherit); each test file runs whole on one worker
# (its module fixtures are built once), in collection order (tests/conftest.py puts the files holding slow tests first)
python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder tests "$@"
python scripts/constraints.py tested --check
