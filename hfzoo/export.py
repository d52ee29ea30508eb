"""Export an hfzoo checkpoint that loads with `trust_remote_code=True` where hfzoo is not installed.

transformers' dynamic-module loader (`transformers.dynamic_module_utils`) copies the file named in
`config.json`'s `auto_map` and, recursively, the files it imports *relatively from the same folder*
(`from .x import y`, found by a regular expression over the raw text), then imports them as a package
`transformers_modules.<folder>.<hash>`. hfzoo's sources live in a package tree and use multi-level
relative imports (`from ...modules.stack import HfzooStack`), which that loader cannot follow.

`export_for_remote_code` therefore writes a *flat* copy of every hfzoo source file a family needs
(found by following the imports from the family's config and model classes, not from a fixed list)
next to the weights, with each hfzoo import rewritten to a same-folder import
(`from ...modules.stack import x` -> `from .stack import x`), and an `auto_map` in `config.json`
naming the config class and every Auto class of the family in `hfzoo.AUTO_CLASSES`.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import transformers
import transformers.models.auto as transformers_auto
from transformers.dynamic_module_utils import get_imports, get_relative_imports

from . import AUTO_CLASSES, __version__
from .hub import copy_sentence_transformers_files
from .outputs import write_json_atomic

#: top-level package whose modules are flattened into the checkpoint folder.
PACKAGE = "hfzoo"
#: files `export_for_remote_code` copies along when the source is a checkpoint folder (results, card).
_EXTRA_FILES = ("all_results.json", "eval_results.json", "train_history.json")
# The first line of a `from X import ...` statement: `X` is replaced by the flat module name.
_FROM_LINE = re.compile(r"^(?P<head>\s*from\s+)(?P<module>\.+[\w.]*|[A-Za-z_][\w.]*)(?P<tail>\s+import\b)")


class ExportError(ValueError):
    """An hfzoo source file cannot be flattened into a remote-code checkpoint (collision, unsupported import)."""


def _module_file(module_name: str) -> Path:
    module = sys.modules.get(module_name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec(module_name)
        origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        raise ExportError(f"cannot find the source file of module {module_name!r}")
    return Path(origin)


def _package_of(module_name: str, path: Path) -> str:
    """The package that relative imports in `module_name` are resolved against."""
    return module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]


def _hfzoo_imports(module_name: str, path: Path, source: str) -> list[tuple[ast.ImportFrom, str]]:
    """Return `(node, absolute module name)` for every import of an hfzoo module in one source file.

    Raises:
        ExportError: an import the flat layout cannot express (`import hfzoo...`, `from . import x`,
            an import from a package `__init__`).
    """
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    raise ExportError(
                        f"{where}: `import {alias.name}` cannot be rewritten to a same-folder import; "
                        f"use `from .module import name`"
                    )
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module is None or not (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                    continue  # a third-party import (torch, transformers, ...): kept as is
                target = node.module
            else:
                if node.module is None:
                    raise ExportError(
                        f"{where}: `from {'.' * node.level} import ...` cannot be rewritten (transformers only "
                        f"follows `from .module import name`); import the names from their module"
                    )
                target = importlib.util.resolve_name("." * node.level + node.module, _package_of(module_name, path))
            if _module_file(target).name == "__init__.py":
                raise ExportError(
                    f"{where}: imports from the package {target!r}; a flat export needs imports from the "
                    f"module that defines the names (e.g. `from {target}.submodule import name`)"
                )
            found.append((node, target))
    return found


def family_source_files(config_class: type) -> dict[str, str]:
    """Return the hfzoo modules a family's remote code needs, found by following their imports.

    Starts from the modules of the config class and of every model class registered for it in
    `hfzoo.AUTO_CLASSES`, and adds every hfzoo module they import (relatively or as `hfzoo.x.y`),
    recursively.

    Args:
        config_class: an hfzoo config class, a key of `hfzoo.AUTO_CLASSES`.

    Returns:
        `{flat file name: module name}`, e.g. `{"stack.py": "hfzoo.modules.stack", ...}`, sorted by name.

    Raises:
        KeyError: `config_class` is not a family of `hfzoo.AUTO_CLASSES`.
        ExportError: two modules would get the same flat file name, or an import cannot be rewritten.
    """
    if config_class not in AUTO_CLASSES:
        raise KeyError(f"{config_class.__name__} is not an hfzoo family (keys of hfzoo.AUTO_CLASSES)")
    todo = [config_class.__module__, *(cls.__module__ for cls in AUTO_CLASSES[config_class].values())]
    seen: dict[str, str] = {}  # module name -> flat file name
    while todo:
        module_name = todo.pop()
        if module_name in seen:
            continue
        path = _module_file(module_name)
        seen[module_name] = path.name
        source = path.read_text(encoding="utf-8")
        todo.extend(target for _, target in _hfzoo_imports(module_name, path, source))
    by_file: dict[str, str] = {}
    for module_name, file_name in seen.items():
        if file_name in by_file:
            raise ExportError(
                f"{by_file[file_name]} and {module_name} would both be written as {file_name} in the flat export"
            )
        by_file[file_name] = module_name
    return dict(sorted(by_file.items()))


def flatten_source(module_name: str) -> str:
    """Return the source of an hfzoo module with its hfzoo imports rewritten to same-folder imports.

    `from ...modules.stack import x` and `from hfzoo.modules.stack import x` both become
    `from .stack import x`; everything else (third-party imports, docstrings, code) is unchanged.

    Args:
        module_name: the module, e.g. `"hfzoo.models.decoder.modeling_decoder"`.

    Returns:
        The rewritten source, with a comment naming its origin as the first line.

    Raises:
        ExportError: an import that cannot be rewritten (see `family_source_files`).
    """
    path = _module_file(module_name)
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    for node, target in _hfzoo_imports(module_name, path, source):
        index = node.lineno - 1
        flat = "." + target.rpartition(".")[2]
        new_line, count = _FROM_LINE.subn(
            lambda m, flat=flat: m.group("head") + flat + m.group("tail"), lines[index], count=1
        )
        if count != 1:
            raise ExportError(f"{path}:{node.lineno}: cannot rewrite the import on this line: {lines[index]!r}")
        lines[index] = new_line
    relative = path.resolve().relative_to(Path(__file__).resolve().parent.parent).as_posix()
    header = (
        f"# Exported from {relative} (hfzoo {__version__}) by hfzoo.export.export_for_remote_code;\n"
        "# hfzoo imports were rewritten to same-folder imports so that the file loads with trust_remote_code=True.\n"
    )
    return header + "".join(lines)


def _check_flat_file(path: Path, expected: set[str], available: set[str]) -> None:
    """Check a written file the way transformers' loader will read it (regex over the raw text)."""
    found = set(get_relative_imports(path))
    if found != expected:
        raise ExportError(
            f"{path.name}: transformers' loader sees the same-folder imports {sorted(found)}, but the code "
            f"imports {sorted(expected)} (an import-like line in a string or a multi-level import?)"
        )
    missing = sorted(name for name in found if f"{name}.py" not in available)
    if missing:
        raise ExportError(f"{path.name}: imports {missing}, which are not in the export")
    if PACKAGE in get_imports(path):
        raise ExportError(f"{path.name}: still imports {PACKAGE}")


