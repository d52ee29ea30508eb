"""The pretraining recipe: bad input fails before training, an end-to-end run, resume, YAML configs."""

from __future__ import annotations

import json
import logging
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.pretraining import TINY_OVERRIDES, base_args, restored_steps, run_main_expecting_error, tag_saved_history
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from hfzoo.models.flops import count_training_flops
from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import main
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training import throughput
from hfzoo.training.objectives import get_objective
from hfzoo.training.precision import resolve_mixed_precision

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda a, tmp: a.__setitem__(1, str(tmp / "missing.jsonl")), "missing.jsonl: no such file"),
        (lambda a, tmp: a.__setitem__(1, str(_empty(tmp))), "the file is empty"),
        (lambda a, tmp: a.extend(["--text_column_name", "body"]), "--text_column_name 'body' is not a column"),
        (lambda a, tmp: a.__setitem__(7, TINY_OVERRIDES + ",vocab_size=300"), "has 512 tokens, more than the model's vocab_size=300"),
        (lambda a, tmp: a.__setitem__(9, "65"), "--block_size 65 is larger than max_position_embeddings=64"),
        (lambda a, tmp: a.__setitem__(7, TINY_OVERRIDES + ",hiden_size=3"), "unknown key 'hiden_size'"),
        (lambda a, tmp: a.__setitem__(7, TINY_OVERRIDES + ",norm_type=batch"), "norm_type='batch' is not supported"),
        (lambda a, tmp: a.__setitem__(11, "0"), "--per_device_train_batch_size: must be a positive integer, got 0"),
        (lambda a, tmp: a.__setitem__(13, "-3"), "--max_train_steps: must be a positive integer, got -3"),
        (lambda a, tmp: a.extend(["--gradient_accumulation_steps", "0"]), "--gradient_accumulation_steps: must be a positive"),
        (lambda a, tmp: a.extend(["--config_name", "decoder-huge"]), "is neither a preset"),
        (lambda a, tmp: a.extend(["--resume_from_checkpoint", str(tmp / "nowhere")]), "not a checkpoint folder"),
        (lambda a, tmp: a.extend(["--weight_decay", "-0.1"]), "--weight_decay: must be a finite number >= 0, got -0.1"),
        (lambda a, tmp: a.extend(["--learning_rate", "nan"]), "--learning_rate: must be a finite number > 0, got nan"),
        (lambda a, tmp: a.extend(["--weight_decay", "inf"]), "--weight_decay: must be a finite number >= 0, got inf"),
        (lambda a, tmp: a.extend(["--max_grad_norm", "nan"]), "--max_grad_norm: must be a finite number >= 0, got nan"),
        (lambda a, tmp: a.extend(["--max_grad_norm", "-1"]), "--max_grad_norm: must be a finite number >= 0, got -1.0"),
        (lambda a, tmp: a.extend(["--objective", "span", "--mean_noise_span_length", "inf"]), "--mean_noise_span_length: must be in [1, inf), got inf"),
        (lambda a, tmp: a.extend(["--objective", "span", "--noise_density", "1"]), "--noise_density: must be in (0, 1), got 1.0"),
        (lambda a, tmp: a.extend(["--adam_beta1", "1.5"]), "--adam_beta1: must be in [0, 1), got 1.5"),
        (lambda a, tmp: a.extend(["--adam_beta2", "1"]), "--adam_beta2: must be in [0, 1), got 1.0"),
        (lambda a, tmp: a.extend(["--torch_compile_backend", "indcutor"]), "unknown torch.compile backend 'indcutor'; known backends: "),
        (lambda a, tmp: a.extend(["--seed", "-1"]), "--seed: must be an integer in [0, 4294967295], got -1"),
        (lambda a, tmp: a.extend(["--eval_seed", str(2**32)]), "--eval_seed: must be an integer in [0, 4294967295], got 4294967296"),
        (lambda a, tmp: a.extend(["--dataset_name", "wikitext"]), "--train_file and --dataset_name wikitext: give one data source"),
        (lambda a, tmp: a.extend(["--dataset_config_name", "wikitext-2-raw-v1"]), "--dataset_config_name wikitext-2-raw-v1 is a configuration of --dataset_name"),
        (lambda a, tmp: a.extend(["--hub_model_id", "me/tiny"]), "--hub_model_id me/tiny needs --push_to_hub (without it, it would be ignored)"),
        (lambda a, tmp: a.extend(["--report_to", "wandb"]), "--report_to wandb needs --with_tracking"),
        (lambda a, tmp: a.extend(["--with_tracking", "--report_to", "tensorbord"]), "--report_to tensorbord: 'tensorbord' is not a tracker; choose one of ['aim', "),
        (lambda a, tmp: a.extend(["--torch_compile_scope", "model"]), "--torch_compile_scope model needs --torch_compile"),
        (lambda a, tmp: a.extend(["--overwrite_output_dir", "--resume_from_checkpoint", "latest"]), "--overwrite_output_dir starts over and --resume_from_checkpoint latest continues a run: give one of them"),
        (lambda a, tmp: a.extend(["--push_to_hub", "--hub_model_id", "me/tiny:v2"]), "--hub_model_id me/tiny:v2: not a hub repository id (Repo id must use alphanumeric chars"),
        (lambda a, tmp: (a.__setitem__(a.index("--output_dir") + 1, str(tmp / "run 1")), a.append("--push_to_hub")), "--push_to_hub: the repository would be named 'run 1' after the --output_dir folder, which is not a hub repository id"),
    ],
    ids=[
        "missing-file", "empty-file", "text-column", "tokenizer-too-large", "block-size", "unknown-override",
        "bad-override-value", "batch-size", "steps", "accumulation", "preset", "resume-path", "weight-decay",
        "lr-nan", "weight-decay-inf", "max-grad-norm-nan", "max-grad-norm-negative", "span-length-inf", "noise-density-one", "adam-beta1", "adam-beta2", "compile-backend", "seed", "eval-seed", "two-data-sources", "config-without-dataset",
        "hub-id-without-push", "report-to-without-tracking", "unknown-tracker", "compile-scope-without-compile", "overwrite-and-resume", "hub-model-id", "hub-name-from-output-dir",
    ],
)  # fmt: skip
def test_bad_input_fails_before_training(change, expected, small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out")
    change(argv, tmp_path)
    message = run_main_expecting_error(argv, capsys)
    assert expected in message
    assert not (tmp_path / "out").exists()  # nothing left on disk, not even an empty output folder


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mlm_probability", "0.3"], "--mlm_probability: --objective mlm only; with --objective clm they would be ignored"),
        (["--whole_word_mask"], "--whole_word_mask: --objective mlm only; with --objective clm"),
        (["--objective", "mlm", "--noise_density", "0.3", "--mean_noise_span_length", "2"],
         "--noise_density, --mean_noise_span_length: --objective span only; with --objective mlm they would be"),
    ],
    ids=["mlm-flag-with-clm", "whole-word-with-clm", "span-flags-with-mlm"],
)  # fmt: skip
def test_a_flag_of_another_objective_is_refused(flags, message, tmp_path, capsys):
    base = ["--train_file", "t.jsonl", "--tokenizer_name", "tok", "--config_name", "decoder-tiny", "--output_dir",
            str(tmp_path)]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        parse_pretrain_args(base + flags)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    config = tmp_path / "mlm.yaml"  # a value from --config counts as given
    config.write_text("objective: mlm\nmlm_probability: 0.2\n")
    with pytest.raises(SystemExit):
        parse_pretrain_args([*base, "--config", str(config), "--objective", "span"])
    assert "--mlm_probability: --objective mlm only; with --objective span" in capsys.readouterr().err
    assert parse_pretrain_args([*base, "--config", str(config)]).mlm_probability == 0.2
    # the defaults of the flags not given
    span = parse_pretrain_args([*base, "--objective", "span", "--noise_density", "0.3"])
    assert (span.noise_density, span.mean_noise_span_length, span.mlm_probability) == (0.3, 3.0, 0.15)


