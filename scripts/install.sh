#!/usr/bin/env bash
# Create .venv (if missing) and install hfzoo into it with the CPU build of torch.
# Usage: bash scripts/install.sh [extra]   default `train` (the recipes); `dev` = train + DeepSpeed + test tools.
#
# Which versions, from the environment variable HFZOO_CONSTRAINTS (a pip constraint file):
#   unset       constraints/tested.txt: the versions the whole test suite last passed with
#   none        the newest versions the ranges in pyproject.toml allow
#   a path      that constraint file, e.g. constraints/lowest.txt (the lowest versions hfzoo accepts)
# HFZOO_VENV names another virtualenv folder (default .venv). An existing virtualenv is brought to the chosen
# versions (upgraded or downgraded); the torch build already installed in it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HFZOO_VENV:-.venv}
constraints=${HFZOO_CONSTRAINTS:-constraints/tested.txt}
if [ "$constraints" != none ] && [ ! -f "$constraints" ]; then
    echo "scripts/install.sh: HFZOO_CONSTRAINTS=$constraints is not a file (give a constraint file, or none)" >&2
    exit 2
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
# On a GPU machine, install the torch build for your CUDA version before running this script.
torch_version=2.13.0
if [ "$constraints" != none ]; then
    pinned=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' "$constraints")
    torch_version=${pinned:-$torch_version}
fi
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==$torch_version"
# The installed torch build stays (pinned with its local label, e.g. +cpu); everything else follows the
# constraint file, or is the newest version in range (eager upgrade) without one.
pins="$venv/hfzoo-constraints.txt"
{
    echo "torch==$(python -c 'from importlib.metadata import version; print(version("torch"))')"
    [ "$constraints" = none ] || grep -v '^torch==' "$constraints"
} >"$pins"
python -m pip install -q --upgrade --upgrade-strategy eager -c "$pins" -e ".[${1:-train}]"
if [ "$constraints" != none ] && ! report=$(python scripts/constraints.py installed --ignore-missing "$constraints"); then
    echo "$report" >&2
    echo "scripts/install.sh: kept the torch build installed in $venv; $constraints pins another version" >&2
fi
