"""Refusing an unknown name: the closest known names (`difflib`), not the whole list on one line.

Used wherever a value must be one of a set of names: config choice fields (`hidden_act`, `norm_type`, ...),
study rows, model families, GLUE tasks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: A list of at most this many names is shown whole; a longer one only by its closest matches.
SHOWN_WHOLE = 12


def closest_matches(value: object, choices: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to `value` (`difflib.get_close_matches`, case-insensitive), best first.

    Args:
        value: the unknown value (anything; compared as its `str`).
        choices: the known names.
        n: at most this many matches.

    Returns:
        Up to `n` names of `choices` (in their own spelling); empty when none is close (a `difflib` ratio
        below 0.6 to the whole name, and below 0.8 to its start).
    """
    names = list(choices)
    by_lower: dict[str, str] = {}
    for name in names:
        by_lower.setdefault(str(name).lower(), name)
    wanted = str(value).lower()
    matches = difflib.get_close_matches(wanted, list(by_lower), n=n, cutoff=0.6)
    if not matches and wanted:  # a misspelt start of a longer name ("Vanila" for "Vanilla Transformer")
        ratios = {name: difflib.SequenceMatcher(None, wanted, name[: len(wanted)]).ratio() for name in by_lower}
        matches = sorted((name for name, r in ratios.items() if r >= 0.8), key=lambda name: -ratios[name])[:n]
    return [by_lower[match] for match in matches]


def choice_hint(value: object, choices: Iterable[str], listed_in: str | None = None) -> str:
    """What to say about an unknown `value`: the whole list when it is short, else only its closest names.

    Args:
        value: the unknown value.
        choices: the known names.
        listed_in: where a long list of names can be read (e.g. `"hfzoo.models.modern.STUDY_ROWS"`).

    Returns:
        One line. At most `SHOWN_WHOLE` names: `"choose one of ['gelu', 'relu']"`, followed by
        `"; did you mean 'gelu'?"` when a name is close. More: `"did you mean 'SwiGLU'? (59 choices, listed
        in ...)"`, or `"none of the 59 choices is close (listed in ...)"`.
    """
    names = list(choices)
    matches = " or ".join(repr(m) for m in closest_matches(value, names))
    if len(names) <= SHOWN_WHOLE:
        return f"choose one of {names}" + (f"; did you mean {matches}?" if matches else "")
    where = f", listed in {listed_in}" if listed_in else ""
    if matches:
        return f"did you mean {matches}? ({len(names)} choices{where})"
    return f"none of the {len(names)} choices is close ({where.removeprefix(', ') or 'see the documentation'})"
