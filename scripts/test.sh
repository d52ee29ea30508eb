#!/usr/bin/env bash
# Install hfzoo with its dev extra into .venv and run the whole test suite (what CI runs).
# Real data is read from $HFZOO_DATA_DIR, default ../shared/data beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
. .venv/bin/activate
ruff check .
python -m pytest -q -p no:cacheprovider tests "$@"
