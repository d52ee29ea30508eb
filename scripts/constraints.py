"""The pip constraint files in constraints/: the lowest accepted versions and the tested versions.

`constraints/lowest.txt` pins every dependency of pyproject.toml (the core requirements and every extra)
to its declared lower bound; `pip install -c constraints/lowest.txt -e ".[dev]"` installs the oldest
versions hfzoo accepts. `constraints/tested.txt` pins every package of a virtualenv in which the whole
test suite passed (`bash scripts/test.sh` installs the newest versions the ranges allow, runs the suite
and compares the installed versions with this file); scripts/install.sh installs with it by default.

Usage (`--write` writes the file, `--check` prints the difference and exits with 1 where the file differs,
neither prints the file's expected text):

    python scripts/constraints.py lowest [--write | --check]   # from pyproject.toml
    python scripts/constraints.py tested [--write | --check]   # from the running Python's environment
    python scripts/constraints.py installed [--ignore-missing] FILE   # every pin of FILE is installed here
    python scripts/constraints.py python-floor FILE   # and runs on the lowest Python of requires-python

`tested` describes the environment of the Python that runs it: run it with the virtualenv's Python
(`.venv/bin/python scripts/constraints.py tested --write`) after the whole suite passed there. hfzoo
itself, pip and setuptools are left out, and local version labels are dropped (`2.13.0+cpu` is pinned as
`2.13.0`), so that the pin also admits the CUDA builds of the same release.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = REPO_ROOT / "pyproject.toml"
FILES = {"lowest": REPO_ROOT / "constraints" / "lowest.txt", "tested": REPO_ROOT / "constraints" / "tested.txt"}
#: Left out of tested.txt: the package under test and the installer's own tools.
NOT_PINNED = {"hfzoo", "pip", "setuptools"}

LOWEST_HEADER = """\
# The lowest versions hfzoo accepts: each dependency of pyproject.toml (core and every extra) at the
# lower bound of its range (their own dependencies are not pinned). Generated from pyproject.toml:
# python scripts/constraints.py lowest --write
# Used by bash scripts/test_lowest.sh; by hand: pip install -c constraints/lowest.txt -e ".[dev]"
"""
TESTED_HEADER = """\
# The versions the whole test suite last passed with; scripts/install.sh installs these by default.
# bash scripts/test.sh installs the newest versions the ranges of pyproject.toml allow and compares them
# with this file. Generated in the virtualenv of a passing run: .venv/bin/python scripts/constraints.py tested --write
"""


class ConstraintError(Exception):
    """pyproject.toml or the environment cannot give a constraint file (the message says why)."""


def lower_bound(requirement: Requirement) -> str:
    """The version a requirement's `>=` (or `==`, `~=`) specifier names; a requirement without one is an error."""
    bounds = [s.version for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    if len(bounds) != 1:
        raise ConstraintError(
            f"pyproject.toml: {requirement} needs exactly one lower bound (>=, == or ~=) to be pinned in "
            f"constraints/lowest.txt, found {len(bounds)}"
        )
    return bounds[0]


def pyproject_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """The requirements of `pyproject`: the core dependencies, then those of every extra.

    A self-reference such as `hfzoo[train]` (an extra that includes others) is left out.
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    own_name = canonicalize_name(project["name"])
    lists = [project.get("dependencies", []), *project.get("optional-dependencies", {}).values()]
    requirements = (Requirement(text) for texts in lists for text in texts)
    return [r for r in requirements if canonicalize_name(r.name) != own_name]


def lowest(pyproject: Path = PYPROJECT) -> str:
    """The text of constraints/lowest.txt: `name==lower bound` for every dependency of `pyproject`, sorted by name.

    The core dependencies and those of every extra are included. A package listed twice must have the
    same lower bound both times. An environment marker of the requirement is kept on its line.
    """
    pins: dict[str, str] = {}
    for requirement in pyproject_requirements(pyproject):
        name = canonicalize_name(requirement.name)
        pin = f"{name}=={lower_bound(requirement)}"
        if requirement.marker is not None:
            pin += f"; {requirement.marker}"
        if pins.get(name, pin) != pin:
            raise ConstraintError(f"pyproject.toml: {name} is listed with two lower bounds ({pins[name]}, {pin})")
        pins[name] = pin
    return LOWEST_HEADER + "".join(pins[name] + "\n" for name in sorted(pins))


def tested() -> str:
    """The text of constraints/tested.txt: `name==version` for every package installed in this environment.

    The environment is that of the running Python; it must have hfzoo installed (the virtualenv the
    tests ran in). hfzoo, pip and setuptools are left out; versions lose their local label (`+cpu`).
    """
    try:
        metadata.distribution("hfzoo")
    except metadata.PackageNotFoundError:
        raise ConstraintError(
            f"hfzoo is not installed for {sys.executable}: run this with the Python of the virtualenv the "
            "tests passed in (.venv/bin/python scripts/constraints.py tested)"
        ) from None
    pins: dict[str, str] = {}
    for dist in metadata.distributions():  # in sys.path order: the first of two copies is the one imported
        name = canonicalize_name(dist.metadata["Name"])
        if name not in NOT_PINNED and name not in pins:
            pins[name] = f"{name}=={Version(dist.version).public}"
    return TESTED_HEADER + "".join(pins[name] + "\n" for name in sorted(pins))


def _pins(path: Path) -> list[Requirement]:
    """The pins of the constraint file `path` whose environment marker applies here (comments left out)."""
    pins = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate():
                pins.append(requirement)
    return pins


def installed_mismatches(path: Path, ignore_missing: bool = False) -> list[str]:
    """Each pin of the constraint file `path` whose package is installed here at another version, or is missing.

    A missing package is no mismatch with `ignore_missing` (a constraint file may pin more than one
    extra installs). Versions are compared without their local label (`2.13.0+cpu` is `2.13.0`) and as versions
    (`6.0` is `6.0.0`); lines with an environment marker that does not apply here are skipped.
    """
    problems = []
    for requirement in _pins(path):
        (specifier,) = requirement.specifier
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            if not ignore_missing:
                problems.append(f"{requirement.name}: not installed, {path.name} pins {specifier.version}")
            continue
        if Version(Version(version).public) != Version(specifier.version):
            problems.append(f"{requirement.name}: {version} installed, {path.name} pins {specifier.version}")
    return problems


def python_floor(pyproject: Path = PYPROJECT) -> tuple[str, Version]:
    """The `requires-python` of `pyproject` and the lowest Python version it admits (its one `>=` bound).

    Raises:
        ConstraintError: `requires-python` is missing or has no single `>=` bound.
    """
    text = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"].get("requires-python", "")
    bounds = [s.version for s in SpecifierSet(text) if s.operator == ">="]
    if len(bounds) != 1:
        raise ConstraintError(f"pyproject.toml: requires-python {text!r} needs exactly one >= bound")
    return text, Version(bounds[0])


def python_floor_conflicts(path: Path, pyproject: Path = PYPROJECT) -> list[str]:
    """Each pin of `path` installed here whose release does not run on the lowest Python `pyproject` admits.

    Run where the pins are installed (the lowest versions: `scripts/test_lowest.sh`). A dependency whose
    lowest accepted release requires a newer Python than hfzoo's `requires-python` makes that Python's
    `pip install hfzoo` fail to resolve, however the Python running this check. Packages not installed here
    and releases without a `Requires-Python` are skipped.
    """
    text, floor = python_floor(pyproject)
    problems = []
    for requirement in _pins(path):
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        needs = dist.metadata.get("Requires-Python")
        if needs and not SpecifierSet(needs).contains(floor, prereleases=True):
            problems.append(
                f"{requirement.name} {dist.version} requires Python {needs}; pyproject.toml's requires-python "
                f"{text!r} admits Python {floor}"
            )
    return problems


def refresh_command(kind: str) -> str:
    """The command that rewrites the constraint file `kind`."""
    if kind == "lowest":
        return "python scripts/constraints.py lowest --write"
    return ".venv/bin/python scripts/constraints.py tested --write   (in the virtualenv the whole suite passed in)"


def check(kind: str, expected: str) -> int:
    """Compare constraints/<kind>.txt with `expected`: 0 when equal, else print the difference and return 1."""
    path = FILES[kind]
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if current == expected:
        print(f"{path.relative_to(REPO_ROOT)} is up to date")
        return 0
    name = str(path.relative_to(REPO_ROOT))
    diff = difflib.unified_diff(current.splitlines(True), expected.splitlines(True), name, f"{name} (expected)")
    sys.stdout.writelines(diff)
    if kind == "tested":
        print(f"\nThe installed versions differ from {name}. If the whole suite passed with them, record them:")
    else:
        print(f"\n{name} does not match the lower bounds of pyproject.toml. Regenerate it:")
    print(f"    {refresh_command(kind)}")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for kind, help_text in (("lowest", "from pyproject.toml"), ("tested", "from this Python's environment")):
        command = commands.add_parser(kind, help=f"constraints/{kind}.txt {help_text}")
        mode = command.add_mutually_exclusive_group()
        mode.add_argument("--write", action="store_true", help=f"write constraints/{kind}.txt")
        mode.add_argument("--check", action="store_true", help=f"exit with 1 where constraints/{kind}.txt differs")
    installed = commands.add_parser("installed", help="check that every pin of a constraint file is installed here")
    installed.add_argument("file", type=Path)
    installed.add_argument(
        "--ignore-missing", action="store_true", help="only report pins installed at another version"
    )
    floor = commands.add_parser(
        "python-floor", help="check that every pin of a constraint file installed here runs on the lowest Python"
    )
    floor.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "installed":
            problems = installed_mismatches(args.file, args.ignore_missing)
            for problem in problems:
                print(problem)
            if not problems:
                print(f"every pin of {args.file} is installed")
            return 1 if problems else 0
        if args.command == "python-floor":
            problems = python_floor_conflicts(args.file)
            for problem in problems:
                print(problem)
            if not problems:
                print(f"every pin of {args.file} installed here runs on Python {python_floor()[1]}")
            return 1 if problems else 0
        expected = lowest() if args.command == "lowest" else tested()
    except (ConstraintError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        return check(args.command, expected)
    if args.write:
        FILES[args.command].parent.mkdir(exist_ok=True)
        FILES[args.command].write_text(expected, encoding="utf-8")
        print(f"wrote {FILES[args.command].relative_to(REPO_ROOT)}")
    else:
        sys.stdout.write(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