def _family_of(config: Any) -> type:
    for cls in type(config).__mro__:
        if cls in AUTO_CLASSES:
            return cls
    raise ValueError(
        f"{type(config).__name__} (model_type {getattr(config, 'model_type', None)!r}) is not an hfzoo family; "
        f"expected one of {[c.__name__ for c in AUTO_CLASSES]}"
    )


def _load_model(path: Path):
    config = transformers.AutoConfig.from_pretrained(path)
    family = _family_of(config)
    by_name = {cls.__name__: cls for cls in AUTO_CLASSES[family].values()}
    names = getattr(config, "architectures", None) or []
    classes = [by_name[name] for name in names if name in by_name]
    if not classes:
        raise ValueError(
            f"{path}: config.json names the architectures {names}; expected one of {sorted(by_name)} "
            f"for model_type {config.model_type!r}"
        )
    return classes[0].from_pretrained(path, config=config)


def auto_map_for(config_class: type, files: dict[str, str]) -> dict[str, str]:
    """Return the `auto_map` of a family: AutoConfig and each of its Auto classes -> `"module.Class"`.

    The names follow transformers' own convention (`custom_object_save`: the last component of the
    class's module, then the class name), which is exactly the flat file name without `.py`.

    Args:
        config_class: an hfzoo config class, a key of `hfzoo.AUTO_CLASSES`.
        files: the export's `{flat file name: module name}` (from `family_source_files`).

    Returns:
        e.g. `{"AutoConfig": "configuration_decoder.HfzooDecoderConfig",
        "AutoModelForCausalLM": "modeling_decoder.HfzooDecoderForCausalLM", ...}`.

    Raises:
        ExportError: a class whose module is not among `files`, or an Auto class transformers does
            not have (the check `PreTrainedModel.register_for_auto_class` makes).
    """
    entries = {"AutoConfig": config_class, **{auto.__name__: cls for auto, cls in AUTO_CLASSES[config_class].items()}}
    auto_map = {}
    for auto_name, cls in entries.items():
        if not hasattr(transformers_auto, auto_name):
            raise ExportError(f"{auto_name} is not a transformers Auto class")
        file_name = cls.__module__.rpartition(".")[2] + ".py"
        if files.get(file_name) != cls.__module__:
            raise ExportError(f"{cls.__name__} is defined in {cls.__module__}, which is not in the export")
        auto_map[auto_name] = f"{file_name[:-3]}.{cls.__name__}"
    return auto_map


