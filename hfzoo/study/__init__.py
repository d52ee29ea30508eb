"""The study job: Narang et al. 2021's comparison of modifications, `hfzoo-study` (`python -m hfzoo.study`).

- `runner.py`: the study file, the runs (pretraining then GLUE per variant and seed), locks and resume.
- `protocol.py`: what every run measures and what the report compares against.
- `report.py`: `results.json`, `results.md` (Table 1 beside the paper's rows), statistics and plots.
"""

from .runner import StudySettings, cli, load_settings, main, run_study

__all__ = ["StudySettings", "cli", "load_settings", "main", "run_study"]
