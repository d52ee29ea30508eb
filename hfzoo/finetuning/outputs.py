"""What a GLUE run leaves behind: the results summary, the model card, and the files of `--output_dir`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..hub import hub_base_model, public_arguments
from ..outputs import write_json_atomic
from ..training.arguments import hub_repository
from ..training.plots import plot_training_curves
from .loop import GlueProgress, GlueRun


def glue_results(run: GlueRun, progress: GlueProgress, seconds: float) -> dict[str, Any]:
    """Summarise a finished run: the saved epoch's dev metrics, the last epoch's, parameter counts, steps, time.

    Args:
        run: the finished run.
        progress: from `train_glue`.
        seconds: wall time of the training loop (s).

    Returns:
        `task`, `model_name_or_path`, `peft`, the saved epoch's `eval_<metric>` values (its `epoch`), the
        `best_epoch` and `metric_for_best_model`, the last epoch's metrics as `last_epoch_eval_<metric>`,
        `trainable_parameters`, `total_parameters`, `trainable_fraction`, `train_steps`, `train_examples`,
        `train_seconds`, `final_train_loss`, and the training throughput: `flops_per_token` (model FLOPs
        per real token), `train_step_tokens_per_second`, `train_tflops`, `train_mfu` (fraction of
        `peak_tflops`, from `peak_tflops_source`; see `hfzoo.training.throughput`), and the precision:
        `mixed_precision`, `mixed_precision_requested`, `mixed_precision_reason`, `host_capability`
        (`hfzoo.training.precision.PrecisionChoice.record`).
    """
    last = progress.eval_history[-1]
    saved = last if run.args.save_last_epoch else progress.eval_history[progress.best_epoch - 1]
    totals = progress.throughput
    speed = run.throughput.metrics(totals["tokens"], totals["flops"], totals["seconds"]) if run.throughput else {}
    return {
        "task": run.task.name,
        "model_name_or_path": str(run.args.model_name_or_path),
        "peft": run.args.peft,
        **{k: v for k, v in saved.items() if k.startswith("eval_")},
        "epoch": saved["epoch"],
        "best_epoch": progress.best_epoch,
        "metric_for_best_model": f"eval_{run.task.main_metric}",
        **{f"last_epoch_{k}": v for k, v in last.items() if k.startswith("eval_")},
        "trainable_parameters": run.trainable_parameters,
        "total_parameters": run.total_parameters,
        "trainable_fraction": run.trainable_parameters / run.total_parameters,
        "train_steps": progress.step,
        "train_examples": run.train_examples,
        "train_seconds": round(seconds, 1),
        "final_train_loss": progress.log_history[-1]["train_loss"] if progress.log_history else None,
        "flops_per_token": speed.get("flops_per_token"),
        "train_step_tokens_per_second": speed.get("tokens_per_second"),
        "train_tflops": speed.get("tflops"),
        "train_mfu": speed.get("mfu"),
        "peak_tflops": run.throughput.peak.tflops if run.throughput else None,
        "peak_tflops_source": run.throughput.peak.source if run.throughput else None,
        **(run.precision.record() if run.precision is not None else {}),
    }


def build_glue_model_card(run: GlueRun, results: dict[str, Any], model_name: str) -> ModelCard:
    """The model card (README.md) of a finetuned GLUE model, for hfzoo and stock transformers checkpoints alike.

    Metadata: `base_model` (a hub id; a local base folder is named in the text only: `hfzoo.hub.hub_base_model`),
    `library_name` (`peft` for an adapter), `pipeline_tag: text-classification`,
    tags, the GLUE dataset and a `model-index` with the dev metrics. Body: the task, the method and its
    trainable parameters, the results (saved and last epoch), the arguments, and how to load it.

    Args:
        run: the finished run.
        results: from `glue_results`.
        model_name: the card's title and the name in the loading example (the hub id when pushed).

    Returns:
        A `huggingface_hub.ModelCard`.
    """
    args, task = run.args, run.task
    base_type = run.accelerator.unwrap_model(run.model).config.model_type
    hfzoo_base = base_type.startswith("hfzoo_")
    metrics = {k.removeprefix("eval_"): v for k, v in results.items() if k.startswith("eval_") and "loss" not in k}
    data = ModelCardData(
        model_name=model_name,
        base_model=hub_base_model(args.model_name_or_path),  # a local folder: named in the text only
        library_name="peft" if args.peft != "none" else "transformers",
        pipeline_tag="text-classification",
        tags=[
            *(["hfzoo"] if hfzoo_base else []),
            base_type,
            "glue",
            task.name,
            *([args.peft] if args.peft != "none" else []),
        ],
        datasets=["nyu-mll/glue"],
        metrics=list(task.metrics),
        eval_results=[
            EvalResult(
                task_type="text-classification",
                dataset_type="nyu-mll/glue",
                dataset_name=f"GLUE {task.name.upper()}",
                dataset_config=task.name,
                dataset_split="validation_mismatched" if name.endswith("_mm") else next(iter(run.eval_dataloaders)),
                metric_type=name.removesuffix("_mm"),
                metric_value=value,
            )
            for name, value in metrics.items()
        ],
    )
    method = {"lora": "LoRA (Hu et al. 2021)", "prefix": "prefix tuning (Li & Liang 2021)", "none": "full finetuning"}
    public = public_arguments(args)
    load_model = (
        f'AutoModelForSequenceClassification.from_pretrained("{args.model_name_or_path}", num_labels={task.num_labels})'
    )
    loading = [
        "```python",
        *(["import hfzoo  # registers the hfzoo model types"] if hfzoo_base else []),
        "from transformers import AutoModelForSequenceClassification",
        *(["from peft import PeftModel", "", f"base = {load_model}",
           f'model = PeftModel.from_pretrained(base, "{model_name}")'] if args.peft != "none"
          else ["", f'model = AutoModelForSequenceClassification.from_pretrained("{model_name}")']),
        "```",
    ]  # fmt: skip
    lines = [
        f"# {model_name}",
        "",
        f"`{args.model_name_or_path}` ({base_type}) finetuned on GLUE {task.name.upper()} with {method[args.peft]}: "
        f"{results['trainable_parameters']:,} trainable parameters of {results['total_parameters']:,} "
        f"({100 * results['trainable_fraction']:.2f}%), {results['train_steps']} steps on "
        f"{results['train_examples']:,} training examples.",
        "",
        f"## Results (dev set, epoch {results['epoch']}; best epoch by `{results['metric_for_best_model']}`: "
        f"{results['best_epoch']})",
        "",
        "| metric | saved epoch | last epoch |",
        "|---|---:|---:|",
        *[
            f"| {k.removeprefix('eval_')} | {v:.4f} | {results.get('last_epoch_' + k, float('nan')):.4f} |"
            for k, v in results.items()
            if k.startswith("eval_")
        ],
        "",
        "## How to load",
        "",
        *loading,
        "",
        "## Arguments",
        "",
        "```json",
        json.dumps(public, indent=2, default=str),
        "```",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def save_glue_outputs(run: GlueRun, results: dict[str, Any], progress: GlueProgress) -> None:
    """Write the model (or adapter), the tokenizer, the results files, the curves and the model card; push if asked.

    Files: `eval_results.json` (`eval_<metric>` and `epoch` of the saved epoch), `all_results.json`
    (`results`), `train_history.json` (`log_history`, `eval_history`), `training_curves.png`, `README.md`.
    """
    args, accelerator = run.args, run.accelerator
    accelerator.wait_for_everyone()
    output_dir = Path(args.output_dir)
    unwrapped = accelerator.unwrap_model(run.model)
    unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save)
    if accelerator.is_main_process:
        run.tokenizer.save_pretrained(output_dir)
        evaluation = {k: v for k, v in results.items() if k.startswith("eval_") or k == "epoch"}
        for name, values in (
            ("eval_results.json", evaluation),
            ("all_results.json", results),
            ("train_history.json", {"log_history": progress.log_history, "eval_history": progress.eval_history}),
        ):
            write_json_atomic(output_dir / name, values)
        plot_training_curves(
            progress.log_history, progress.eval_history, output_dir / "training_curves.png",
            title=f"{run.task.name} ({args.peft}): {args.model_name_or_path}",
        )  # fmt: skip
        model_name = hub_repository(args)
        build_glue_model_card(run, results, model_name).save(output_dir / "README.md")
        if args.push_to_hub:
            from ..hub import push_to_hub

            push_to_hub(output_dir, model_name, token=args.hub_token, private=args.hub_private_repo)
    accelerator.wait_for_everyone()
