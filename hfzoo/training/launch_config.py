"""The `accelerate launch --config_file` a recipe was started with, checked against its engine before any work.

accelerate reads the launch config in the launcher and hands the launched processes only environment
variables (`ACCELERATE_USE_FSDP`, `FSDP_*`, `ACCELERATE_USE_DEEPSPEED`, `ACCELERATE_DEEPSPEED_*`, ...), and
only those of the engine it selected: the keys of another engine are silently dropped (a `deepspeed_config:`
block in an FSDP file, `zero_stage` inside `fsdp_config`). So a launched process finds the file itself
(`find_launch_config`): from the command line of the `accelerate launch` process that started it (its
parent, or an ancestor: the launcher runs torch's elastic agent in its own process), resolved against the
launcher's working directory, or accelerate's default config file when the launcher was given none; with
`HFZOO_ACCELERATE_CONFIG` set, that file. `check_launch_config` then refuses, in one line naming the file
and the key:

- keys of no engine (not a field of accelerate's `ClusterConfig`, not one of its `--fsdp_*` or DeepSpeed
  launch arguments) and the section of another engine than `distributed_type` (`deepspeed_config` with
  `FSDP`, `fsdp_config` with `DEEPSPEED`, either with `MULTI_CPU`/`MULTI_GPU`/`NO`);
- values outside what the engine accepts: FSDP's version, sharding strategy, state-dict type, auto-wrap
  policy, backward prefetch and booleans (accelerate's own lists); DeepSpeed's ZeRO stage and offload
  devices, validated with DeepSpeed's own `DeepSpeedZeroConfig` (its message, made one line);
- a `deepspeed_config_file` that is missing, not JSON, or whose `zero_optimization` DeepSpeed refuses.

When no file can be found (a multi-node DeepSpeed launcher, `torchrun`), `check_launch_environment`
checks the values the launcher exported instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..yaml_input import yaml_problem

#: Set to a launch config file to check that file (e.g. when the launcher's command line is not visible).
CONFIG_ENV = "HFZOO_ACCELERATE_CONFIG"

#: accelerate's `distributed_type` -> the engine section it reads (None: no engine section).
ENGINE_SECTIONS = {"DEEPSPEED": "deepspeed_config", "FSDP": "fsdp_config", "MEGATRON_LM": "megatron_lm_config"}
_SECTION_ENGINES = {section: engine for engine, section in ENGINE_SECTIONS.items()}
_BOOLEAN = (True, False)
#: DeepSpeed keys of a launch config that a `deepspeed_config_file` must hold instead (accelerate refuses both).
_JSON_SETTINGS = {
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero3_save_16bit_model",
}


class LaunchConfigError(ValueError):
    """A launch config that its engine would ignore or refuse (one line naming the file and the key)."""


def _launch_arguments() -> dict[str, set[str]]:
    """The launch arguments of accelerate by group: `{"deepspeed": {...}, "fsdp": {...}}` (their `dest` names)."""
    from accelerate.commands.launch import launch_command_parser

    groups = {"deepspeed": set(), "fsdp": set()}
    for group in launch_command_parser()._action_groups:
        title = (group.title or "").lower()
        for name in groups:
            if title.startswith(name):
                groups[name].update(action.dest for action in group._group_actions)
    return groups


def _fsdp_values() -> dict[str, tuple]:
    """The values accelerate accepts per FSDP key (its constants; strategies also as their 1-based numbers)."""
    from accelerate.utils.constants import (
        FSDP_AUTO_WRAP_POLICY,
        FSDP_BACKWARD_PREFETCH,
        FSDP_SHARDING_STRATEGY,
        FSDP_STATE_DICT_TYPE,
    )

    return {
        "fsdp_version": (1, 2),
        "fsdp_sharding_strategy": (*FSDP_SHARDING_STRATEGY, *range(1, len(FSDP_SHARDING_STRATEGY) + 1)),
        "fsdp_state_dict_type": tuple(FSDP_STATE_DICT_TYPE),
        "fsdp_auto_wrap_policy": tuple(FSDP_AUTO_WRAP_POLICY),
        "fsdp_backward_prefetch": (*FSDP_BACKWARD_PREFETCH, None),
        **{
            key: _BOOLEAN
            for key in (
                "fsdp_offload_params",
                "fsdp_reshard_after_forward",
                "fsdp_forward_prefetch",
                "fsdp_use_orig_params",
                "fsdp_cpu_ram_efficient_loading",
                "fsdp_sync_module_states",
                "fsdp_activation_checkpointing",
                "fsdp_activation_checkpointing_offload",
            )
        },
    }


def _one_line_pydantic(err: Exception) -> tuple[str, str]:
    """`(dotted location, message)` of the first error of a pydantic `ValidationError` (or `("", str(err))`)."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            first = errors()[0]
            return ".".join(str(part) for part in first["loc"]), f"{first['msg']} (got {first.get('input')!r})"
    return "", " ".join(str(err).split())


