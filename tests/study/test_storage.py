"""`hfzoo.study.storage`: the study folder's shared files are written atomically, read tolerantly, and locked."""

from __future__ import annotations

import math

from hfzoo.study.storage import _lock, _read_json, _write_json


def test_json_is_written_atomically_and_a_torn_or_absent_file_reads_as_none(tmp_path):
    path = tmp_path / "result.json"
    assert _read_json(path) is None
    _write_json(path, {"loss": 1.5, "steps": [0, 8], "nan": math.nan})
    value = _read_json(path)
    assert value["loss"] == 1.5 and value["steps"] == [0, 8] and math.isnan(value["nan"])
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary file left behind
    path.write_text('{"loss": 1.')  # a write cut short
    assert _read_json(path) is None


def test_a_lock_held_elsewhere_is_not_taken_without_blocking(tmp_path):
    path = tmp_path / "runs" / "row" / ".lock"  # its folder is made
    with _lock(path, blocking=True) as first:
        assert first is True
        with _lock(path, blocking=False) as second:  # another open file: flock refuses it, as in another process
            assert second is False
    with _lock(path, blocking=False) as again:
        assert again is True
