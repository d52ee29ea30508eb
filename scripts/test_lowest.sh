#!/usr/bin/env bash
# Install hfzoo with its dev extra at the lowest versions it accepts (constraints/lowest.txt: each dependency
# of pyproject.toml at its lower bound) into .venv-lowest, and run the compatibility subset of the tests
# there (the tests marked `compat`; pytest arguments are passed on). CI runs this after scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
HFZOO_VENV=.venv-lowest HFZOO_CONSTRAINTS=constraints/lowest.txt bash scripts/install.sh dev
. .venv-lowest/bin/activate
python scripts/constraints.py lowest --check  # the file states the lower bounds of pyproject.toml
python scripts/constraints.py installed constraints/lowest.txt  # and they are what is installed (torch too)
python -m pytest -q -p no:cacheprovider -m compat tests "$@"