def export_for_remote_code(
    model: Any,
    output_dir: str | os.PathLike,
    tokenizer: Any | None = None,
) -> Path:
    """Write a checkpoint folder that loads with `trust_remote_code=True` without hfzoo installed.

    The folder holds the weights (`save_pretrained`, safetensors), `config.json` with an `auto_map`
    for `AutoConfig` and every Auto class of the model's family in `hfzoo.AUTO_CLASSES`, a flat copy
    of the hfzoo source files the family needs (imports rewritten to same-folder imports), and the
    tokenizer. Afterwards, in any environment with transformers and torch:

    ```python
    model = AutoModelForCausalLM.from_pretrained(output_dir, trust_remote_code=True)
    ```

    (With `import hfzoo` done, transformers prefers the installed hfzoo classes.) For a local folder,
    transformers imports the config file and the modeling file as two packages named by a hash of
    each file's import closure, so `type(model.config)` is not the very class object
    `type(model).config_class` (same source, same name); transformers does not require it to be.

    Args:
        model: an hfzoo model (e.g. `HfzooDecoderForCausalLM`), or the path of a checkpoint folder
            saved by `save_pretrained`; a folder's tokenizer and results files (`all_results.json`,
            `eval_results.json`, `train_history.json`) are exported with it, and so are the modules of a
            sentence-transformers model (`modules.json`, pooling, ...: `SentenceTransformer(output_dir,
            trust_remote_code=True)` then computes the same embeddings), not its README.md (whose
            loading instructions would be wrong; `hfzoo.hub.build_model_card` writes a new one). When
            `output_dir` is that same folder, only the code files and `auto_map` are added (the
            weights are left as they are).
        output_dir: the folder to write (created if needed).
        tokenizer: a tokenizer to save beside the model (default: the checkpoint folder's, if any).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        ValueError: the model or checkpoint is not an hfzoo model of a registered family, or the folder's
            sentence-transformers `modules.json` lists a module outside it.
        ExportError (a `ValueError`): a source file cannot be flattened (name collision, an import
            that cannot be rewritten).
        OSError: the checkpoint folder cannot be read or `output_dir` cannot be written.
    """
    output_dir = Path(output_dir)
    source_dir = None
    in_place = False
    if isinstance(model, (str, os.PathLike)):
        source_dir = Path(model)
        if not (source_dir / "config.json").is_file():
            raise OSError(f"{source_dir}: not a checkpoint folder (no config.json)")
        in_place = output_dir.resolve() == source_dir.resolve()
        if in_place:
            config = transformers.AutoConfig.from_pretrained(source_dir)
            model = None
        else:
            model = _load_model(source_dir)
            config = model.config
    else:
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(f"{type(model).__name__} is not a transformers model (no .config)")
    family = _family_of(config)
    if model is not None and type(model) not in AUTO_CLASSES[family].values():
        raise ValueError(
            f"{type(model).__name__} is not one of the {family.model_type} classes "
            f"{[cls.__name__ for cls in AUTO_CLASSES[family].values()]}, so the exported code would not define it"
        )

    files = family_source_files(family)
    auto_map = auto_map_for(family, files)
    sources = {file_name: flatten_source(module_name) for file_name, module_name in files.items()}

    output_dir.mkdir(parents=True, exist_ok=True)
    if model is not None:
        model.save_pretrained(output_dir, safe_serialization=True)
    if tokenizer is None and source_dir is not None and not in_place:
        if (source_dir / "tokenizer_config.json").is_file():
            tokenizer = transformers.AutoTokenizer.from_pretrained(source_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    if source_dir is not None and not in_place:
        for name in _EXTRA_FILES:
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, output_dir / name)
        copy_sentence_transformers_files(source_dir, output_dir)

    for file_name, text in sources.items():
        (output_dir / file_name).write_text(text, encoding="utf-8")
    for file_name, module_name in files.items():
        path = _module_file(module_name)
        expected = {
            target.rpartition(".")[2]
            for _, target in _hfzoo_imports(module_name, path, path.read_text(encoding="utf-8"))
        }
        _check_flat_file(output_dir / file_name, expected, set(files))

    # `auto_map` is written here rather than through `register_for_auto_class` + `save_pretrained`:
    # that mechanism stores ONE Auto class per class (`cls._auto_class`, a class attribute, so it would
    # also change every later `save_pretrained` of the in-package classes), and `custom_object_save`
    # copies the class's file and its relative imports verbatim, with their multi-level imports, which
    # the loader cannot resolve in the flat folder. The names follow the same `module.Class` convention.
    config_path = output_dir / "config.json"
    config_dict = json.loads(config_path.read_text(encoding="utf-8"))
    config_dict["auto_map"] = auto_map
    write_json_atomic(config_path, config_dict, sort_keys=True)
    return output_dir


__all__ = ["ExportError", "auto_map_for", "export_for_remote_code", "family_source_files", "flatten_source"]
