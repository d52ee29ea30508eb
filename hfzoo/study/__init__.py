"""The study job: Narang et al. 2021's comparison of modifications, `hfzoo-study` (`python -m hfzoo.study`).

Modules, each importing only those listed above it:

- `protocol.py`: what every run measures and what the report compares against.
- `settings.py`: the study file's keys, how they are read and typed, and its paths.
- `storage.py`: the study folder's shared files: names, atomic JSON, locks.
- `configs.py`: each row's model config in the study's family, its parameters.
- `arguments.py`: a run's `hfzoo-pretrain` and `hfzoo-finetune-glue` arguments.
- `runs.py`: the run folders, what each trains (`run.json`) and their records.
- `processes.py`: child processes (recipe stages, helper study processes) and signals.
- `ladder.py`: the scale ladder: its settings, plan, and one run's budgets (warmup-stable-decay branches).
- `checks.py`: the settings' checks before anything is trained.
- `fingerprints.py`: the study a folder holds (`study.json`): settings and data fingerprints.
- `preparation.py`: the tokenizer, tokenized data and GLUE subsets, prepared once.
- `timing.py`: where a run's and the study's wall time went.
- `execution.py`: one run: pretraining, then GLUE, then its record.
- `parallel.py`: `--parallel_runs auto`: how many study processes fit.
- `summary.py`: statistics over the runs: means, spreads, significance, agreement with the paper.
- `scaling.py`: scaling-law fits over model sizes and token budgets (compute laws, Chinchilla's L(N, D)),
  their bootstrap intervals and extrapolated rankings (imports nothing of this package).
- `ladder_fits.py`: the scale ladder's numbers: its cells, compute laws, Chinchilla's L(N, D), held-out checks,
  extrapolation to the paper's compute, advantages over vanilla.
- `tables.py`: the Markdown tables of `results.md`.
- `report.py`: `results.json`, `results.md` and the plots.
- `ladder_report.py`: the scale ladder's `ladder.json`, `ladder.md` and plots.
- `runner.py`: the `hfzoo-study` command: runs the plan (resume, locks, parallel processes), then the report.
"""

import importlib

#: Public name -> `module` of this package (or `module:attribute`) that defines it.
_EXPORTS = {
    "BootstrapResult": "scaling",
    "ChinchillaFit": "scaling",
    "ComputeLawFit": "scaling",
    "FitNotConverged": "scaling",
    "HoldoutSelection": "scaling",
    "StudySettings": "settings",
    "bootstrap": "scaling",
    "cli": "runner",
    "fit_chinchilla": "scaling",
    "fit_compute_law": "scaling",
    "load_settings": "settings",
    "main": "runner",
    "ranking_spearman": "scaling",
    "run_study": "runner",
    "select_by_holdout": "scaling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import a public name on first use (so `python -m hfzoo.study.<module>` runs that module only once)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
