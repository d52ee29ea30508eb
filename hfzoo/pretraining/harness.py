"""hfzoo checkpoints under EleutherAI's lm-evaluation-harness (`lm_eval`), on local data only.

`hfzoo-evaluate-lm --lm_eval_tasks hfzoo_gutenberg,hfzoo_wikitext2,hfzoo_sst2` runs the task files of
`lm_eval_tasks/` (loaders in `lm_eval_tasks/tasks.py`) through `lm_eval.simple_evaluate` with the
harness's `hf` model (`lm_eval.models.huggingface.HFLM`). The harness picks its backend from
transformers' built-in model-type tables, which do not list hfzoo's types, so the backend is passed
explicitly, from the Auto class the checkpoint's config is registered with (`harness_backend`):
decoders are `causal`, encoder-decoders `seq2seq`. Masked LMs (the encoder family) are refused: the
harness's tasks score text by its log-likelihood, which a masked LM does not define (a pseudo-log-likelihood
is a different quantity, not comparable with the other families' perplexities).

The rolling log-likelihood (`loglikelihood_rolling`) windows a document into disjoint windows of
`max_length` predicted tokens, each window's input being the tokens just before it. With `max_length`
equal to `hfzoo-evaluate-lm`'s block size, the harness's windows have exactly the inputs of
`hfzoo-evaluate-lm`'s blocks; the harness also predicts the first token of each block, which
`hfzoo-evaluate-lm` uses as context only, so its bits per byte and `hfzoo-evaluate-lm`'s perplexity in
bits per byte (`bits_per_byte`) measure the same windows.

Requires the `lm-eval` extra (`pip install "hfzoo[lm-eval]"`); importing this module does not import `lm_eval`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_MASKED_LM_MAPPING,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING,
)

from ..choices import choice_hint

#: The folder of hfzoo's task files (one `<task>.yaml` per task, loaders in `tasks.py`).
TASKS_DIR = Path(__file__).resolve().parent / "lm_eval_tasks"
#: Where the data is when neither `--data_dir` nor `HFZOO_DATA_DIR` says: `../shared/data` beside the checkout.
DEFAULT_DATA_DIR = "../shared/data"


def available_tasks() -> list[str]:
    """The names of hfzoo's harness tasks (the stems of `TASKS_DIR/*.yaml`, each file's `task:`), sorted."""
    return sorted(path.stem for path in TASKS_DIR.glob("*.yaml"))


def default_data_dir() -> str:
    """`HFZOO_DATA_DIR` when set, else `DEFAULT_DATA_DIR` (relative to the working directory)."""
    return os.environ.get("HFZOO_DATA_DIR") or DEFAULT_DATA_DIR


def parse_task_names(text: str) -> list[str]:
    """Split `TASK[,TASK...]` into task names and check each against `available_tasks`.

    Raises:
        ValueError: an empty list or an unknown name (the message names it and the known tasks).
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"--lm_eval_tasks {text!r}: no task named; {choice_hint('', available_tasks())}")
    for name in names:
        if name not in available_tasks():
            raise ValueError(f"--lm_eval_tasks: unknown task {name!r}; {choice_hint(name, available_tasks())}")
    return list(dict.fromkeys(names))


def check_task_data(names: list[str], data_dir: str | os.PathLike) -> None:
    """Check that the local file of every task in `names` exists under `data_dir`.

    Raises:
        FileNotFoundError: a missing file (named, with the task and how to point to the data).
    """
    from .lm_eval_tasks.tasks import TASK_FILES

    for name in names:
        path = Path(data_dir).expanduser() / TASK_FILES[name]
        if not path.is_file():
            raise FileNotFoundError(
                f"--lm_eval_tasks {name} reads {path}, which does not exist; give --data_dir (or HFZOO_DATA_DIR) "
                "the folder laid out as ../shared/data"
            )


def harness_backend(config) -> str:
    """The harness's `hf` backend for a checkpoint's config: `"causal"` or `"seq2seq"`.

    Read from the Auto class the config type is registered with (`import hfzoo` registers hfzoo's), so
    the harness's own detection, which only knows transformers' built-in model types, is not needed.

    Args:
        config: the checkpoint's `PreTrainedConfig`.

    Returns:
        `"seq2seq"` for a type `AutoModelForSeq2SeqLM` loads, `"causal"` for one `AutoModelForCausalLM` loads.

    Raises:
        ValueError: a masked LM or a type neither Auto class loads (the message says what is supported).
    """
    if type(config) in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        return "seq2seq"
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return "causal"
    what = "a masked LM" if type(config) in MODEL_FOR_MASKED_LM_MAPPING else "neither a causal nor a seq2seq LM"
    raise ValueError(
        f"model_type {config.model_type!r} is {what}: hfzoo-evaluate-lm and the harness score text by its "
        "log-likelihood, which only causal LMs (hfzoo_decoder) and encoder-decoders (hfzoo_encoder_decoder) define"
    )


def import_lm_eval():
    """Import `lm_eval` (the optional extra).

    Raises:
        ImportError: lm-eval is not installed (the message says how to install it).
    """
    try:
        import lm_eval
    except ImportError as err:
        raise ImportError(f"--lm_eval_tasks needs lm-eval: pip install 'hfzoo[lm-eval]' ({err})") from None
    return lm_eval


def run_lm_eval(
    model,
    tokenizer,
    tasks: list[str],
    data_dir: str | os.PathLike,
    max_length: int,
    batch_size: int = 16,
    limit: int | None = None,
) -> dict[str, dict[str, float]]:
    """Evaluate a loaded model on hfzoo's harness tasks with `lm_eval.simple_evaluate`.

    Args:
        model: a causal LM or an encoder-decoder (`PreTrainedModel`, on its device, in eval mode).
        tokenizer: its tokenizer.
        tasks: names from `available_tasks` (checked with `parse_task_names` and `check_task_data` first).
        data_dir: the folder laid out as `../shared/data`.
        max_length: the harness's window length in tokens (`hfzoo-evaluate-lm`'s block size).
        batch_size: windows (or choices) per forward pass.
        limit: at most this many documents (examples) per task.

    Returns:
        `{task: {metric: value}}`: `word_perplexity`, `byte_perplexity`, `bits_per_byte` for the
        perplexity tasks, `acc` (and its `acc_stderr`) for SST-2, plus `documents` (how many were evaluated).

    Raises:
        ImportError: lm-eval is not installed.
        ValueError: a model the harness cannot score (`harness_backend`).
    """
    lm_eval = import_lm_eval()
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    backend = harness_backend(model.config)
    # A decoder's tokenizer starts every text with its bos token (hfzoo's `<|endoftext|>`); the harness
    # gives that token as the context of a document's first window itself, so the text is encoded without it.
    special = {"add_bos_token": False} if backend == "causal" else {}
    lm = HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        backend=backend,
        max_length=max_length,
        batch_size=batch_size,
        device=str(model.device),
        **special,
    )
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": str(data_dir)})
    output = lm_eval.simple_evaluate(
        model=lm, tasks=list(tasks), task_manager=manager, limit=limit, bootstrap_iters=0, log_samples=False
    )
    results = {}
    for task in tasks:
        metrics = {
            key.split(",")[0]: value
            for key, value in output["results"][task].items()
            if "," in key and isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))
        }
        metrics["documents"] = output["n-samples"][task]["effective"]
        results[task] = metrics
    return results


def bits_per_byte(total_nll: float, num_bytes: int) -> float:
    """Bits per UTF-8 byte of a text from its total negative log-likelihood in nats: `nll / (ln 2 * bytes)`."""
    return total_nll / (math.log(2) * num_bytes)
