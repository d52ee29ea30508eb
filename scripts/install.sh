#!/usr/bin/env bash
# Create .venv (if missing) and install hfzoo into it with the CPU build of torch.
# Usage: bash scripts/install.sh [extra]   default `train` (the recipes); `dev` = train + DeepSpeed + test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
# On a GPU machine, install the torch build for your CUDA version before running this script.
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[${1:-train}]"
