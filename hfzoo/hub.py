"""Model cards and uploads to the Hugging Face Hub for hfzoo checkpoint folders.

`build_model_card` describes a checkpoint (family, architecture, training data and recipe, final
metrics, how to load it) as a `huggingface_hub.ModelCard` with YAML metadata; `push_to_hub` writes
it as `README.md` when the folder has none and uploads the folder without its resumable checkpoints,
tracker logs and temporary files (`files_to_upload` lists exactly what would be sent).
`check_model_path` refuses a checkpoint path that does not exist before any work, and `load_checkpoint_config` loads
a checkpoint's config with a one-line error naming the argument that gave it;
`local_checkpoint_folder` gives a folder or a hub id's snapshot, and `copy_sentence_transformers_files` carries a
sentence-transformers model's modules into a folder written from it (a conversion, a remote-code export).
`public_arguments` is what of a recipe's arguments may be written anywhere (cards, tracker configs, logs): all but
the secrets `is_secret_argument` names; `TRACKER_PROJECTS` are the recipes' tracker folders, never uploaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

from . import AUTO_CLASSES, OTHER_MODEL_CLASSES
from .modules.attention import key_value_heads

#: The `Accelerator.init_trackers` project of each recipe: `--with_tracking` logs (TensorBoard's event files and
#: `hparams.yml`) go to `<output_dir>/<project>/`, which `hfzoo.hub.push_to_hub` leaves out.
TRACKER_PROJECTS = {"pretraining": "pretrain", "glue": "glue"}


#: Parts of an argument's name that mark its value as a secret (`--hub_token`, ...): never recorded or logged.
SECRET_MARKERS = ("token", "secret", "password", "api_key")
#: A tokenizer's special-token arguments (`mask_token`, ...): named like secrets, never secret.
_SPECIAL_TOKENS = frozenset(f"{kind}_token" for kind in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"))


def is_secret_argument(name: str) -> bool:
    """Whether the argument `name` holds a secret: it ends in a `SECRET_MARKERS` word, any case.

    `hub_token`, `wandb_api_key`, `--hub_token` are secrets; `max_new_tokens`, `tokenizer_name` and
    `num_virtual_tokens` are not (the marker must be the name's last word: all of it, or after `_` or `-`), nor are
    a tokenizer's special tokens (`mask_token`, `pad_token`, ...).
    """
    name = name.lower().lstrip("-")
    if name in _SPECIAL_TOKENS:
        return False
    return any(name == marker or name.endswith(("_" + marker, "-" + marker)) for marker in SECRET_MARKERS)


def public_arguments(args: argparse.Namespace | dict[str, Any] | None) -> dict[str, Any]:
    """The recipe arguments that may be written anywhere (model cards, tracker configs, logs): all but secrets.

    Args:
        args: parsed arguments, or a dict of them; None gives `{}`.

    Returns:
        `{name: value}` without the arguments `is_secret_argument` names (`hub_token`, ...), values as given.
    """
    if args is None:
        return {}
    items = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    return {name: value for name, value in items.items() if not is_secret_argument(name)}


#: resumable checkpoints of the pretraining recipe (`hfzoo.training.checkpointing.CHECKPOINT_DIR`).
CHECKPOINT_DIR = "checkpoints"
#: never uploaded: resumable checkpoints, tracker logs (the recipes' accelerate projects `pretrain` and `glue`,
#: TensorBoard `runs`, wandb), temporary files and folders of atomic writes, Python caches.
IGNORE_PATTERNS = [
    f"{CHECKPOINT_DIR}/*",
    *(f"{project}/*" for project in TRACKER_PROJECTS.values()),
    "runs/*",
    "wandb/*",
    "*.tmp",
    "*.tmp/*",
    "__pycache__/*",
    "*.pyc",
]
#: per family (model_type): (pipeline tag, architecture, what its language-model head makes of it).
FAMILY_INFO = {
    "hfzoo_decoder": ("text-generation", "decoder-only Transformer", "causal language model"),
    "hfzoo_encoder": ("fill-mask", "encoder-only Transformer", "masked language model"),
    "hfzoo_encoder_decoder": ("text2text-generation", "encoder-decoder Transformer", "sequence-to-sequence model"),
}
#: the hub's pipeline tag of a task head (its Auto class name), and of the bare stack (`AutoModel`: its hidden
#: states, as the hub tags `BertModel`); the language-model heads get their family's tag.
HEAD_PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
}
#: the pretraining head of each family, used when the config names no architecture.
MAIN_AUTO_CLASS = {
    "hfzoo_decoder": "AutoModelForCausalLM",
    "hfzoo_encoder": "AutoModelForMaskedLM",
    "hfzoo_encoder_decoder": "AutoModelForSeq2SeqLM",
}
OBJECTIVE_TAGS = {"clm": "causal-lm", "mlm": "masked-lm", "span": "span-corruption"}
ARCHITECTURE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_decoder_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "hidden_act",
    "position_embedding_type",
    "norm_type",
    "norm_position",
    "max_position_embeddings",
    "vocab_size",
    "tie_word_embeddings",
)
METRIC_FIELDS = (
    "eval_loss",
    "perplexity",
    "unigram_perplexity",
    "perplexity_ratio_to_unigram",
    "train_loss",
)
TRAINING_FIELDS = (
    ("train_steps", "optimizer steps"),
    ("train_tokens_seen", "tokens seen"),
    ("block_size", "block size (tokens)"),
    ("train_runtime", "training time (s)"),
)


def _family(config: Any) -> type:
    for cls in type(config).__mro__:
        if cls in AUTO_CLASSES:
            return cls
    raise ValueError(
        f"{type(config).__name__} (model_type {getattr(config, 'model_type', None)!r}) is not an hfzoo config"
    )


def _model_class(config: Any) -> tuple[str, type]:
    """The Auto class name and model class of the checkpoint (its `architectures`, else the main head).

    A class of `OTHER_MODEL_CLASSES` (no Auto class) gives its own name in place of the Auto class's.
    """
    family = _family(config)
    heads = {auto.__name__: cls for auto, cls in AUTO_CLASSES[family].items()}
    heads.update({cls.__name__: cls for cls in OTHER_MODEL_CLASSES.get(family, ())})
    for name in getattr(config, "architectures", None) or []:
        for auto_name, cls in heads.items():
            if cls.__name__ == name:
                return auto_name, cls
    auto_name = MAIN_AUTO_CLASS[config.model_type]
    return auto_name, heads[auto_name]


def count_parameters(config: Any, model_class: type | None = None) -> int:
    """Count the parameters of a model built from `config` (on the meta device: no memory, no init).

    Tied weights count once, as in `sum(p.numel() for p in model.parameters())`.

    Args:
        config: an hfzoo config.
        model_class: the model class (default: the config's `architectures`, else the family's main head).

    Returns:
        The number of parameters.

    Raises:
        ValueError: `config` is not an hfzoo config.
    """
    if model_class is None:
        _, model_class = _model_class(config)
    with torch.device("meta"):
        model = model_class(config)
    return sum(p.numel() for p in model.parameters())


def _format(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_format(v) for v in value)
    return str(value)


def _public_args(training_args: dict[str, Any] | argparse.Namespace | None) -> dict[str, Any]:
    """The recipe arguments worth recording (JSON values), without tokens or other secrets."""
    return {
        key: value
        for key, value in sorted(public_arguments(training_args).items())
        if value is None or isinstance(value, (str, int, float, bool, list, tuple))
    }


def hub_base_model(name: str | os.PathLike | None) -> str | None:
    """The `base_model` of a model card for a model trained from `name`: its hub id, or None for a local folder.

    The hub accepts only model ids in `base_model` (an upload whose card names a local path is refused with a bad
    request), so a model started from a local folder names it in the card's text only, as transformers' Trainer
    does.

    Args:
        name: `--model_name_or_path` as given, or None.

    Returns:
        `name` when it is no existing local path and is a valid hub repository id, else None.
    """
    if name is None or Path(name).expanduser().exists():
        return None
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(str(name))
    except HFValidationError:
        return None
    return str(name)


def _training_data(args: dict[str, Any]) -> list[str]:
    lines = []
    if args.get("model_name_or_path"):
        lines.append(f"- continued from: `{args['model_name_or_path']}` (its weights and config)")
    if args.get("dataset_name"):
        config_name = f" (configuration `{args['dataset_config_name']}`)" if args.get("dataset_config_name") else ""
        lines.append(f"- dataset: `{args['dataset_name']}`{config_name}")
    train_files = args.get("train_file") or []
    if isinstance(train_files, str):
        train_files = [train_files]
    if train_files:
        lines.append("- train files: " + ", ".join(f"`{Path(f).name}`" for f in train_files))
    validation = args.get("validation_file")
    if validation:
        files = [validation] if isinstance(validation, str) else validation
        lines.append("- validation files: " + ", ".join(f"`{Path(f).name}`" for f in files))
    elif train_files or args.get("dataset_name"):
        percent = args.get("validation_split_percentage")
        if percent is not None:
            lines.append(f"- validation: the first {percent}% of the training documents (held out)")
    return lines


def build_model_card(
    source: str | os.PathLike | transformers.PreTrainedConfig,
    results: dict[str, Any] | None = None,
    training_args: dict[str, Any] | argparse.Namespace | None = None,
    *,
    model_name: str | None = None,
    num_parameters: int | None = None,
    remote_code: bool | None = None,
) -> ModelCard:
    """Build the model card (README.md) of an hfzoo checkpoint.

    Metadata: `library_name: transformers`, `tags` (`hfzoo`, the model type, the objective when
    known), the `pipeline_tag` of the head in the config's `architectures` (`HEAD_PIPELINE_TAGS`: text-classification,
    token-classification, question-answering; feature-extraction for the bare stack), else of the family
    (text-generation, fill-mask or text2text-generation), the hub
    dataset when one was used, `metrics: [perplexity]` when a perplexity is reported, and the `base_model` a
    continued pretraining started from when it is a hub id (`hub_base_model`; a local folder is named in the text).
    A folder holding a sentence-transformers model (`modules.json`) gets `library_name: sentence-transformers`,
    `pipeline_tag: sentence-similarity`, the tag `sentence-transformers` and its loading example first. Body: family
    and model class, the architecture fields and parameter count, the model it continued from, the training data,
    steps and tokens
    seen, the precision it trained in and why, and the device (`mixed_precision`, `mixed_precision_reason`,
    `host_capability` of the results), the final metrics, the recipe arguments, and how to load the model.

    Args:
        source: a checkpoint folder (its `config.json` is read, and `all_results.json` when `results`
            is None) or an hfzoo config.
        results: final metrics, as in the recipe's `all_results.json` (`eval_loss`, `perplexity`,
            `unigram_perplexity`, `train_steps`, `train_tokens_seen`, `mixed_precision`, ...).
        training_args: the recipe's arguments (`argparse.Namespace` or dict): objective, data files or
            dataset name, batch sizes, ... Arguments whose name mentions a token or secret are left out.
        model_name: the title and the name used in the loading example (default: the folder name,
            else the model type).
        num_parameters: the parameter count (default: counted from a meta-device copy of the model).
        remote_code: whether the folder loads with `trust_remote_code=True` without hfzoo (default:
            whether the config has an `auto_map`, as written by `hfzoo.export.export_for_remote_code`).

    Returns:
        A `huggingface_hub.ModelCard`; `card.save(path)` writes it.

    Raises:
        OSError: `source` is a folder without a readable `config.json`.
        ValueError: the config is not an hfzoo config; `all_results.json` is not valid JSON.
    """
    folder = None
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        if not (folder / "config.json").is_file():
            raise OSError(f"{folder}: not a checkpoint folder (no config.json)")
        config = transformers.AutoConfig.from_pretrained(folder)
        if results is None and (folder / "all_results.json").is_file():
            try:
                results = json.loads((folder / "all_results.json").read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise ValueError(f"{folder / 'all_results.json'}: not valid JSON ({err})") from err
    else:
        config = source
    family = _family(config)
    results = dict(results or {})
    args = _public_args(training_args)
    auto_name, model_class = _model_class(config)
    if num_parameters is None:
        num_parameters = count_parameters(config, model_class)
    if remote_code is None:
        remote_code = bool(getattr(config, "auto_map", None))
    name = model_name or (folder.resolve().name if folder is not None else config.model_type)
    pipeline_tag, architecture, language_model = FAMILY_INFO[family.model_type]
    description = f"{architecture} ({language_model})"
    if auto_name == "AutoModel":  # the bare stack: no language-model head
        pipeline_tag, description = HEAD_PIPELINE_TAGS[auto_name], f"{architecture} without a head (hidden states)"
    elif not auto_name.startswith("Auto"):  # OTHER_MODEL_CLASSES: the encoder-decoder's encoder alone
        pipeline_tag = HEAD_PIPELINE_TAGS["AutoModel"]
        description = f"{architecture}'s encoder alone, without a head (hidden states)"
    elif auto_name in HEAD_PIPELINE_TAGS:  # a task head: not the family's language model
        pipeline_tag = HEAD_PIPELINE_TAGS[auto_name]
        description = f"{architecture} with a {pipeline_tag.replace('-', ' ')} head"
    objective = args.get("objective")

    tags = ["hfzoo", config.model_type]
    if objective:
        tags.append(OBJECTIVE_TAGS.get(objective, objective))
    sentence_model = folder is not None and (folder / "modules.json").is_file()
    if sentence_model:  # a sentence-transformers model: the hub's widget and snippet are that library's
        tags.append("sentence-transformers")
    metadata = ModelCardData(
        library_name="sentence-transformers" if sentence_model else "transformers",
        pipeline_tag="sentence-similarity" if sentence_model else pipeline_tag,
        tags=tags,
        datasets=[args["dataset_name"]] if args.get("dataset_name") else None,
        metrics=["perplexity"] if results.get("perplexity") is not None else None,
        base_model=hub_base_model(args.get("model_name_or_path")),
    )

    lines = [
        f"# {name}",
        "",
        f"An hfzoo {description}: `{model_class.__name__}` "
        f"(`model_type: {config.model_type}`, {_format(num_parameters)} parameters)"
        + (f", pretrained with the `{objective}` objective." if objective else "."),
        "",
        "## Architecture",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for field in ARCHITECTURE_FIELDS:
        if hasattr(config, field):
            value = key_value_heads(config) if field == "num_key_value_heads" else getattr(config, field)
            lines.append(f"| `{field}` | {_format(value)} |")
    lines.append(f"| parameters | {_format(num_parameters)} |")

    lines += ["", "## Training", ""]
    data_lines = _training_data(args)
    lines += data_lines or ["- training data: not recorded"]
    if objective:
        lines.append(f"- objective: `{objective}`")
    for key, label in TRAINING_FIELDS:
        if results.get(key) is not None:
            lines.append(f"- {label}: {_format(results[key])}")
    if results.get("mixed_precision") is not None:  # the run's precision and why (hfzoo.training.precision)
        precision = {"no": "fp32"}.get(results["mixed_precision"], results["mixed_precision"])
        reason = results.get("mixed_precision_reason")
        lines.append(f"- precision: {precision}" + (f" ({reason})" if reason else ""))
    if results.get("host_capability") is not None:
        lines.append(f"- trained on: {results['host_capability']}")

    metrics = [(key, results[key]) for key in METRIC_FIELDS if results.get(key) is not None]
    if metrics:
        lines += ["", "## Results", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{key}` | {_format(value)} |" for key, value in metrics]
        if "unigram_perplexity" in results:
            lines += [
                "",
                "`unigram_perplexity` is the perplexity of an add-one-smoothed unigram model of the same "
                "tokenizer on the same validation tokens: a baseline that a useful model's perplexity is far below.",
            ]

    lines += ["", "## How to use", ""]
    if sentence_model:
        registration = [] if remote_code else ["import hfzoo  # registers the hfzoo model types with the Auto classes"]
        lines += [
            "A sentence-transformers model (`modules.json`: the hfzoo model, then its pooling and other modules):",
            "",
            "```python",
            *registration,
            "from sentence_transformers import SentenceTransformer",
            "",
            f'model = SentenceTransformer("{name}"' + (", trust_remote_code=True)" if remote_code else ")"),
            'embeddings = model.encode(["A first sentence.", "Another one."])',
            "```",
            "",
            "As a transformers model:",
            "",
        ]
    if not auto_name.startswith("Auto"):  # a class of OTHER_MODEL_CLASSES: loaded by its name, from hfzoo
        lines += [
            "```python",
            f"from hfzoo import {auto_name}",
            "from transformers import AutoTokenizer",
            "",
            f'model = {auto_name}.from_pretrained("{name}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
            "```",
        ]
    elif remote_code:
        lines += [
            "The folder contains hfzoo's modeling code, so it loads without hfzoo installed:",
            "",
            "```python",
            f"from transformers import {auto_name}, AutoTokenizer",
            "",
            f'model = {auto_name}.from_pretrained("{name}", trust_remote_code=True)',
            f'tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
            "```",
            "",
            "With hfzoo installed, `import hfzoo` first and the installed classes are used instead.",
        ]
    else:
        lines += [
            "```python",
            "import hfzoo  # registers the hfzoo model types with transformers' Auto classes",
            f"from transformers import {auto_name}, AutoTokenizer",
            "",
            f'model = {auto_name}.from_pretrained("{name}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{name}")',
            "```",
            "",
            "`hfzoo.export.export_for_remote_code` writes a copy that loads with `trust_remote_code=True` "
            "without hfzoo.",
        ]
    if args:
        lines += ["", "## Recipe arguments", "", "```json", json.dumps(args, indent=2, default=str), "```"]
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def files_to_upload(output_dir: str | os.PathLike) -> list[str]:
    """List the files `push_to_hub` would upload: every file except those matched by `IGNORE_PATTERNS`.

    The selection is the one `HfApi.upload_folder` makes with the same `ignore_patterns` (plus
    huggingface_hub's default `.git` / `.cache/huggingface` patterns), via `filter_repo_objects`.

    Args:
        output_dir: the checkpoint folder.

    Returns:
        Sorted paths relative to `output_dir`, with `/` separators.

    Raises:
        NotADirectoryError: `output_dir` is not a folder.
    """
    root = Path(output_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder")
    files = sorted(p.relative_to(root).as_posix() for p in root.glob("**/*") if p.is_file())
    return list(filter_repo_objects(files, ignore_patterns=IGNORE_PATTERNS + DEFAULT_IGNORE_PATTERNS))


def create_hub_repository(repo_id: str, token: str | None = None, private: bool | None = None) -> str:
    """Create the hub model repository `repo_id` unless it exists, and check that it can be used as asked.

    The recipes call it before training when `--push_to_hub` is given, as transformers' `Trainer` creates its
    repository when it starts: a refused token, a missing network or a public repository asked to be private
    then stop the run before any work instead of after it. `push_to_hub` calls it again before uploading.

    Args:
        repo_id: `"user/name"` or `"name"` (the token's user namespace).
        token: a hub token (default: the logged-in one).
        private: create the repository as private (None: the hub's default); an existing repository's
            visibility is not changed, so with True an existing public one is refused.

    Returns:
        The repository's full id, `"user/name"`.

    Raises:
        ValueError: `private=True` and the repository exists and is public.
        huggingface_hub.errors.HfHubHTTPError: the hub refuses the request (authentication, permissions,
            invalid name); the hub client's connection errors without network
            (`huggingface_hub.errors.OfflineModeIsEnabled` with `HF_HUB_OFFLINE=1`).
    """
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id
    if private and not api.model_info(repo_id).private:  # create_repo keeps an existing repository's visibility
        raise ValueError(
            f"a private repository asked for, but the hub repository {repo_id} exists and is public; make it "
            "private on the hub, or use another repository"
        )
    return repo_id


def push_to_hub(
    output_dir: str | os.PathLike,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload hfzoo model",
    training_args: dict[str, Any] | argparse.Namespace | None = None,
) -> str:
    """Upload a checkpoint folder to a hub model repository, with a model card.

    Writes `README.md` (`build_model_card`) when the folder has none, creates the repository if
    needed, and uploads the folder except resumable checkpoints, tracker logs and temporary files
    (`IGNORE_PATTERNS`; see `files_to_upload`).

    Args:
        output_dir: the checkpoint folder (`save_pretrained` output).
        repo_id: `"user/name"` or `"name"` (the token's user namespace).
        token: a hub token (default: the logged-in one).
        private: create the repository as private (None: the hub's default); an existing
            repository's visibility is not changed, so with True an existing public one is refused.
        commit_message: the commit message.
        training_args: recipe arguments for the model card, when it is written here.

    Returns:
        The URL of the commit.

    Raises:
        NotADirectoryError: `output_dir` is not a folder.
        OSError, ValueError: the model card cannot be built (see `build_model_card`).
        ValueError: `private=True` and the repository exists and is public (nothing is uploaded).
        huggingface_hub.errors.HfHubHTTPError: the hub refuses the request (authentication,
            permissions, invalid name); the hub client's connection errors without network (see
            `create_hub_repository`).
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    readme = folder / "README.md"
    if not readme.exists():
        build_model_card(folder, training_args=training_args, model_name=repo_id).save(readme)
    repo_id = create_hub_repository(repo_id, token=token, private=private)
    commit = HfApi(token=token).upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        repo_type="model",
        ignore_patterns=list(IGNORE_PATTERNS),
        commit_message=commit_message,
    )
    return commit.commit_url


__all__ = [
    "CHECKPOINT_DIR",
    "IGNORE_PATTERNS",
    "SECRET_MARKERS",
    "TRACKER_PROJECTS",
    "build_model_card",
    "check_model_path",
    "count_parameters",
    "create_hub_repository",
    "files_to_upload",
    "hub_base_model",
    "is_secret_argument",
    "load_checkpoint_config",
    "public_arguments",
    "push_to_hub",
    "source_error",
]


def check_model_path(name: str, argument: str = "--model_name_or_path") -> None:
    """Refuse a local checkpoint path that is a file or does not exist, before any work.

    A name that can only be a path (absolute, starting with `.`, or of more than two parts) and does not exist is
    refused here, instead of being read as a hub id and refused by the hub's repository-name rules; a name of the
    hub's `namespace/name` form that is not a local folder passes (`load_checkpoint_config` tries the hub).

    Args:
        name: `--model_name_or_path` or `--tokenizer_name` as given (`~` expanded).
        argument: the command-line argument that gave `name`, for the message.

    Raises:
        ValueError: one line naming the argument and the path (`is a file, not a folder`, `no such folder`).
    """
    path = Path(name).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{argument} {name}: is a file, not a folder")
    if not path.exists() and (path.is_absolute() or name.startswith(".") or len(path.parts) > 2):
        raise ValueError(f"{argument} {name}: no such folder")


def load_checkpoint_config(name: str | Path, argument: str = "--model_name_or_path", **kwargs: Any):
    """`transformers.AutoConfig.from_pretrained(name, **kwargs)`, refused in one line naming the argument.

    Args:
        name: a checkpoint folder or a hub id.
        argument: the command-line argument that gave `name`, for the message.
        **kwargs: passed to `AutoConfig.from_pretrained` (`trust_remote_code`, ...).

    Returns:
        The checkpoint's `PreTrainedConfig`.

    Raises:
        ValueError: `name` has no loadable config: no such folder or hub id, a folder without `config.json`, a hub
            id neither reachable nor cached, an unknown `model_type`; the message is
            `"{argument} {name}: <the first line of transformers' error>"`, or for a name that is no local folder
            `"{argument} {name}: not a local folder; as a hub id: <...>"` (a mistyped folder reads as a hub id).
    """
    try:
        return transformers.AutoConfig.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as err:
        raise ValueError(f"{argument} {name}: {source_error(name, err)}") from err


def source_error(name: str | Path, err: Exception) -> str:
    """The first line of a failed `from_pretrained(name)`'s error, saying so when `name` is no local folder.

    Returns:
        `"<first line>"` for an existing path, else `"not a local folder; as a hub id: <first line>"`.
    """
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return first if Path(name).expanduser().exists() else f"not a local folder; as a hub id: {first}"


def local_checkpoint_folder(source: str | Path, allow_patterns: list[str]) -> Path:
    """The local folder of a checkpoint: `source` itself when it is a folder, else a snapshot of the hub id `source`.

    A hub id's files matching `allow_patterns` come through `huggingface_hub.snapshot_download` (the local cache when
    offline, as `from_pretrained` reads it); the folder returned is the snapshot of the repository's current
    revision, in which only those files (and any fetched before) are present.

    Raises:
        OSError: `source` is neither a folder nor a valid hub id, or the hub id cannot be fetched and is not in
            the cache.
    """
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(str(source), allow_patterns=allow_patterns))
    except HFValidationError:
        raise OSError(f"{source}: neither a local folder nor a valid hub id") from None


#: The files of a sentence-transformers model folder at its top level, beside the transformers checkpoint:
#: the module list, the library's own settings, and the transformer module's settings (`max_seq_length`, ...;
#: sentence-transformers reads the first of several `sentence_*_config.json` names).
SENTENCE_TRANSFORMERS_TOP_FILES = ("modules.json", "config_sentence_transformers.json", "sentence_*_config.json")


def copy_sentence_transformers_files(source: str | Path, output_dir: str | Path) -> list[str]:
    """Copy the sentence-transformers configuration of a checkpoint into a folder written from it.

    A sentence-transformers model is a transformers checkpoint plus `modules.json`, which lists its modules
    in order (the transformer, at path `""`, then e.g. `1_Pooling`, `2_Dense`, `2_Normalize`, each a folder of
    its own), `config_sentence_transformers.json` and the transformer module's `sentence_bert_config.json`
    (`max_seq_length`). Converted without them, `SentenceTransformer(output_dir)` would build its default
    (mean pooling, the model's full length, no normalisation or dense layer): other embeddings than the
    source's. These files describe the modules, not the transformer's weights, so they are copied unchanged.

    Args:
        source: the source checkpoint: a local folder, or a hub id (its sentence-transformers files are fetched:
            `local_checkpoint_folder`).
        output_dir: the converted or exported checkpoint folder (existing).

    Returns:
        The paths copied, relative to `output_dir` (module folders as one entry each); empty when the source
        has no `modules.json` (not a sentence-transformers model).

    Raises:
        ValueError: a `modules.json` that is not a list of modules each with a `path` inside the folder.
        OSError: a hub id that cannot be fetched.
    """
    modules_file = local_checkpoint_folder(source, ["modules.json"]) / "modules.json"
    if not modules_file.is_file():
        return []
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("path"), str) for m in modules
    ):
        raise ValueError(f"{modules_file}: expected a list of modules, each with a 'path' (sentence-transformers)")
    paths = [m["path"].rstrip("/") for m in modules if m["path"].rstrip("/")]
    for path in paths:
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ValueError(f"{modules_file}: module path {path!r} is outside the model folder")
    folder = local_checkpoint_folder(source, [*SENTENCE_TRANSFORMERS_TOP_FILES, *(f"{path}/*" for path in paths)])
    output_dir = Path(output_dir)
    copied = []
    for pattern in SENTENCE_TRANSFORMERS_TOP_FILES:
        for file in sorted(folder.glob(pattern)):
            shutil.copyfile(file, output_dir / file.name)
            copied.append(file.name)
    for path in paths:
        if (folder / path).is_dir():  # a module without settings (Normalize) may have no folder
            shutil.copytree(folder / path, output_dir / path, dirs_exist_ok=True)
            copied.append(path)
    return copied