def _empty(tmp):
    path = tmp / "empty.jsonl"
    path.write_text("")
    return path


def test_yaml_config_is_read_and_overridden_by_flags(tmp_path, small_jsonl_xz, tokenizer_dir):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"train_file: {small_jsonl_xz}\ntokenizer_name: {tokenizer_dir}\nconfig_name: decoder-tiny\n"
        "learning_rate: 0.01\nblock_size: 16\n"
    )
    args = parse_pretrain_args(["--config", str(config), "--block_size", "24", "--output_dir", str(tmp_path)])
    assert args.learning_rate == 0.01 and args.block_size == 24 and args.train_file == [str(small_jsonl_xz)]
    config.write_text("learning_rate: 0.01\nlearnin_rate: 3\n")
    with pytest.raises(ValueError, match="unknown keys \\['learnin_rate'\\]"):
        parse_pretrain_args(["--config", str(config), "--output_dir", str(tmp_path)])


def test_config_name_with_a_pretrained_model_is_refused_unless_it_comes_from_a_config_file(tmp_path, capsys):
    """The model is built from --model_name_or_path's own config: a --config_name beside it would be ignored (and
    recorded in the model card); a --config file's model gives way to the pretrained one."""
    model = tmp_path / "model"
    model.mkdir()
    common = ["--train_file", "train.jsonl", "--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(model)]
    with pytest.raises(SystemExit):
        parse_pretrain_args([*common, "--config_name", "decoder-small"])
    assert (
        f"--config_name decoder-small and --model_name_or_path {model}: the model is built from its own config (its "
        "weights fit no other); give one of them" in capsys.readouterr().err
    )
    config = tmp_path / "run.yaml"
    config.write_text("config_name: decoder-small\nlearning_rate: 0.01\n")
    args = parse_pretrain_args([*common, "--config", str(config)])
    assert args.config_name is None and args.learning_rate == 0.01
    assert parse_pretrain_args(["--config", str(config), "--train_file", "t.jsonl", "--output_dir", "o",
                                "--tokenizer_name", "tok"]).config_name == "decoder-small"  # fmt: skip


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "recipes" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_recipe_configs_parse_and_build(path, tmp_path, tokenizer_dir):
    from hfzoo.models.presets import build_config

    args = parse_pretrain_args(
        [
            "--config",
            str(path),
            "--tokenizer_name",
            str(tokenizer_dir),
            "--train_file",
            "x",
            "--output_dir",
            str(tmp_path),
        ]
    )
    config = build_config(args.config_name, args.config_overrides)
    assert args.block_size <= config.max_position_embeddings


@pytest.mark.compat
@pytest.mark.slow
def test_accelerate_launch_end_to_end_from_another_directory(tmp_path, small_jsonl_xz, tokenizer_dir, data_dir):
    """`accelerate launch` on xz JSON lines, then a fresh process reloads and evaluates on a plain text file."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": ""}
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "accelerate_configs" / "cpu_single_process.yaml"),
        str(REPO_ROOT / "recipes" / "pretrain.py"),
        *base_args(small_jsonl_xz, tokenizer_dir, "run", "--learning_rate", "3e-3"),
        "--max_train_steps", "30", "--checkpointing_steps", "15", "--logging_steps", "5",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "eval_results.json", "all_results.json"):  # fmt: skip
        assert (out / name).is_file(), name
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_steps"] == 30
    assert math_isfinite(results["eval_loss"]) and results["perplexity"] > 1
    history = json.loads((out / "train_history.json").read_text())["log_history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_15", "step_30"]

    # A fresh process: exact weights, eager == sdpa, causality, greedy generation with and without the cache.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "checkpoint_checks.py"), "run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert checks["weights_exact"] and checks["cache_equal"] and checks["new_tokens"] == 32
    assert checks["eager_sdpa_max_diff"] < 1e-5
    assert checks["causal_max_diff"] == 0.0

    wiki = data_dir / "wikitext-2" / "wiki.valid.tokens"
    small_text = tmp_path / "wiki_head.tokens"
    small_text.write_text("".join(wiki.read_text().splitlines(keepends=True)[:60]))
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "recipes" / "evaluate_lm.py"), "--model_name_or_path", "run",
         "--validation_file", str(small_text), "--prompt", "The", "--output_file", "eval.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluation = json.loads((tmp_path / "eval.json").read_text())
    assert evaluation["wiki_head.tokens"]["perplexity"] > 1
    assert evaluation["sample"]["text"].startswith("The")


def math_isfinite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


@pytest.mark.slow
def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(tmp_path, small_jsonl_xz, tokenizer_dir):
    common = ["--max_train_steps", "12", "--checkpointing_steps", "6", "--checkpoints_total_limit", "3",
              "--learning_rate", "3e-3", "--num_warmup_steps", "2", "--weight_decay", "0.01", "--eval_steps", "6",
              "--logging_steps", "1"]  # fmt: skip
    full = tmp_path / "full"
    main(base_args(small_jsonl_xz, tokenizer_dir, full, *common))
    resumed = tmp_path / "resumed"
    tag_saved_history(full / "checkpoints" / "step_6")
    main(base_args(small_jsonl_xz, tokenizer_dir, resumed, *common,
                   "--resume_from_checkpoint", str(full / "checkpoints" / "step_6")))  # fmt: skip
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    loss = [json.loads((d / "all_results.json").read_text())["eval_loss"] for d in (full, resumed)]
    assert loss[0] == pytest.approx(loss[1], abs=1e-6)
    # And it really resumed (no step before 6 was trained again), yet its history keeps the steps before the
    # resume: the same training and validation records as the uninterrupted run's (validation at step 6 too).
    assert restored_steps(resumed) == (list(range(1, 13)), list(range(1, 7)))
    history = [json.loads((d / "train_history.json").read_text()) for d in (full, resumed)]
    restored = [{k: v for k, v in r.items() if k != "restored"} for r in history[1]["log_history"][:6]]
    assert restored == history[0]["log_history"][:6]  # the checkpoint's records, as saved
    for a, b in zip(history[0]["log_history"], history[1]["log_history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5), a["step"]
    assert [r["step"] for r in history[1]["eval_history"]] == [r["step"] for r in history[0]["eval_history"]] == [
        0, 6, 12]  # fmt: skip
    for a, b in zip(history[0]["eval_history"], history[1]["eval_history"]):
        assert b["eval_loss"] == pytest.approx(a["eval_loss"], abs=1e-6), a["step"]
    assert json.loads((resumed / "all_results.json").read_text())["train_steps"] == 12


def test_a_hub_token_reaches_no_file_and_no_output(tmp_path, small_jsonl_xz, tokenizer_dir, monkeypatch, capsys):
    """--hub_token is for the upload only: not in TensorBoard's hparams (nor W&B's config), the card, or the logs."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    tokens = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(
        HfApi, "upload_folder", lambda self, **kw: tokens.append(self.token) or SimpleNamespace(commit_url="u")
    )
    out = tmp_path / "out"
    main(base_args(small_jsonl_xz, tokenizer_dir, out, "--max_train_steps", "2", "--checkpointing_steps", "1",
                   "--with_tracking", "--report_to", "tensorboard", "--push_to_hub", "--hub_token", "hf_secret_xyz"))  # fmt: skip
    assert tokens == ["hf_secret_xyz"]  # the upload had it
    assert list(out.rglob("hparams.yml")) and list(out.rglob("checkpoints/step_1/*"))
    leaks = [p for p in out.rglob("*") if p.is_file() and b"hf_secret_xyz" in p.read_bytes()]
    captured = capsys.readouterr()
    assert not leaks and "hf_secret_xyz" not in captured.out + captured.err


