"""YAML given by users (study files, `--config` files, launch configs, mappings on the command line), read in one line.

PyYAML's errors span several lines (the offending text and a caret under it); the commands refuse bad input in
one line, so a parse error is refused as `SOURCE: not valid YAML (PROBLEM at line L, column C)`.
"""

from __future__ import annotations

from typing import Any

import yaml


def load_yaml(text: str, source: str) -> Any:
    """Parse `text` with `yaml.safe_load`; a syntax error becomes one line naming `source` and where it is.

    Args:
        text: the YAML (a file's content, or a value given on the command line).
        source: what it came from, for the message (`--study narang.yaml`, `--lr_scheduler_kwargs`).

    Returns:
        The parsed value (None for empty text).

    Raises:
        ValueError: `SOURCE: not valid YAML (expected ',' or ']', but got ':' at line 2, column 5)`.
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML ({yaml_problem(err)})") from None


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: its problem and where (line and column, counted from 1), without the excerpt."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None:
        return " ".join(str(err).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
