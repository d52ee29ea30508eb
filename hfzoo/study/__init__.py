"""The study job: Narang et al. 2021's comparison of modifications, `hfzoo-study` (`python -m hfzoo.study`).

- `runner.py`: the study file, the runs (pretraining then GLUE per variant and seed), locks and resume.
- `protocol.py`: what every run measures and what the report compares against.
- `report.py`: `results.json`, `results.md` (Table 1 beside the paper's rows), statistics and plots.
"""

import importlib

#: Public name -> `module` of this package (or `module:attribute`) that defines it.
_EXPORTS = {
    "StudySettings": "runner",
    "cli": "runner",
    "load_settings": "runner",
    "main": "runner",
    "run_study": "runner",
}

__all__ = ["StudySettings", "cli", "load_settings", "main", "run_study"]


def __getattr__(name: str):
    """Import a public name on first use (so `python -m hfzoo.study.<module>` runs that module only once)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
