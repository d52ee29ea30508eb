"""Clean Python environments for tests: a `venv --without-pip` that sees only the package folders it is given.

The folders are added to the venv's `sys.path` through a `.pth` file. Paths listed in a `.pth` are put on
`sys.path`, but the `.pth` files inside them are not processed, so hfzoo's editable-install hook of this
venv is not active there and `import hfzoo` fails unless hfzoo is installed into the clean venv itself.
Scripts run outside the repository, with `-s` and an environment without PYTHON* variables, the hub
offline, and print one `RESULT {json}` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_clean_venv(root: Path, site_dirs: Iterable[Path]) -> Path:
    """Create a `venv --without-pip` in `root` whose package paths are its own and `site_dirs`; return its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    (purelib(python) / "parent_site_packages.pth").write_text("".join(f"{d}\n" for d in site_dirs))
    return python


def purelib(python: Path) -> Path:
    """The site-packages folder of the interpreter `python`."""
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )


def run_clean(python: Path, script_text: str, job: dict, workdir: Path, timeout: int = 300) -> dict:
    """Run `script_text` in the clean interpreter with the path of a file holding `json.dumps(job)` as its argument.

    The job travels in a file: the whole variant table's job is longer than one command-line argument may be
    (Linux's 128 KiB `MAX_ARG_STRLEN`). Returns the script's RESULT.
    """
    script = workdir / "clean_env_script.py"
    script.write_text(script_text)
    job_file = workdir / "clean_env_job.json"
    job_file.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update(
        HF_HOME=str(workdir / "hf_home"),  # fresh transformers_modules cache
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TOKENIZERS_PARALLELISM="false",
    )
    assert REPO_ROOT not in workdir.resolve().parents
    proc = subprocess.run(
        [str(python), "-s", str(script), str(job_file)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,  # a prompt (trust_remote_code) must fail, never wait
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-5000:]
    return json.loads(lines[0].removeprefix("RESULT "))
