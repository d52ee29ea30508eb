"""Files replaced atomically (`hfzoo.outputs.replaced_atomically`): never torn, never lost to another writer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hfzoo.outputs
from hfzoo.outputs import replaced_atomically, write_json_atomic, write_text_atomic


def test_a_replaced_file_holds_the_new_text_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    write_json_atomic(path, {"accuracy": 0.5})
    assert json.loads(path.read_text()) == {"accuracy": 0.5} and path.read_text().endswith("\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_block_that_fails_leaves_the_file_as_it_was_and_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="plot failed"), replaced_atomically(path) as tmp:
        tmp.write_text("half writ")
        raise RuntimeError("plot failed")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


#: Loads `hfzoo/outputs.py` by its path (argv[4]; it needs only the standard library, not `import hfzoo`'s seconds of
#: imports), says it is ready (`<argv[3]>.<argv[2]>`), and once argv[3] exists writes argv[2] to argv[1] 300 times.
_WRITER = """
import importlib.util, pathlib, sys, time
spec = importlib.util.spec_from_file_location("outputs", sys.argv[4])
outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(outputs)
start = pathlib.Path(sys.argv[3])
pathlib.Path(f"{start}.{sys.argv[2]}").touch()
while not start.exists():
    time.sleep(0.001)
for _ in range(300):
    outputs.write_text_atomic(sys.argv[1], sys.argv[2] * 1000)
"""


def test_two_processes_replacing_one_file_never_lose_a_write_or_tear_it(tmp_path):
    """Each writer renames its own temporary file: neither finds its file renamed away by the other (an error),
    and the file always holds one writer's whole text."""
    path, start = tmp_path / "results.json", tmp_path / "start"
    write_text_atomic(path, "a" * 1000)
    command = [sys.executable, "-c", _WRITER, str(path)]
    writers = [
        subprocess.Popen([*command, text, str(start), hfzoo.outputs.__file__], stderr=subprocess.PIPE, text=True)
        for text in "ab"
    ]
    while not all(Path(f"{start}.{text}").exists() for text in "ab"):
        assert all(w.poll() is None for w in writers), [w.stderr.read() for w in writers]
        time.sleep(0.01)
    start.touch()
    seen = set()
    while any(w.poll() is None for w in writers):
        seen.add(path.read_text())
    errors = [w.stderr.read() for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert seen <= {"a" * 1000, "b" * 1000} and path.read_text() in seen | {"a" * 1000, "b" * 1000}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "start", "start.a", "start.b"]
