"""`hfzoo.study.preparation`: the study tokenizes its data once, before its runs."""

from __future__ import annotations

import json

from helpers.study import copy_inputs, tiny_study

from hfzoo.study.runner import main


def test_the_data_is_tokenized_once_per_study(inputs, tmp_path, monkeypatch):
    """The study tokenizes and packs the books once, before its runs; no run, later process or rerun tokenizes."""
    from transformers import PreTrainedTokenizerBase

    from hfzoo.study import execution

    relative = copy_inputs(inputs, tmp_path)  # a fresh path: nothing of it is in datasets' cache yet
    study = tiny_study(
        {k: str(tmp_path / v) for k, v in relative.items()},
        tmp_path / "study.yaml",
        variants=["Vanilla Transformer"],
        glue_tasks=["rte"],
    )
    calls, per_stage = [], []
    original_call, original_stage = PreTrainedTokenizerBase.__call__, execution.run_stage

    def counting_call(self, *args, **kwargs):
        if kwargs.get("return_attention_mask") is False:  # the packing's tokenize_function (GLUE keeps masks)
            calls.append(1)
        return original_call(self, *args, **kwargs)

    def counting_stage(module, argv, launcher):
        before = len(calls)
        original_stage(module, argv, launcher)
        per_stage.append((module, len(calls) - before))

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counting_call)
    monkeypatch.setattr(execution, "run_stage", counting_stage)
    out = tmp_path / "out"
    main(["--study", str(study), "--output_dir", str(out)])
    prepared = len(calls)
    assert prepared > 0  # the study's preparation tokenized the data ...
    pretraining = [n for module, n in per_stage if module == "hfzoo.pretraining"]
    assert pretraining == [0, 0]  # ... and both runs' pretraining loaded it from the cache
    preparation = json.loads((out / "preparation.json").read_text())["data"]
    assert preparation["train_blocks"] > 0 and preparation["validation_blocks"] > 0

    # a later study process on the folder (another seed), and a rerun of the finished study: no tokenization
    main(["--study", str(study), "--output_dir", str(out), "--seeds", "2"])
    main(["--study", str(study), "--output_dir", str(out)])
    assert len(calls) == prepared
    assert [module for module, _ in per_stage].count("hfzoo.pretraining") == 3