def test_push_to_hub_stops_before_training_when_the_hub_refuses_the_repository(
    small_jsonl_xz, tokenizer_dir, tmp_path, monkeypatch, capsys
):
    """As transformers' Trainer, the repository is created when the run starts: a refusal costs no training."""
    from types import SimpleNamespace

    import huggingface_hub
    from huggingface_hub import HfApi

    out = tmp_path / "out"
    argv = base_args(small_jsonl_xz, tokenizer_dir, out, "--checkpointing_steps", "1", "--push_to_hub",
                     "--hub_model_id", "me/tiny")  # fmt: skip
    with monkeypatch.context() as offline:
        offline.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # the hub client's own refusal
        message = run_main_expecting_error(argv, capsys)
    assert message.startswith("error: --push_to_hub: cannot create the hub repository me/tiny (OfflineModeIsEnabled")
    assert not out.exists()
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kw: SimpleNamespace(private=False))
    message = run_main_expecting_error([*argv, "--hub_private_repo"], capsys)
    assert message == (
        "error: --hub_private_repo: a private repository asked for, but the hub repository me/tiny exists and is "
        "public; make it private on the hub, or use another repository"
    )
    assert not out.exists()


def test_plain_text_train_and_validation_files(tmp_path, data_dir, tokenizer_dir):
    lines = (data_dir / "wikitext-2" / "wiki.valid.tokens").read_text().splitlines(keepends=True)
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("".join(lines[:400]))
    valid.write_text("".join(lines[400:500]))
    out = tmp_path / "out"
    results = main(
        base_args(train, tokenizer_dir, out, "--validation_file", str(valid), "--max_train_steps", "3",
                  "--logging_steps", "1", "--with_tracking", "--report_to", "tensorboard")
    )  # fmt: skip
    assert results["train_steps"] == 3
    assert list(out.rglob("events.out.tfevents.*")), "no tensorboard event file written by --with_tracking"
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] == pytest.approx(results["eval_loss"])
    assert results["unigram_perplexity"] > 1
    # --mixed_precision auto (the default): the choice, its reason and the CPU's class, in the results and the card
    choice = resolve_mixed_precision("auto", device_type="cpu")
    saved = json.loads((out / "all_results.json").read_text())
    assert {k: saved[k] for k in choice.record()} == choice.record()
    assert saved["mixed_precision_requested"] == "auto" and saved["host_capability"].startswith("cpu: ")
    assert f"- trained on: {saved['host_capability']}" in (out / "README.md").read_text()


