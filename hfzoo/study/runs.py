"""The study's run folders: where each (row, seed) run lives, what it trains (`run.json`), and its record.

A folder is reused only for the run it holds (`check_run_folders`): two row names can share a folder name.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, PreTrainedConfig, PreTrainedTokenizerBase

from .configs import _tokenizer_fields, build_variant_config, ladder_size_settings
from .protocol import BASELINE, NO_PRETRAINING
from .settings import StudySettings
from .storage import RECORD_FILE, RUN_KEY_FILE, _read_json, _write_json


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "row"


def run_dir(output_dir: Path, variant: str, seed: int, hidden_size: int | None = None) -> Path:
    """The folder of one (variant, seed) run: `runs/<variant slug>/seed_<seed>`.

    A ladder's run of one size: `runs/<variant slug>/h<hidden_size>/seed_<seed>`.
    """
    size = () if hidden_size is None else (f"h{hidden_size}",)
    return output_dir.joinpath("runs", _slug(variant), *size, f"seed_{seed}")


def plan_dir(output_dir: Path, entry: tuple) -> Path:
    """The folder of a planned run: `(variant, seed)` or a ladder's `(variant, seed, hidden_size)`."""
    return run_dir(output_dir, *entry)


def plan_settings(settings: StudySettings, entry: tuple) -> StudySettings:
    """The settings a planned run's config is built with: the study's, or a ladder size's (`ladder_size_settings`)."""
    return settings if len(entry) == 2 else ladder_size_settings(settings, entry[2])


def _config_values(config: PreTrainedConfig) -> dict[str, Any]:
    """Every field of `config` as plain JSON (the transformers version left out)."""
    values = json.loads(config.to_json_string(use_diff=False))
    values.pop("transformers_version", None)
    return values


def run_key(settings: StudySettings, variant: str, seed: int, config: PreTrainedConfig) -> dict[str, Any]:
    """What one run trains: `{"variant", "family", "seed", "config"}` (the resolved config as plain JSON)."""
    return {"variant": variant, "family": settings.family, "seed": seed, "config": _config_values(config)}


def start_run(
    settings: StudySettings, variant: str, seed: int, folder: Path, tokenizer_dir: str, row: str | None = None
) -> tuple[PreTrainedTokenizerBase, PreTrainedConfig]:
    """Open a run's folder: its config as `config.json` and its key as `run.json`.

    The config is `row`'s (default: `variant`'s) with the study's tokenizer; the key (`run_key`) names `variant`.

    Returns:
        `(tokenizer, config)`.
    """
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = build_variant_config(settings, row or variant, _tokenizer_fields(tokenizer))
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / RUN_KEY_FILE, run_key(settings, variant, seed, config))
    config.save_pretrained(folder)  # config.json: the model the recipes build
    return tokenizer, config


def _held_key(folder: Path) -> dict[str, Any] | None:
    """The key of the run a folder holds (`run_key`), or None for a folder with nothing of a run yet.

    A folder written before `run.json` existed gives the row and seed of its `result.json` and its `config.json`.
    """
    key = _read_json(folder / RUN_KEY_FILE)
    if key is not None:
        return key
    record, config = _read_json(folder / RECORD_FILE), folder / "config.json"
    if record is None and not config.is_file():
        return None
    key = {"variant": None, "seed": None, "config": None} if record is None else dict(record)
    if config.is_file():
        with contextlib.suppress(OSError, ValueError):
            key["config"] = _config_values(AutoConfig.from_pretrained(folder))
    return key


def check_run_folders(
    output_dir: Path, settings: StudySettings, plan: list[tuple[str, int]], tokenizer_fields: dict[str, Any]
) -> None:
    """Refuse a planned run whose folder holds a run of another row, family, seed or config, before any work.

    Two row names can share a folder name (`"Factorized & shared embeddings"` and `"+ Factorized & shared
    embeddings"` both give `runs/factorized-shared-embeddings/`); a study file naming one must not reuse (and
    report under its name) the other's finished run. Each existing run folder's key (`run.json`, see
    `run_key`) must name the requested row, the study's family, the seed and the config the row resolves to.

    Args:
        output_dir: the study folder.
        settings: the study settings.
        plan: the `(variant, seed)` runs of this selection (a ladder's: `(variant, seed, hidden_size)`).
        tokenizer_fields: the tokenizer's `vocab_size` and special token ids; where they are only planned
            (the study's tokenizer is not trained yet), pass `planned=True` fields: those keys are not compared.

    Raises:
        ValueError: one line naming the folder, the row (family, seed or config field) it holds and the one
            requested.
    """
    planned = tokenizer_fields.get("planned", False)
    fields = {k: v for k, v in tokenizer_fields.items() if k != "planned"}
    configs: dict[tuple, dict[str, Any]] = {}
    for entry in plan:
        variant, seed = entry[:2]
        folder = plan_dir(output_dir, entry)
        held = _held_key(folder) if folder.is_dir() else None
        if held is None:
            continue
        advice = f"use another --output_dir, or delete {folder} to train {variant!r} there"
        if held.get("variant") not in (None, variant):
            raise ValueError(
                f"{folder} holds the run of row {held['variant']!r}, not of the requested row {variant!r} "
                f"(both rows have the folder name {folder.parent.name!r}); {advice}"
            )
        for key, wanted in (("family", settings.family), ("seed", seed)):
            if held.get(key) not in (None, wanted):
                raise ValueError(
                    f"{folder} holds a run of {variant!r} with {key} {held[key]!r}, "
                    f"not the requested {wanted!r}; {advice}"
                )
        if held.get("config") is None:
            continue
        cell = (variant, *entry[2:])
        if cell not in configs:
            row = BASELINE if variant == NO_PRETRAINING else variant
            config = build_variant_config(plan_settings(settings, entry), row, fields)
            configs[cell] = run_key(settings, variant, seed, config)["config"]
        wanted = configs[cell]
        skip = set(fields) if planned else set()
        differ = sorted(
            k for k in set(wanted) | set(held["config"]) if k not in skip and held["config"].get(k) != wanted.get(k)
        )
        if differ:
            key = differ[0]
            raise ValueError(
                f"{folder} holds a run of {variant!r} with another config ({key}={held['config'].get(key)!r} there, "
                f"{wanted.get(key)!r} requested); {advice}"
            )


def _records(output_dir: Path, plan: list[tuple]) -> list[dict]:
    records = []
    for entry in plan:
        record = _read_json(plan_dir(output_dir, entry) / RECORD_FILE)
        if record is not None:
            records.append(record)
    return records
