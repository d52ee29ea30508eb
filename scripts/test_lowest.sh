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
python scripts/constraints.py python-floor constraints/lowest.txt  # and run on pyproject's lowest Python
# The remote-code export test also loads the exports made here (the lowest transformers) with the newest
# one, in .venv (scripts/test.sh), and those made there with the lowest one here.
other_release() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ -x .venv/bin/python ]; then
    export HFZOO_OTHER_RELEASE_SITE_PACKAGES=$(other_release .venv)
fi
python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder -m compat tests "$@"
if [ -x .venv/bin/python ]; then
    HFZOO_OTHER_RELEASE_SITE_PACKAGES=$(other_release .venv-lowest) \
        .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_export.py -k other "$@"
fi