OBJECTIVE_SETUPS = {
    "mlm": ("encoder", "encoder-tiny"),
    "span": ("encoder-decoder", "encoder-decoder-tiny"),
}


@pytest.mark.compat
@pytest.mark.parametrize("objective", ["mlm", "span"])
def test_objective_trains_its_family(objective, small_jsonl_xz, family_tokenizers, tmp_path):
    family, preset = OBJECTIVE_SETUPS[objective]
    argv = base_args(small_jsonl_xz, family_tokenizers[family], tmp_path / "out", "--objective", objective,
                     "--max_train_steps", "25", "--learning_rate", "3e-3", "--per_device_train_batch_size", "8",
                     "--peak_tflops", "0.5")  # fmt: skip
    argv[argv.index("decoder-tiny")] = preset
    if objective == "mlm":
        # With learned positions the tiny encoder may sit on the unigram plateau for the whole 25 steps, or not,
        # depending on the masks drawn (seeds 42, 1, 2, 3: 0.17, 0.43, 0.64, 0.45 lower); with rotary positions,
        # as the shipped encoder recipe, it leaves it (0.34, 0.45, 0.52).
        argv[argv.index(TINY_OVERRIDES)] += ",position_embedding_type=rotary"
    results = main(argv)
    assert results["objective"] == objective and results["train_steps"] == 25
    assert results["eval_loss"] < results["init_eval_loss"] - 0.25
    assert "unigram_perplexity" not in results
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == {"mlm": "hfzoo_encoder", "span": "hfzoo_encoder_decoder"}[objective]
    # Throughput: model FLOPs per text token from the config (span: 32 encoder inputs and their targets out of
    # the longer raw block), TFLOP/s of the optimizer steps, MFU against --peak_tflops.
    model_config = AutoConfig.from_pretrained(tmp_path / "out")
    if objective == "span":
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
        collator, raw = get_objective("span").build_collator(parse_pretrain_args(argv), tokenizer, 32)
        expected = count_training_flops(model_config, 32, collator.target_length).total / raw
    else:
        expected = count_training_flops(model_config, 32).per_token
    saved = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert saved["flops_per_token"] == pytest.approx(expected, rel=1e-12)
    assert saved["train_tflops"] == pytest.approx(saved["train_step_tokens_per_second"] * expected / 1e12)
    assert saved["train_mfu"] == pytest.approx(saved["train_tflops"] / 0.5)
    assert saved["peak_tflops"] == 0.5 and saved["peak_tflops_source"] == "--peak_tflops"
    assert saved["train_step_tokens_per_second"] >= saved["train_tokens_per_second"]  # evaluations left out


@pytest.mark.parametrize(
    "objective, family, preset, extra, expected",
    [
        ("mlm", None, "encoder-tiny", [], "needs a tokenizer with a mask token"),
        ("span", "encoder", "encoder-decoder-tiny", [], "sentinel"),
        ("span", "encoder-decoder", "encoder-decoder-tiny", ["--noise_density", "1.5"], "noise_density"),
        ("mlm", "encoder", "encoder-tiny", ["--mlm_probability", "0"], "--mlm_probability: must be in (0, 1), got 0.0"),
        (
            "clm",
            "encoder",
            "encoder-tiny",
            [],
            "needs a model with an AutoModelForCausalLM head; model_type 'hfzoo_encoder'",
        ),
        ("span", "encoder-decoder", "decoder-tiny", [], "AutoModelForSeq2SeqLM head; model_type 'hfzoo_decoder'"),
    ],
)
def test_objective_bad_input(
    objective, family, preset, extra, expected, small_jsonl_xz, tokenizer_dir, family_tokenizers, tmp_path, capsys
):
    tokenizer = family_tokenizers[family] if family else tokenizer_dir
    argv = base_args(small_jsonl_xz, tokenizer, tmp_path / "out", "--objective", objective, *extra)
    argv[argv.index("decoder-tiny")] = preset
    assert expected in run_main_expecting_error(argv, capsys)