def _check_zero_section(zero: dict[str, Any], where: str, keys: Mapping[str, str], prefix: str = "") -> None:
    """Validate a ZeRO section with DeepSpeed's `DeepSpeedZeroConfig`; refuse in one line.

    Args:
        zero: the `zero_optimization` dict.
        where: `"FILE: "` prefix for messages.
        keys: DeepSpeed location (`"stage"`, `"offload_param.device"`) -> the key as the user wrote it.
        prefix: put before a location `keys` does not name (e.g. `"zero_optimization."`).
    """
    try:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    except ImportError:
        raise LaunchConfigError(
            f"{where}distributed_type DEEPSPEED needs DeepSpeed: pip install 'hfzoo[deepspeed]'"
        ) from None
    try:
        DeepSpeedZeroConfig(**zero)
    except Exception as err:  # noqa: BLE001 - pydantic's ValidationError (a ValueError), or DeepSpeed's own
        location, message = _one_line_pydantic(err)
        raise LaunchConfigError(
            f"{where}{keys.get(location, prefix + location)}: {message} (DeepSpeed's DeepSpeedZeroConfig)"
        ) from None


def check_deepspeed_json(path: str | os.PathLike, where: str = "") -> dict[str, Any]:
    """Read a DeepSpeed JSON config and validate its `zero_optimization` with DeepSpeed's config class.

    Args:
        path: the JSON file (`deepspeed_config_file` of a launch config).
        where: a prefix naming what points to it, for messages.

    Returns:
        The parsed config.

    Raises:
        LaunchConfigError: a missing or unreadable file, not a JSON object, or a ZeRO section DeepSpeed refuses
            (one line naming the file and the key).
    """
    file = Path(path)
    try:
        config = json.loads(file.read_text())
    except OSError as err:
        raise LaunchConfigError(f"{where}{file}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:
        raise LaunchConfigError(f"{where}{file}: not JSON ({err})") from None
    if not isinstance(config, dict):
        raise LaunchConfigError(f"{where}{file}: expected a JSON object, got {type(config).__name__}")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise LaunchConfigError(f"{file}: zero_optimization: expected an object, got {zero!r}")
    _check_zero_section(zero, f"{file}: ", {}, prefix="zero_optimization.")
    return config


def _check_deepspeed_section(section: dict[str, Any], file: Path, allowed: set[str]) -> None:
    where = f"{file}: "
    for key in section:
        if key not in allowed:
            raise LaunchConfigError(f"{where}deepspeed_config.{key}: not a DeepSpeed setting of accelerate")
    if section.get("deepspeed_config_file") is not None:
        json_file = Path(section["deepspeed_config_file"]).expanduser()
        if not json_file.is_absolute():
            json_file = file.parent / json_file if not json_file.exists() else json_file
        set_here = sorted(set(section) & _JSON_SETTINGS)
        if set_here:
            raise LaunchConfigError(
                f"{where}deepspeed_config.{set_here[0]}: set in {json_file} instead (with deepspeed_config_file "
                "the DeepSpeed JSON holds the ZeRO settings; accelerate refuses both)"
            )
        check_deepspeed_json(json_file, f"{where}deepspeed_config.deepspeed_config_file: ")
        return
    zero: dict[str, Any] = {}
    keys = {}
    if "zero_stage" in section:
        zero["stage"], keys["stage"] = section["zero_stage"], "deepspeed_config.zero_stage"
    for part in ("optimizer", "param"):
        device = section.get(f"offload_{part}_device")
        if device is not None:
            zero[f"offload_{part}"] = {"device": device}
            keys[f"offload_{part}.device"] = f"deepspeed_config.offload_{part}_device"
            keys[f"offload_{part}"] = f"deepspeed_config.offload_{part}_device"
    _check_zero_section(zero, where, keys)
    for key in ("zero3_init_flag", "zero3_save_16bit_model"):
        if key in section and section[key] not in _BOOLEAN:
            raise LaunchConfigError(f"{where}deepspeed_config.{key}={section[key]!r}: expected true or false")


def _check_fsdp_section(section: dict[str, Any], file: Path, allowed: set[str], deepspeed: set[str]) -> None:
    values = _fsdp_values()
    for written, value in section.items():
        key = written if written.startswith("fsdp_") else f"fsdp_{written}"  # accelerate adds the prefix
        if key not in allowed:
            other = (
                " (a DeepSpeed setting: deepspeed_config, with distributed_type DEEPSPEED)"
                if written in deepspeed
                else ""
            )
            raise LaunchConfigError(f"{file}: fsdp_config.{written}: not an FSDP setting of accelerate{other}")
        accepted = values.get(key)
        if accepted is not None and value not in accepted:
            shown = [v for v in accepted if not isinstance(v, int) or isinstance(v, bool) or key == "fsdp_version"]
            raise LaunchConfigError(f"{file}: fsdp_config.{written}={value!r}: FSDP accepts {shown}")


def check_launch_config(path: str | os.PathLike) -> dict[str, Any]:
    """Refuse a launch config file whose keys or values its engine would ignore or refuse (see the module docstring).

    Args:
        path: an `accelerate launch --config_file` YAML (or JSON) file.

    Returns:
        The parsed config.

    Raises:
        LaunchConfigError: one line naming the file, the key and what is expected.
    """
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    file = Path(path)
    try:
        config = yaml.safe_load(file.read_text())
    except OSError as err:
        raise LaunchConfigError(f"{file}: cannot read the launch config ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise LaunchConfigError(f"{file}: not YAML ({yaml_problem(err)})") from None
    if not isinstance(config, dict):
        raise LaunchConfigError(f"{file}: expected a mapping of accelerate settings, got {type(config).__name__}")
    groups = _launch_arguments()
    known = set(ClusterConfig.__dataclass_fields__)
    for key in config:
        if key not in known:
            engine = "DeepSpeed" if key in groups["deepspeed"] else "FSDP" if key in groups["fsdp"] else None
            where = f" (a {engine} setting: put it in its {engine.lower()}_config section)" if engine else ""
            raise LaunchConfigError(f"{file}: {key}: not an accelerate launch setting{where}")
    distributed_type = config.get("distributed_type", "NO")
    if distributed_type not in [t.value for t in DistributedType]:
        raise LaunchConfigError(
            f"{file}: distributed_type={distributed_type!r}: expected one of {[t.value for t in DistributedType]}"
        )
    for section, engine in _SECTION_ENGINES.items():
        if config.get(section) and engine != distributed_type:
            raise LaunchConfigError(
                f"{file}: {section}: settings of {engine}, but distributed_type is {distributed_type} "
                f"(accelerate would ignore them); remove the section or set distributed_type: {engine}"
            )
    if distributed_type == "DEEPSPEED":
        _check_deepspeed_section(config.get("deepspeed_config") or {}, file, groups["deepspeed"])
    elif distributed_type == "FSDP":
        _check_fsdp_section(config.get("fsdp_config") or {}, file, groups["fsdp"], groups["deepspeed"])
    return config


def launcher_config_file(argv: list[str], cwd: Path) -> Path | None | bool:
    """The `--config_file` of an `accelerate launch` command line.

    Returns:
        The file (relative paths resolved against `cwd`), None for a launcher without one, False for a command
        line that is not an accelerate launcher.
    """
    for index, token in enumerate(argv):
        name = Path(token).name
        if name == "accelerate" and index + 1 < len(argv) and argv[index + 1] == "launch":
            rest = argv[index + 2 :]
            break
        if name == "accelerate-launch" or (
            token == "-m" and argv[index + 1 : index + 2] == ["accelerate.commands.launch"]
        ):
            rest = argv[index + (1 if name == "accelerate-launch" else 2) :]
            break
    else:
        return False
    from accelerate.commands.launch import launch_command_parser

    try:  # a launcher prefix without its script (the study's --launcher) gets a stand-in script
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, _ = launch_command_parser().parse_known_args([*rest, "script.py"])
    except SystemExit:
        return False
    if parsed.config_file is None:
        return None
    file = Path(parsed.config_file).expanduser()
    return file if file.is_absolute() else cwd / file


def _process(pid: int) -> tuple[list[str], Path, int] | None:
    """`(command line, working directory, parent pid)` of a process from /proc, or None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
        parent = int(stat.rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return [part.decode(errors="replace") for part in argv if part], cwd, parent


def find_launch_config(environ: Mapping[str, str] | None = None, pid: int | None = None) -> Path | None:
    """The launch config file this process was started with (see the module docstring), or None.

    Args:
        environ: the environment (default `os.environ`).
        pid: the process whose ancestors are searched (default this process).

    Returns:
        `HFZOO_ACCELERATE_CONFIG`, else the `--config_file` of the nearest `accelerate launch` ancestor (or
        accelerate's default config file when it was given none and that file exists); None when the process
        was not launched by accelerate or the launcher cannot be seen.
    """
    environ = os.environ if environ is None else environ
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    if "ACCELERATE_MIXED_PRECISION" not in environ:  # exported by every `accelerate launch`
        return None
    current = os.getpid() if pid is None else pid
    for _ in range(6):  # the launcher, torch's elastic agent in it, a shell or two between
        seen = _process(current)
        if seen is None:
            return None
        argv, cwd, parent = seen
        found = launcher_config_file(argv, cwd)
        if found is None:
            from accelerate.commands.config import default_config_file

            return Path(default_config_file) if Path(default_config_file).is_file() else None
        if found is not False:
            return found
        if parent <= 1:
            return None
        current = parent
    return None


def check_launch_environment(environ: Mapping[str, str] | None = None) -> None:
    """Check the engine values `accelerate launch` exported to this process (when its file cannot be read).

    Raises:
        LaunchConfigError: a ZeRO stage, offload device, FSDP version, sharding strategy or state-dict type
            the engine does not accept, naming the variable.
    """
    environ = os.environ if environ is None else environ
    if environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        zero, keys = {}, {}
        if "ACCELERATE_DEEPSPEED_ZERO_STAGE" in environ:
            with contextlib.suppress(ValueError):
                zero["stage"] = int(environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
            zero.setdefault("stage", environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
            keys["stage"] = "ACCELERATE_DEEPSPEED_ZERO_STAGE"
        for part in ("optimizer", "param"):
            variable = f"ACCELERATE_DEEPSPEED_OFFLOAD_{part.upper()}_DEVICE"
            if variable in environ:
                zero[f"offload_{part}"] = {"device": environ[variable]}
                keys[f"offload_{part}.device"] = keys[f"offload_{part}"] = variable
        _check_zero_section(zero, "the launcher's environment: ", keys)
        if environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
            check_deepspeed_json(environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"], "ACCELERATE_DEEPSPEED_CONFIG_FILE: ")
    if environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        values = _fsdp_values()
        for key in ("fsdp_version", "fsdp_sharding_strategy", "fsdp_state_dict_type"):
            variable = key.upper()
            if variable not in environ:
                continue
            value: Any = environ[variable]
            with contextlib.suppress(ValueError):
                value = int(value)
            if value not in values[key]:
                raise LaunchConfigError(
                    f"the launcher's environment: {variable}={environ[variable]!r}: FSDP accepts "
                    f"{[v for v in values[key] if not isinstance(v, int) or key == 'fsdp_version']}"
                )


def check_launch(environ: Mapping[str, str] | None = None) -> Path | None:
    """Check the launch config this process was started with (`find_launch_config`), else its environment.

    Returns:
        The checked file, or None when the environment was checked instead (or nothing launched this process).

    Raises:
        LaunchConfigError: see `check_launch_config` and `check_launch_environment`.
    """
    file = find_launch_config(environ)
    if file is not None:
        check_launch_config(file)
        return file
    check_launch_environment(environ)
    return None
