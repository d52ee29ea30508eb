"""`hfzoo.study.arguments`: the recipes' arguments of a run.

A study file's `pretrain_args: {optim: muon}` reaches its pretraining runs: they build Muon + AdamW; the study's
`eval_seed` fixes the held-out blocks' corruption.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml
from transformers import AutoModelForSeq2SeqLM

from hfzoo.finetuning import parse_glue_args
from hfzoo.pretraining import parse_pretrain_args
from hfzoo.study.arguments import glue_argv, pretrain_argv, study_set_flags
from hfzoo.study.configs import build_variant_config
from hfzoo.study.protocol import FAMILIES
from hfzoo.study.settings import StudySettings, load_settings
from hfzoo.training.arguments import muon_settings
from hfzoo.training.optimization import MuonWithAdamW, create_optimizer

DEFAULT_STUDY = Path(__file__).resolve().parents[2] / "recipes" / "studies" / "narang_small.yaml"
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16,
        "num_hidden_layers": 2, "num_decoder_layers": 2}  # fmt: skip


def test_pretrain_args_optim_muon_builds_muon_in_every_run(tmp_path):
    values = yaml.safe_load(DEFAULT_STUDY.read_text())
    values.update(config_overrides=TINY, pretrain_args={"optim": "muon", "muon_momentum": 0.9})
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(values))
    settings = load_settings(study)
    argv = pretrain_argv(settings, "tokenizer", tmp_path / "config.json", 0, tmp_path / "run", num_processes=1)
    args = parse_pretrain_args(argv)
    assert (args.optim, args.muon_momentum) == ("muon", 0.9)
    tokens = {"vocab_size": 64, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": None}
    model = AutoModelForSeq2SeqLM.from_config(build_variant_config(settings, settings.variants[0], tokens))
    optimizer = create_optimizer(
        model, learning_rate=args.learning_rate, weight_decay=args.weight_decay, muon=muon_settings(args)
    )
    assert isinstance(optimizer, MuonWithAdamW)
    (group,) = optimizer.muon.param_groups
    assert group["momentum"] == 0.9 and group["lr"] == 0.02
    # encoder: q, k, v, o + feed-forward; decoder: also cross-attention's q, k, v, o (2 layers each)
    layers_linear = sum(1 for n, _ in model.named_parameters() if ".layers." in n and n.endswith("proj.weight"))
    assert len(group["params"]) == layers_linear > 0


def test_eval_seed_fixes_the_validation_corruption(inputs, tmp_path):
    """`--eval_seed` (the study's `eval_seed`) decides the held-out blocks' span corruption, not `--seed`."""
    from hfzoo.pretraining.loop import main as pretrain

    def init_loss(*extra: str) -> float:
        out = tmp_path / "-".join(extra)
        pretrain(["--objective", "span", "--train_file", inputs["train"], "--tokenizer_name", inputs["tokenizer"],
                  "--config_name", "encoder-decoder-tiny", "--config_overrides", "hidden_size=32,intermediate_size=64",
                  "--block_size", "32", "--max_train_steps", "1", "--max_eval_samples", "8",
                  "--validation_split_percentage", "25", "--output_dir", str(out), *extra])  # fmt: skip
        return json.loads((out / "all_results.json").read_text())["init_eval_loss"]

    default = init_loss("--seed", "3")
    assert init_loss("--seed", "3", "--eval_seed", "3") == default  # default: --seed
    assert init_loss("--seed", "3", "--eval_seed", "4") != default  # other corruption of the same blocks


def test_every_flag_the_study_sets_is_a_recipe_flag_with_a_remedy_naming_a_study_key(tmp_path):
    """`study_set_flags` of every family: each flag is a dest of its recipe's parsed arguments, each remedy names
    a study key (or hfzoo-study's --output_dir, or why the flag is fixed)."""
    values = yaml.safe_load(DEFAULT_STUDY.read_text())
    values.update(config_overrides=TINY)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(values))
    fields = {field.name for field in dataclasses.fields(StudySettings)}
    for family in FAMILIES:
        settings = load_settings(study, {"family": family})
        flags = study_set_flags(settings)
        pretrain = parse_pretrain_args(pretrain_argv(settings, "t", tmp_path / "c.json", 0, tmp_path, 1))
        glue = parse_glue_args(glue_argv(settings, "sst2", tmp_path, tmp_path / "s.tsv", 0, tmp_path / "sst2", 1))
        assert {"seed", "output_dir", "max_train_steps", "config_name"} <= set(flags["pretrain_args"])
        assert {"seed", "output_dir", "task_name", "learning_rate"} <= set(flags["glue_args"])
        for parsed, remedies in ((pretrain, flags["pretrain_args"]), (glue, flags["glue_args"])):
            for flag, remedy in remedies.items():
                assert hasattr(parsed, flag), (family, flag)
                named = re.findall(r"study keys? ([\w, ]+?)(?: instead|$)", remedy)
                keys = [k for part in named for k in re.split(r", | or ", part)]
                assert all(k in fields for k in keys), (flag, remedy)
                assert keys or "--output_dir" in remedy or "instead" not in remedy, (flag, remedy)