def test_flex_attention_is_refused_on_the_cpu_before_any_work(small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    """PyTorch's FlexAttention has no backward pass on the CPU: the recipe says so before it reads any data."""
    if torch.cuda.is_available():
        pytest.skip("flex_attention trains on a GPU")
    from torch.nn.attention.flex_attention import flex_attention

    query = torch.randn(1, 1, 8, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):  # the reason for the refusal still holds
        flex_attention(query, query, query)
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--attn_implementation", "flex_attention")
    message = run_main_expecting_error(argv, capsys)
    assert "--attn_implementation flex_attention cannot train on the CPU" in message and "use sdpa or eager" in message
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "model.safetensors").exists()


def test_flash_attention_is_refused_on_the_cpu_before_any_work(small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    """FlashAttention's kernels run on CUDA (transformers would raise `ImportError` from inside the model's
    construction): refused in one line, also as a paged implementation."""
    if torch.cuda.is_available():
        pytest.skip("FlashAttention runs on a GPU")
    for attention in ("flash_attention_2", "paged|flash_attention_3"):
        argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--attn_implementation", attention)
        message = run_main_expecting_error(argv, capsys)
        assert f"--attn_implementation {attention} needs a GPU" in message and "use sdpa or eager" in message
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_at_every_epoch_end_and_the_sample_of_the_saved_model(small_jsonl_xz, tokenizer_dir, tmp_path,
                                                                            capsys):  # fmt: skip
    """`--checkpointing_steps epoch` saves at the end of each epoch; `--sample_prompt` prints the greedy continuation
    that the saved model gives when reloaded (the generation config carries the tokenizer's special tokens)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    argv = base_args(small_jsonl_xz, tokenizer_dir, out, "--checkpointing_steps", "epoch", "--num_train_epochs", "2",
                     "--max_train_samples", "12", "--mixed_precision", "no", "--sample_prompt", "It was a dark")  # fmt: skip
    del argv[argv.index("--max_train_steps") : argv.index("--max_train_steps") + 2]
    metrics = main(argv)
    assert metrics["train_steps"] == 6  # 12 blocks of 4 a step, twice
    assert sorted(path.name for path in (out / "checkpoints").iterdir()) == ["step_3", "step_6"]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Sample: ")]
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    generated = model.generate(**tokenizer("It was a dark", return_tensors="pt"), max_new_tokens=32, do_sample=False)
    assert printed == [f"Sample: {tokenizer.decode(generated[0], skip_special_tokens=True)}"]


def test_training_curves_and_scheduler_kwargs(small_jsonl_xz, tokenizer_dir, tmp_path, monkeypatch):
    """training_curves.png holds the run's records (read back from the PNG); --lr_scheduler_kwargs shapes the schedule.

    Every record carries the throughput, MFU against this CPU's measured (and cached) fp32 matmul peak.
    """
    from PIL import Image

    cache = tmp_path / "cache" / "cpu_peak_tflops.json"
    monkeypatch.setattr(throughput, "cpu_peak_cache_file", lambda: cache)
    out = tmp_path / "out"
    main(base_args(small_jsonl_xz, tokenizer_dir, out, "--logging_steps", "1", "--eval_steps", "2",
                   "--learning_rate", "1e-3", "--lr_scheduler_type", "cosine_with_min_lr",
                   "--lr_scheduler_kwargs", '{"min_lr_rate": 0.25}'))  # fmt: skip
    history = json.loads((out / "train_history.json").read_text())
    assert [r["step"] for r in history["eval_history"]] == [0, 2, 4]
    assert history["log_history"][-1]["learning_rate"] == pytest.approx(0.25e-3)  # min_lr_rate x learning_rate
    with Image.open(out / "training_curves.png") as image:
        assert image.format == "PNG" and len(set(image.convert("L").tobytes())) > 10
        curves = json.loads(image.text["hfzoo:curves"])
    assert list(curves) == ["training loss", "validation loss", "learning rate", "tokens/s"]
    assert curves["training loss"] == [[r["step"], r["train_loss"]] for r in history["log_history"]]
    assert curves["validation loss"] == [[r["step"], r["eval_loss"]] for r in history["eval_history"]]
    assert curves["learning rate"] == [[r["step"], r["learning_rate"]] for r in history["log_history"]]
    assert [s for s, _ in curves["tokens/s"]] == [1, 2, 3, 4]
    (peak,) = json.loads(cache.read_text()).values()  # measured once, for the run's precision (`auto`)
    results = json.loads((out / "all_results.json").read_text())
    precision = "bf16" if results["mixed_precision"] == "bf16" else "fp32"
    assert results["peak_tflops"] == peak and results["peak_tflops_source"].startswith(f"measured {precision} matmul")
    for record in history["log_history"]:
        assert record["flops_per_token"] == results["flops_per_token"] > 0
        assert record["tflops"] == pytest.approx(record["tokens_per_second"] * record["flops_per_token"] / 1e12)
        assert record["mfu"] == pytest.approx(record["tflops"] / peak)


def test_bad_lr_scheduler_kwargs_fail_before_training(small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    message = run_main_expecting_error(
        base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--lr_scheduler_type", "cosine_with_min_lr"), capsys
    )
    assert "--lr_scheduler_kwargs {}: One of min_lr or min_lr_rate should be set" in message
    # refused before any file is read: a missing training file is not reached
    argv = base_args(
        tmp_path / "missing.jsonl", tokenizer_dir, tmp_path / "out", "--lr_scheduler_kwargs", '{"bogus": 1}'
    )
    message = run_main_expecting_error(argv, capsys)
    assert "--lr_scheduler_type linear with --lr_scheduler_kwargs {'bogus': 1}: " in message
    message = run_main_expecting_error(
        base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--lr_scheduler_kwargs", "[1, 2]"), capsys
    )
    assert "expected a mapping" in message
    # transformers' constant schedule ignores a warmup and its arguments: both refused with it, before the data
    constant = ["--lr_scheduler_type", "constant"]
    argv = base_args(tmp_path / "missing.jsonl", tokenizer_dir, tmp_path / "out", *constant, "--num_warmup_steps", "5")
    message = run_main_expecting_error(argv, capsys)
    assert "--lr_scheduler_type constant has no warmup (--num_warmup_steps 5 would be ignored); use " in message
    argv = base_args(tmp_path / "missing.jsonl", tokenizer_dir, tmp_path / "out", *constant, "--lr_scheduler_kwargs",
                     '{"num_cycles": 2}')  # fmt: skip
    message = run_main_expecting_error(argv, capsys)
    assert "--lr_scheduler_type constant takes no arguments (--lr_scheduler_kwargs {'num_cycles': 2} would" in message


def test_a_warmup_longer_than_the_run_is_logged(small_jsonl_xz, tokenizer_dir, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        main(base_args(small_jsonl_xz, tokenizer_dir, out, "--num_warmup_steps", "10", "--logging_steps", "1",
                       "--learning_rate", "1e-3"))  # fmt: skip
    expected = (
        "--num_warmup_steps 10 is not below the run's 4 optimizer steps: the learning rate is still warming up "
        "when training ends (at most 40% of --learning_rate)"
    )
    assert expected in caplog.text
    history = json.loads((out / "train_history.json").read_text())["log_history"]
    assert [r["learning_rate"] for r in history] == pytest.approx([1e-4, 2e-4, 3e-4, 4e-4])  # still rising


@pytest.mark.slow
def test_torch_compile_trains_like_eager_and_saves_the_eager_keys(small_jsonl_xz, tokenizer_dir, tmp_path):
    """--torch_compile (backend aot_eager here: inductor's code generation is slow on CPU) compiles in place.

    Both scopes: the repeated layers (the default, regional compilation) and the whole model.
    """
    results, graphs = {}, {}
    compiled = ["--torch_compile", "--torch_compile_backend", "aot_eager"]
    runs = (("eager", []), ("compiled", compiled), ("compiled-model", [*compiled, "--torch_compile_scope", "model"]))
    for name, extra in runs:
        argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / name, *extra)
        argv[argv.index(TINY_OVERRIDES)] += ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        results[name] = main(argv)
        graphs[name] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs["eager"] == 0, graphs
    keys = {name: list(load_file(tmp_path / name / "model.safetensors")) for name in results}
    for name in ("compiled", "compiled-model"):
        assert graphs[name] > 0, (name, graphs)  # the run did run compiled graphs
        assert results[name]["eval_loss"] == pytest.approx(results["eager"]["eval_loss"], rel=1e-4), name
        assert keys[name] == keys["eager"] and not any("_orig_mod" in k for k in keys[name]), name


def test_a_resume_with_other_optimizer_settings_is_refused_and_the_adamw_implementation_may_change(
    tmp_path, small_jsonl_xz, tokenizer_dir, capsys
):
    """The checkpoint's optimizer state restores its hyperparameters: another --learning_rate would be ignored."""
    run = tmp_path / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, run, "--max_train_steps", "1", "--checkpointing_steps", "1",
                   "--learning_rate", "1e-3"))  # fmt: skip
    checkpoint = run / "checkpoints" / "step_1"
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "other", "--max_train_steps", "2", "--learning_rate",
                     "0.5", "--adam_beta2", "0.95", "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    message = run_main_expecting_error(argv, capsys)
    assert (
        f"--resume_from_checkpoint {checkpoint}: written with --learning_rate 0.001, --adam_beta2 0.999; this run has "
        "--learning_rate 0.5, --adam_beta2 0.95: a resume restores the checkpoint's optimizer" in message
    )
    # fused and foreach AdamW keep the same state: the implementation may change on a resume
    results = main(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "resumed", "--max_train_steps", "2",
                             "--learning_rate", "1e-3", "--optim", "adamw_torch",
                             "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    assert results["train_steps"] == 2


def test_a_resume_with_another_tokenizer_of_the_same_size_is_refused(
    tmp_path, small_jsonl_xz, gutenberg_books, tokenizer_dir, capsys
):
    """A tokenizer trained on other text has the checkpoint's vocabulary size (the config check passes) but maps
    text to other ids; the same tokenizer from another folder resumes."""
    run = tmp_path / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, run, "--max_train_steps", "1", "--checkpointing_steps", "1"))
    checkpoint = run / "checkpoints" / "step_1"
    other_text = [row["text"][::-1] for row in gutenberg_books]  # the same books, reversed
    other = tmp_path / "other-tokenizer"
    train_bpe_tokenizer([other_text], vocab_size=512).save_pretrained(other)
    argv = base_args(small_jsonl_xz, other, tmp_path / "resumed", "--max_train_steps", "2",
                     "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    message = run_main_expecting_error(argv, capsys)
    assert (
        f"--resume_from_checkpoint {checkpoint}: trained with another tokenizer than this run's (--tokenizer_name {other}): "
        in message
    )
    assert "of its 512 tokens have other ids here or are missing (first: " in message

    copy = tmp_path / "copy-of-the-tokenizer"
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(copy)
    argv = base_args(small_jsonl_xz, copy, tmp_path / "resumed", "--max_train_steps", "2",
                     "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    assert main(argv)["train_steps"] == 2


def test_a_resume_on_another_base_model_is_refused_and_the_same_model_from_another_folder_resumes(
    tmp_path, small_jsonl_xz, tokenizer_dir, capsys
):
    """A checkpoint holds the whole model: resumed with another --model_name_or_path of the same config, or with
    none, or a run from newly initialized weights resumed with one, would go on training the checkpoint's weights
    while the saved model and its card named another start."""

    def continued(base, output_dir, *extra):  # continued pretraining: the base's config, no --config_name
        argv = base_args(small_jsonl_xz, tokenizer_dir, output_dir, "--max_train_steps", "2", *extra)
        argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
        return [*argv, "--model_name_or_path", str(base)]

    first, second = tmp_path / "first", tmp_path / "second"
    main(base_args(small_jsonl_xz, tokenizer_dir, first, "--max_train_steps", "1", "--checkpointing_steps", "1"))
    main(base_args(small_jsonl_xz, tokenizer_dir, second, "--max_train_steps", "1", "--seed", "7"))
    main(continued(first, tmp_path / "continued", "--max_train_steps", "1", "--checkpointing_steps", "1"))
    checkpoint = tmp_path / "continued" / "checkpoints" / "step_1"
    resume = ["--resume_from_checkpoint", str(checkpoint)]

    message = run_main_expecting_error(continued(second, tmp_path / "resumed", *resume), capsys)
    assert (
        f"--resume_from_checkpoint {checkpoint}: written by a run that started from {first}; this run's "
        f"--model_name_or_path {second} has other weights: the checkpoint's weights would replace its own" in message
    )
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "resumed", *resume), capsys)
    assert (
        f"--resume_from_checkpoint {checkpoint}: written by a run that started from {first}; this run gives no "
        f"--model_name_or_path: the saved model would not name the model it was trained from; resume with "
        f"--model_name_or_path {first}" in message
    )
    scratch = first / "checkpoints" / "step_1"  # a run from newly initialized weights, with the base's config
    message = run_main_expecting_error(
        continued(first, tmp_path / "resumed", "--resume_from_checkpoint", str(scratch)), capsys
    )
    assert (
        f"--resume_from_checkpoint {scratch}: written by a run that started from newly initialized weights; this "
        f"run starts from --model_name_or_path {first}: " in message
    )
    assert not (tmp_path / "resumed").exists()  # refused before any work

    copy = tmp_path / "copy-of-first"
    shutil.copytree(first, copy, ignore=shutil.ignore_patterns("checkpoints"))
    results = main(continued(copy, tmp_path / "resumed", *resume))
    assert results["train_steps"] == 2
    assert main(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "scratch", "--max_train_steps", "2",
                          "--resume_from_checkpoint", str(scratch)))["train_steps"] == 2  # fmt: skip


