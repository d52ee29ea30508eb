"""`hfzoo.study.runs`: a run folder is reused only for the run it holds."""

from __future__ import annotations

import json

from helpers.study import expect_refusal, tiny_study

from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir


def test_a_run_folder_is_reused_only_for_the_row_it_trained(inputs, tmp_path, capsys, monkeypatch):
    """Two rows with one folder name: a finished run of one is never reported under the other's name."""
    from hfzoo.study import execution

    held, wanted = "Factorized & shared embeddings", "+ Factorized & shared embeddings"
    assert run_dir(tmp_path, held, 0) == run_dir(tmp_path, wanted, 0)  # the folder names collide
    out = tmp_path / "out"
    first = tiny_study(inputs, tmp_path / "a.yaml", variants=[held], seeds=[0], glue_tasks=[], max_train_steps=8)
    assert [r["variant"] for r in main(["--study", str(first), "--output_dir", str(out)])] == [held]
    folder = run_dir(out, held, 0)
    key = json.loads((folder / "run.json").read_text())
    assert (key["variant"], key["family"], key["seed"]) == (held, "encoder-decoder", 0)
    assert key["config"]["embedding_size"] == 8 and key["config"]["hidden_size"] == 32
    results = (out / "results.json").read_text()

    def no_stage(module, argv, launcher):
        raise AssertionError(f"{module} started: the refusal must come before any work")

    monkeypatch.setattr(execution, "run_stage", no_stage)
    second = tiny_study(inputs, tmp_path / "b.yaml", variants=[wanted], seeds=[0], glue_tasks=[], max_train_steps=8)
    message = expect_refusal(["--study", str(second), "--output_dir", str(out)], capsys)
    assert f"{folder} holds the run of row {held!r}, not of the requested row {wanted!r}" in message, message
    assert (out / "results.json").read_text() == results
    # A folder written before run.json existed: its result.json names the row.
    (folder / "run.json").unlink()
    message = expect_refusal(["--study", str(second), "--output_dir", str(out)], capsys)
    assert f"holds the run of row {held!r}, not of the requested row {wanted!r}" in message, message
    # The same row with another resolved config (here written by hand) is refused too, naming the field.
    key["config"]["embedding_size"] = 16
    (folder / "run.json").write_text(json.dumps(key))
    message = expect_refusal(["--study", str(first), "--output_dir", str(out)], capsys)
    assert "with another config (embedding_size=16 there, 8 requested)" in message, message
    key["config"]["embedding_size"] = 8
    (folder / "run.json").write_text(json.dumps(key))
    assert [r["variant"] for r in main(["--study", str(first), "--output_dir", str(out)])] == [held]
