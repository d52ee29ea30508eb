"""Turn a training checkpoint (DeepSpeed ZeRO-1/2/3, FSDP2, DDP or single process) into a `save_pretrained` folder.

`checkpoints/step_N` folders written by `hfzoo.pretraining.loop.save_checkpoint` hold the model config,
the tokenizer, `training_state.json` and accelerate's state: for DeepSpeed, each process's ZeRO partition
of the fp32 weights and optimizer state (`pytorch_model/`); for FSDP2, `torch.distributed.checkpoint` shards
(`pytorch_model_fsdp_0/`, merged with `dcp_to_torch_save`); otherwise `model.safetensors`.
`consolidate_checkpoint` gathers the full fp32 weights (DeepSpeed's `zero_to_fp32`, on the CPU, with
no process group) and writes config, consolidated `model.safetensors` and tokenizer, which
`AutoModelFor...from_pretrained` loads without DeepSpeed.

Usage: `python recipes/consolidate_checkpoint.py OUTPUT_DIR/checkpoints/step_N CONSOLIDATED_DIR`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM, AutoTokenizer

import hfzoo  # noqa: F401  (registers the hfzoo model types with the Auto classes)

from ..outputs import check_output_folder, removed_if_refused
from ..training.checkpointing import verify_checkpoint

#: The sharded model folder accelerate writes under FSDP with `SHARDED_STATE_DICT` (`torch.distributed.checkpoint`).
FSDP_MODEL_DIR = "pytorch_model_fsdp_0"
_AUTO_CLASSES = {"clm": AutoModelForCausalLM, "mlm": AutoModelForMaskedLM, "span": AutoModelForSeq2SeqLM}


def load_checkpoint_state_dict(checkpoint_dir: str | Path) -> dict[str, torch.Tensor]:
    """Return the full fp32 model weights of a checkpoint folder, gathered from ZeRO partitions if needed.

    Args:
        checkpoint_dir: a `checkpoints/step_N` folder.

    Returns:
        `{parameter name: float32 tensor}` (contiguous, not sharing memory).

    Raises:
        FileNotFoundError: the folder holds neither a DeepSpeed or FSDP2 checkpoint nor `model.safetensors`.
    """
    path = Path(checkpoint_dir)
    if (path / "latest").is_file():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state_dict = get_fp32_state_dict_from_zero_checkpoint(str(path))
    elif (path / FSDP_MODEL_DIR / ".metadata").is_file():  # FSDP2: torch.distributed.checkpoint shards
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as scratch:
            dcp_to_torch_save(path / FSDP_MODEL_DIR, Path(scratch) / "model.pt")
            state_dict = torch.load(Path(scratch) / "model.pt", weights_only=True)["model"]
    elif (path / "model.safetensors").is_file():
        state_dict = load_file(path / "model.safetensors")
    else:
        raise FileNotFoundError(
            f"{path}: neither a DeepSpeed checkpoint ('latest'), an FSDP one ({FSDP_MODEL_DIR}/) nor model.safetensors"
        )
    return {name: tensor.detach().float().contiguous().clone() for name, tensor in state_dict.items()}


def consolidate_checkpoint(checkpoint_dir: str | Path, output_dir: str | Path) -> Path:
    """Write a `save_pretrained` folder (config, consolidated safetensors weights, tokenizer) from a checkpoint.

    Args:
        checkpoint_dir: a `checkpoints/step_N` folder of a pretraining run.
        output_dir: where to write; created if missing.

    Returns:
        `output_dir`.

    Raises:
        FileNotFoundError: not a checkpoint folder of this recipe (no `config.json` / `training_state.json`;
            for a run's output folder the message names its `checkpoints/step_N` folders).
        ValueError: `output_dir` is the checkpoint folder or inside it, or an existing file; a checkpoint that
            fails its manifest (`CheckpointError`: a missing, truncated or corrupt file, named) or names an
            unknown objective; the saved weights do not cover the model's parameters (names the first missing
            ones).
    """
    path, output = Path(checkpoint_dir), Path(output_dir)
    for name in ("config.json", "training_state.json"):
        if not (path / name).is_file():
            steps = sorted((path / "checkpoints").glob("step_*"), key=lambda p: (len(p.name), p.name))
            hint = f"; give one of its checkpoints: {', '.join(map(str, steps))}" if steps else ""
            raise FileNotFoundError(f"{path}: not a pretraining checkpoint folder (no {name}){hint}")
    if output.expanduser().resolve().is_relative_to(path.resolve()):
        # the files the checkpoint's manifest lists would change (a resume would then refuse it as corrupt)
        raise ValueError(f"output folder {output} is the checkpoint folder or inside it: give another folder")
    check_output_folder(output, "output folder")
    verify_checkpoint(path)  # a truncated or corrupt file is named before anything is read
    objective = json.loads((path / "training_state.json").read_text()).get("objective", "clm")
    if objective not in _AUTO_CLASSES:
        raise ValueError(
            f"{path / 'training_state.json'}: objective {objective!r} is not one of {sorted(_AUTO_CLASSES)}"
        )
    config = AutoConfig.from_pretrained(path)
    model = _AUTO_CLASSES[objective].from_config(config)
    missing, unexpected = model.load_state_dict(load_checkpoint_state_dict(path), strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {})
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    model.save_pretrained(output)
    if (path / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(path).save_pretrained(output)
    return output


def main(argv: list[str] | None = None) -> None:
    """Command line: `consolidate_checkpoint.py CHECKPOINT_DIR OUTPUT_DIR`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", help="A checkpoints/step_N folder of a pretraining run.")
    parser.add_argument("output_dir", help="Where to write the save_pretrained folder.")
    args = parser.parse_args(argv)
    try:
        with removed_if_refused(args.output_dir):  # a refused checkpoint leaves no empty output folder behind
            print(consolidate_checkpoint(args.checkpoint_dir, args.output_dir))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