def test_continued_pretraining_with_a_tokenizer_that_renumbers_the_models_tokens_is_refused(
    tmp_path, small_jsonl_xz, gutenberg_books, tokenizer_dir, capsys
):
    """The model's embeddings are learnt for its own tokenizer's ids: one of the same size trained on other text
    passes the vocab_size check but would read each row for another token. The same tokenizer from another folder,
    one that only adds tokens, and a model without tokenizer files go on."""
    model = tmp_path / "model"
    main(base_args(small_jsonl_xz, tokenizer_dir, model, "--max_train_steps", "1", "--config_overrides",
                   TINY_OVERRIDES + ",vocab_size=520"))  # fmt: skip

    def continued(tokenizer, base=model):
        argv = base_args(small_jsonl_xz, tokenizer, tmp_path / "continued", "--max_train_steps", "1")
        argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
        return [*argv, "--model_name_or_path", str(base), "--overwrite_output_dir"]

    other = tmp_path / "other-tokenizer"
    train_bpe_tokenizer([[row["text"][::-1] for row in gutenberg_books]], vocab_size=512).save_pretrained(other)
    message = run_main_expecting_error(continued(other), capsys)
    assert f"error: --tokenizer_name {other}: gives " in message
    assert (
        f" of the 512 tokens of --model_name_or_path {model}'s own tokenizer other ids or none (first: " in message
        and "leave out --tokenizer_name to continue with the model's tokenizer" in message
    )
    assert not (tmp_path / "continued").exists()  # refused before any work

    extended = tmp_path / "extended-tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(["<lang_en>", "<lang_fr>"])  # ids 512 and 513: rows the model has, unused so far
    tokenizer.save_pretrained(extended)
    for accepted in (extended, tokenizer_dir):
        assert main(continued(accepted))["train_steps"] == 1, accepted
    bare = tmp_path / "model-without-tokenizer"
    shutil.copytree(model, bare, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
    assert main(continued(other, bare))["train_steps"] == 1  # nothing to compare with


def test_a_resume_with_other_data_settings_is_refused_and_the_files_may_move(
    tmp_path, small_jsonl_xz, tokenizer_dir, capsys
):
    """Another split, block size or seed would continue at the checkpoint's position in other blocks (held-out
    documents trained on); the same file read from another folder resumes."""
    run = tmp_path / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, run, "--max_train_steps", "1", "--checkpointing_steps", "1"))
    checkpoint = run / "checkpoints" / "step_1"
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "other", "--max_train_steps", "2",
                     "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    argv[argv.index("--validation_split_percentage") + 1] = "10"
    argv[argv.index("--block_size") + 1] = "16"
    message = run_main_expecting_error([*argv, "--seed", "7"], capsys)
    assert (
        f"--resume_from_checkpoint {checkpoint}: written with --validation_split_percentage 25, --block_size 32, "
        "--seed 42; this run has --validation_split_percentage 10, --block_size 16, --seed 7: the resumed run would "
        "go on at the checkpoint's position in other data" in message
    )
    other_text = tmp_path / "other.jsonl"
    other_text.write_text(json.dumps({"text": "Another book. " * 2000}) + "\n")
    argv = base_args(other_text, tokenizer_dir, tmp_path / "other", "--max_train_steps", "2",
                     "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    message = run_main_expecting_error(argv, capsys)
    size = small_jsonl_xz.stat().st_size
    assert (
        f"written with --train_file {small_jsonl_xz.name} ({size:,} bytes); this run has --train_file other.jsonl "
        f"({other_text.stat().st_size:,} bytes)" in message
    )

    moved = tmp_path / "moved" / small_jsonl_xz.name
    moved.parent.mkdir()
    moved.write_bytes(small_jsonl_xz.read_bytes())
    resumed = main(base_args(moved, tokenizer_dir, tmp_path / "resumed", "--max_train_steps", "2",
                             "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    assert resumed["train_steps"] == 2


def test_a_resume_with_other_objective_settings_is_refused(tmp_path, small_jsonl_xz, family_tokenizers, capsys):
    """Another masking rate or whole-word masking would switch the encoder's task at the checkpoint's step (the
    loss curves joining two); the same settings, given explicitly or as the defaults, resume."""
    run = tmp_path / "run"

    def mlm_args(output_dir, *extra):
        argv = base_args(small_jsonl_xz, family_tokenizers["encoder"], output_dir, "--objective", "mlm", *extra)
        argv[argv.index("decoder-tiny")] = "encoder-tiny"
        return argv

    main(mlm_args(run, "--max_train_steps", "1", "--checkpointing_steps", "1"))
    checkpoint = run / "checkpoints" / "step_1"
    state = json.loads((checkpoint / "training_state.json").read_text())
    assert state["objective_arguments"] == {"objective": "mlm", "mlm_probability": 0.15, "whole_word_mask": False,
                                           "noise_density": 0.15, "mean_noise_span_length": 3.0}  # fmt: skip
    resume = ("--max_train_steps", "2", "--resume_from_checkpoint", str(checkpoint))
    message = run_main_expecting_error(mlm_args(tmp_path / "other", *resume, "--mlm_probability", "0.3",
                                                "--whole_word_mask"), capsys)  # fmt: skip
    assert (
        f"--resume_from_checkpoint {checkpoint}: written with --mlm_probability 0.15, --whole_word_mask False; this "
        "run has --mlm_probability 0.3, --whole_word_mask True: the resumed run would go on from the checkpoint's "
        "step with another objective" in message
    )
    assert not (tmp_path / "other").exists()
    assert main(mlm_args(tmp_path / "resumed", *resume, "--mlm_probability", "0.15"))["train_steps"] == 2


@pytest.mark.slow
def test_the_main_job_script_ends_with_the_one_line_error_of_a_refused_run(gutenberg_books, tmp_path):
    """README command 1's script (`recipes/gutenberg_decoder.sh`) on a few books in its data layout: an argument the
    pretraining run refuses ends the script with that run's one-line error and a failing exit status, before the
    evaluation step, and without the launcher's traceback repeating it (nor its warning about defaults it chose)."""
    books = tmp_path / "data" / "gutenberg"
    books.mkdir(parents=True)
    for shard in ("00", "01"):  # the tokenizer's shard and the pretraining shard
        with lzma.open(books / f"pg_top100_en.{shard}.jsonl.xz", "wt") as f:
            f.writelines(json.dumps({**row, "text": row["text"][:40_000]}) + "\n" for row in gutenberg_books[:3])
    env = {
        **os.environ,
        "HFZOO_DATA_DIR": str(tmp_path / "data"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "HFZOO_DEVICE": "cpu",
        "VIRTUAL_ENV": sys.prefix,  # this interpreter's environment, not the checkout's .venv
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("OMP_NUM_THREADS", None)  # as on a fresh machine: accelerate picks the CPU threads itself
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "recipes" / "gutenberg_decoder.sh"), "--max_train_steps", "0"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode != 0
    assert "== 2/3 pretraining" in result.stdout and "== 3/3" not in result.stdout, result.stdout
    assert result.stderr.count("--max_train_steps: must be a positive integer, got 0") == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "were not passed to `accelerate launch`" not in result.stderr, result.stderr  # nothing left to its defaults
