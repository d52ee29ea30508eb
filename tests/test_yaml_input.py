"""YAML from users is refused in one line where it does not parse: study files, `--config` files, launch configs and
mappings on the command line (PyYAML's own message spans several lines, with an excerpt and a caret)."""

from __future__ import annotations

import pytest
from helpers.paths import REPO_ROOT

from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.study.runner import main as study
from hfzoo.training.launch_config import LaunchConfigError, check_launch_config
from hfzoo.yaml_input import load_yaml

BROKEN = "variants: [a, b\nseeds: 1\n"  # an unclosed flow sequence
PROBLEM = "expected ',' or ']', but got ':' at line 2, column 6"


def test_load_yaml_names_the_source_and_where_the_problem_is():
    assert load_yaml("a: [1, 2]\n", "x") == {"a": [1, 2]} and load_yaml("", "x") is None
    with pytest.raises(ValueError) as excinfo:
        load_yaml(BROKEN, "--study s.yaml")
    assert str(excinfo.value) == f"--study s.yaml: not valid YAML ({PROBLEM})"


def test_every_yaml_the_commands_read_is_refused_in_one_line(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN)
    with pytest.raises(SystemExit) as excinfo:
        study(["--study", str(broken), "--output_dir", str(tmp_path / "out")])
    assert str(excinfo.value) == f"error: --study {broken}: not valid YAML ({PROBLEM})"
    with pytest.raises(SystemExit) as excinfo:
        study(["--study", str(REPO_ROOT / "recipes/studies/narang_small.yaml"), "--output_dir",
               str(tmp_path / "out"), "--lr_scheduler_kwargs", "{min_lr_rate: 0.1"])  # fmt: skip
    assert str(excinfo.value).startswith("error: --lr_scheduler_kwargs: not valid YAML (expected ',' or '}', but got ")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=rf"^--config {broken}: not valid YAML \({PROBLEM}\)$"):
        parse_pretrain_args(["--config", str(broken), "--output_dir", str(tmp_path / "run")])
    with pytest.raises(LaunchConfigError, match=rf"^{broken}: not YAML \({PROBLEM}\)$"):
        check_launch_config(broken)
