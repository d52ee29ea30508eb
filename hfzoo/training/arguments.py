"""Command-line argument types, flags and checks shared by the jobs (pretraining, GLUE finetuning, study).

Each type (`positive_int`, `positive_float`, `random_seed`, `adam_beta`, `torch_compile_backend`,
`scheduler_kwargs`, ...) checks one value when the command line is parsed, so bad input fails in a second with a
message naming the flag; `OneLineErrorParser` prints that message on one line. `check_muon_arguments` and
`check_scheduler_arguments` check values together, before any data is read. The pretraining parser itself is
`hfzoo.pretraining.arguments`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from ..choices import choice_hint
from ..hub import is_secret_argument, public_arguments
from .optimization import MUON_ADJUST_LR_FNS, MuonSettings, create_scheduler

SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)


def _int_at_least(value: str, minimum: int, description: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {description}, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"must be {description}, got {number}")
    return number


def positive_int(value: str) -> int:
    """Argparse type: an integer >= 1.

    Raises:
        argparse.ArgumentTypeError: not an integer, or < 1.
    """
    return _int_at_least(value, 1, "a positive integer")


def non_negative_int(value: str) -> int:
    """Argparse type: an integer >= 0.

    Raises:
        argparse.ArgumentTypeError: not an integer, or < 0.
    """
    return _int_at_least(value, 0, "an integer >= 0")


#: The largest seed every random generator a run seeds accepts (`accelerate.utils.set_seed` seeds NumPy's, whose
#: seeds are 32-bit: 0 to 2**32 - 1).
MAX_SEED = 2**32 - 1


def random_seed(value: str) -> int:
    """Argparse type for `--seed` / `--eval_seed`: an integer in [0, `MAX_SEED`].

    Python's and torch's generators take any integer, NumPy's only this range; without this check a negative
    seed fails in `set_seed` ("Seed must be between 0 and 2**32 - 1"), after the data is read.

    Raises:
        argparse.ArgumentTypeError: not an integer, or outside [0, 2**32 - 1].
    """
    number = _int_at_least(value, 0, f"an integer in [0, {MAX_SEED}]")
    if number > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_SEED}], got {number}")
    return number


def finite_float(value: str) -> float:
    """Argparse type: a finite float (`nan`, `inf` and `-inf`, which `float()` parses, are refused).

    Raises:
        argparse.ArgumentTypeError: not a number, or not finite.
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {number}")
    return number


def positive_float(value: str) -> float:
    """Argparse type: a finite float > 0 (a learning rate).

    Raises:
        argparse.ArgumentTypeError: not a number, <= 0, or not finite (`nan`, `inf`).
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}") from None
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {number}")
    return number


def non_negative_float(value: str) -> float:
    """Argparse type: a finite float >= 0 (a weight decay, a gradient-norm bound).

    Raises:
        argparse.ArgumentTypeError: not a number, < 0, or not finite (`nan`, `inf`).
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}") from None
    if not 0 <= number < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {number}")
    return number


def float_in(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """Argparse type factory: a float within an interval, e.g. `float_in(0, 1, True, True)` for (0, 1).

    Args:
        low: the lower bound.
        high: the upper bound (`math.inf`: none, and infinity itself is refused).
        low_open: whether `low` itself is outside.
        high_open: whether `high` itself is outside.

    Returns:
        The argparse type; it raises `argparse.ArgumentTypeError` (`must be in (0, 1), got 1.5`) for a value
        outside the interval, `nan`, or text that is not a number.
    """
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {shown}, got {value!r}") from None
        above = number > low if low_open else number >= low
        below = number < high if high_open or high == math.inf else number <= high
        if not (above and below):
            raise argparse.ArgumentTypeError(f"must be in {shown}, got {number}")
        return number

    parse.__name__ = f"float in {shown}"
    return parse


def adam_beta(value: str) -> float:
    """Argparse type for `--adam_beta1` / `--adam_beta2`: a float in [0, 1), the range AdamW accepts.

    Source: Kingma & Ba 2015 ("Adam", Algorithm 1: beta1, beta2 in [0, 1)); torch.optim.AdamW raises on
    other values, but only once the optimizer is built, after the data is read.

    Raises:
        argparse.ArgumentTypeError: not a number, or outside [0, 1).
    """
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value!r}") from None
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {number}")
    return number


def torch_compile_backend(value: str) -> str:
    """Argparse type for `--torch_compile_backend`: a backend name `torch.compile` knows.

    The names are `torch.compiler.list_backends(exclude_tags=())`: torch's own backends (debug and
    experimental ones included) and those that installed packages register through the
    `torch_dynamo_backends` entry point. Without this check an unknown name fails only at the first
    compiled call, after the data is read.

    Raises:
        argparse.ArgumentTypeError: an unknown backend; the message lists the known ones.
    """
    known = torch.compiler.list_backends(exclude_tags=())
    if value not in known:
        raise argparse.ArgumentTypeError(f"unknown torch.compile backend {value!r}; known backends: {', '.join(known)}")
    return value


#: `--torch_compile_mode` choices (torch.compile's modes, as transformers' `TrainingArguments.torch_compile_mode`).
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
#: `--torch_compile_scope` choices (`hfzoo.training.compilation.compile_model`): each block of the repeated layers,
#: compiled once and reused by every layer (PyTorch's regional compilation), or the whole model as one graph.
TORCH_COMPILE_SCOPES = ("regions", "model")


def add_speed_arguments(group) -> None:
    """Add the `--torch_compile*` arguments (mode, backend, scope) and `--peak_tflops` to a parser group.

    The compile arguments have transformers' `TrainingArguments` names and meaning (a mode or backend
    given turns compilation on); `--torch_compile_scope` is hfzoo's (default `regions`: PyTorch's regional
    compilation) and does not turn it on by itself: without compilation it is refused (`check_dependent_flags`).
    `hfzoo.training.compilation.compile_model` applies them.

    Args:
        group: an `argparse` parser or argument group.
    """
    group.add_argument(
        "--torch_compile",
        action="store_true",
        help="Compile the model with torch.compile, in place (state-dict keys unchanged); what is compiled: "
        "--torch_compile_scope. Variants that cannot compile cleanly, and DeepSpeed runs, run eagerly, with a warning.",
    )
    group.add_argument(
        "--torch_compile_scope",
        choices=TORCH_COMPILE_SCOPES,
        default=None,
        help="What --torch_compile compiles. regions (default): each layer of the repeated layer stacks, compiled "
        "once and reused by every layer of a stack (PyTorch's regional compilation: the first step compiles one "
        "layer, not all of them), and the output layer with the loss as a region of its own; the embeddings and "
        "the final norm run eagerly. model: the whole model as one graph (compiles for longer, can fuse across "
        "layers).",
    )
    group.add_argument(
        "--torch_compile_mode",
        choices=TORCH_COMPILE_MODES,
        default=None,
        help="torch.compile mode (implies --torch_compile).",
    )
    group.add_argument(
        "--torch_compile_backend",
        type=torch_compile_backend,
        default=None,
        help="torch.compile backend (default inductor; implies --torch_compile).",
    )
    group.add_argument(
        "--peak_tflops",
        type=positive_float,
        default=None,
        help="Peak TFLOP/s of one device for the MFU (default: the GPU's datasheet value, or this CPU's measured "
        "matmul peak, cached in ~/.cache/hfzoo).",
    )


def add_ddp_timeout_argument(group) -> None:
    """Add `--ddp_timeout` (seconds; transformers' `TrainingArguments` name, default 1800) to a parser group.

    `hfzoo.training.accelerator.create_accelerator` passes it to the process group: a collective waits at most that
    long for the other processes, then the run stops with one line naming the process it lost
    (`hfzoo.training.faults.handle_training_faults`).

    Args:
        group: an `argparse` parser or argument group.
    """
    group.add_argument(
        "--ddp_timeout",
        type=positive_int,
        default=1800,
        help="Seconds a collective operation waits for the other processes before the run stops with an error "
        "(a failed or stuck process).",
    )


def checkpointing_steps(value: str) -> str:
    """Argparse type for `--checkpointing_steps`: a positive integer (every N steps) or `epoch`.

    Raises:
        argparse.ArgumentTypeError: neither.
    """
    if value == "epoch":
        return value
    return str(positive_int(value))


def scheduler_kwargs(value: str) -> dict[str, Any]:
    """Argparse type for `--lr_scheduler_kwargs`: a JSON (or YAML flow) mapping, e.g. `'{"min_lr_rate": 0.1}'`.

    Raises:
        argparse.ArgumentTypeError: not a mapping.
    """
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a mapping such as '{{\"min_lr_rate\": 0.1}}', got {value!r}")
    return parsed


class OneLineErrorParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line (`prog: error: message`), without the usage dump."""

    def error(self, message: str):
        """Print `prog: error: message` to stderr and exit with status 2.

        An invalid choice names the closest choices (`hfzoo.choices.choice_hint`) instead of argparse's whole list.
        """
        match = re.fullmatch(r"(argument [^:]+): invalid choice: '(.*)' \(choose from (.*)\)", message, re.DOTALL)
        if match:
            choices = [c.strip().strip("'") for c in match.group(3).split(",")]
            message = f"{match.group(1)}: invalid choice: {match.group(2)!r}; {choice_hint(match.group(2), choices)}"
        self.exit(2, f"{self.prog}: error: {message}\n")


#: `--muon_*` flag -> its `MuonSettings` field; None in the namespace means "not given" (the field's default).
MUON_FLAGS = {
    "muon_learning_rate": "learning_rate",
    "muon_momentum": "momentum",
    "muon_weight_decay": "weight_decay",
    "muon_ns_steps": "ns_steps",
    "muon_adjust_lr_fn": "adjust_lr_fn",
}


def add_muon_arguments(group) -> None:
    """Add the `--muon_*` flags (the settings of `--optim muon`, `hfzoo.training.optimization.MuonSettings`)."""
    group.add_argument(
        "--muon_learning_rate",
        type=positive_float,
        default=None,
        help=f"--optim muon: peak Muon learning rate (default {MuonSettings.learning_rate}; the schedule scales "
        "it like --learning_rate).",
    )
    group.add_argument(
        "--muon_momentum",
        type=float,
        default=None,
        help=f"--optim muon: momentum in [0, 1) (default {MuonSettings.momentum}; Nesterov).",
    )
    group.add_argument(
        "--muon_weight_decay",
        type=non_negative_float,
        default=None,
        help=f"--optim muon: decoupled weight decay of the Muon matrices, >= 0 (default {MuonSettings.weight_decay}).",
    )
    group.add_argument(
        "--muon_ns_steps",
        type=positive_int,
        default=None,
        help=f"--optim muon: Newton-Schulz iterations, 1 to 99 (default {MuonSettings.ns_steps}).",
    )
    group.add_argument(
        "--muon_adjust_lr_fn",
        choices=MUON_ADJUST_LR_FNS,
        default=None,
        help="--optim muon: per-matrix learning-rate scale: original (sqrt(max(1, out/in)), Jordan et al.) or "
        "match_rms_adamw (0.2 sqrt(max(out, in)), Liu et al. 2025) (default original).",
    )


def check_muon_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Refuse (`parser.error`, one line naming the flag) a `--muon_*` flag without `--optim muon`, or a bad value.

    Args:
        args: the parsed namespace (`optim` and the `add_muon_arguments` flags).
        parser: the parser whose `error` reports the problem.
    """
    given = [flag for flag in MUON_FLAGS if getattr(args, flag) is not None]
    if args.optim != "muon":
        if given:
            parser.error(f"--{given[0]} {getattr(args, given[0])} needs --optim muon (got --optim {args.optim})")
        return
    if args.muon_momentum is not None and not 0 <= args.muon_momentum < 1:
        parser.error(f"--muon_momentum must be in [0, 1), got {args.muon_momentum}")
    if args.muon_ns_steps is not None and args.muon_ns_steps >= 100:
        parser.error(f"--muon_ns_steps must be at most 99, got {args.muon_ns_steps}")


def resolve_choice_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace, option: str, flags: dict[str, dict[str, Any]]
) -> None:
    """Refuse the flags that belong to another value of `--option` than the chosen one; fill in the defaults.

    Each value of `--option` (a PEFT method, a pretraining objective) has flags that only it reads: given with
    another value they would be silently ignored. Those flags are parsed with default None (a store_true flag:
    False) so that "given" can be told from "default".

    Args:
        parser: the parser (for its one-line error).
        args: the parsed arguments; each flag not given is set to its default here.
        option: the selecting option's name (`peft`, `objective`).
        flags: `{value of --option: {flag name: default}}`.

    Raises:
        SystemExit: a flag of another value than `args.<option>` was given (argparse's error, naming the flags).
    """
    chosen = getattr(args, option)
    for choice, defaults in flags.items():
        given = [f"--{name}" for name in defaults if getattr(args, name) not in (None, False)]
        if given and chosen != choice:
            parser.error(
                f"{', '.join(given)}: --{option} {choice} only; with --{option} {chosen} they would be ignored"
            )
        for name, default in defaults.items():
            if getattr(args, name) is None:
                setattr(args, name, default)


def compile_requested(args: argparse.Namespace) -> bool:
    """`--torch_compile`, or `--torch_compile_mode` / `--torch_compile_backend` (which imply it, as in transformers)."""
    return bool(
        getattr(args, "torch_compile", False)
        or getattr(args, "torch_compile_mode", None)
        or getattr(args, "torch_compile_backend", None)
    )


#: The recipes' flags that act only with another one (flag -> the flag it needs): without it they would be ignored.
DEPENDENT_FLAGS = {
    "hub_model_id": "push_to_hub",
    "hub_token": "push_to_hub",
    "hub_private_repo": "push_to_hub",
    "report_to": "with_tracking",
}


def refuse_flags_without(parser: argparse.ArgumentParser, args: argparse.Namespace, dependent: dict[str, str]) -> None:
    """Refuse each flag of `dependent` given (not None) without the flag it acts with, where it would be ignored.

    Args:
        parser: the parser (for its one-line error).
        args: the parsed arguments; the dependent flags parse with default None, so that "given" can be told
            from "default".
        dependent: `{flag name: the flag it needs}`.

    Raises:
        SystemExit: argparse's one-line error naming the flag, its value (a token's is not printed) and the flag
            it needs.
    """
    for flag, needed in dependent.items():
        value = getattr(args, flag, None)
        if value is not None and not getattr(args, needed, False):
            shown = "***" if is_secret_argument(flag) else value  # a token (`--hub_token`) is not printed
            given = f"--{flag}" if value is True else f"--{flag} {shown}"  # a switch (`--hub_private_repo`) alone
            parser.error(f"{given} needs --{needed} (without it, it would be ignored)")


def tracker_config(args: argparse.Namespace) -> dict[str, int | float | str | bool]:
    """The run's configuration for `Accelerator.init_trackers` (TensorBoard's hparams, W&B's config, ...).

    The arguments whose values trackers take (int, float, str, bool), secrets left out (`public_arguments`):
    W&B and others upload their config, and TensorBoard writes it into the output folder.
    """
    return {k: v for k, v in public_arguments(args).items() if isinstance(v, (int, float, str, bool))}


#: The recipes' flags that hold a secret, for `secret_free_command` (which also hides their argparse abbreviations).
SECRET_FLAGS = ("--hub_token",)


def _hides_value(flag: str) -> bool:
    """Whether the command-line flag `flag` (`--hub_token`, or an abbreviation argparse accepts) takes a secret."""
    if not flag.startswith("--"):
        return False
    return is_secret_argument(flag) or (len(flag) > 4 and any(secret.startswith(flag) for secret in SECRET_FLAGS))


def secret_free_command(argv: list[str]) -> list[str]:
    """A command line `argv` fit to print: the value of every secret flag (`--hub_token X`, `--hub_token=X`) as `***`.

    Args:
        argv: the arguments (strings), as a recipe's `main` takes them.

    Returns:
        A copy of `argv` with each secret value replaced by `***` (`SECRET_MARKERS`, `SECRET_FLAGS`).
    """
    shown, hide_next = [], False
    for arg in argv:
        flag, equals, _ = arg.partition("=")
        if hide_next:
            shown.append("***")
            hide_next = False
        elif _hides_value(flag):
            shown.append(f"{flag}=***" if equals else arg)
            hide_next = not equals
        else:
            shown.append(arg)
    return shown


def hub_repository(args: argparse.Namespace) -> str:
    """The hub repository `--push_to_hub` uploads to: `--hub_model_id`, else the `--output_dir` folder's name."""
    return args.hub_model_id or Path(args.output_dir).resolve().name


def check_dependent_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a recipe flag given without the flag it acts with, where it would be ignored.

    `DEPENDENT_FLAGS` (`refuse_flags_without`), and `--torch_compile_scope` without compilation (`--torch_compile`,
    `--torch_compile_mode` or `--torch_compile_backend`) and `--overwrite_output_dir` with `--resume_from_checkpoint`
    (one starts over, the other continues); with `--push_to_hub`, a repository name the hub would refuse at the
    end of the run (`--hub_model_id`, else the `--output_dir` folder's name; `huggingface_hub`'s
    `validate_repo_id`); then `--report_to`'s default (`tensorboard`) is filled in when `--with_tracking` is on.

    Raises:
        SystemExit: argparse's one-line error naming the flag, its value and the flag it needs (or what the hub
            expects of a repository name).
    """
    refuse_flags_without(parser, args, DEPENDENT_FLAGS)
    if getattr(args, "push_to_hub", False):
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        name = hub_repository(args)
        try:
            validate_repo_id(name)
        except HFValidationError as err:
            reason = str(err).splitlines()[0]
            if args.hub_model_id:
                parser.error(f"--hub_model_id {name}: not a hub repository id ({reason})")
            parser.error(
                f"--push_to_hub: the repository would be named {name!r} after the --output_dir folder, which is not "
                f"a hub repository id ({reason}); give --hub_model_id"
            )
    if getattr(args, "overwrite_output_dir", False) and args.resume_from_checkpoint:
        parser.error(
            f"--overwrite_output_dir starts over and --resume_from_checkpoint {args.resume_from_checkpoint} continues "
            "a run: give one of them"
        )
    if args.torch_compile_scope is not None and not compile_requested(args):
        parser.error(
            f"--torch_compile_scope {args.torch_compile_scope} needs --torch_compile (or --torch_compile_mode / "
            "--torch_compile_backend, which imply it); without it the model runs eagerly"
        )
    if args.with_tracking and args.report_to is None:
        args.report_to = "tensorboard"
    if args.with_tracking:
        try:
            report_to_trackers(args.report_to)
        except ValueError as err:
            parser.error(str(err))


def report_to_trackers(report_to: str) -> list[str]:
    """The accelerate trackers `--report_to` names (`"tensorboard"`, `"wandb,mlflow"`, `"all"`), each installed.

    As transformers' `Trainer` refuses a `report_to` integration whose package is missing, rather than accelerate's
    warning and a run that logs nothing.

    Args:
        report_to: tracker names separated by commas (or spaces); `all` is every installed tracker.

    Returns:
        The names for `Accelerator(log_with=...)`, in order, each once.

    Raises:
        ValueError: an unknown name (the known ones listed), a tracker whose package is not installed, or `all`
            with none installed (naming the installed trackers).
    """
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    names = list(dict.fromkeys(n for n in re.split(r"[,\s]+", report_to.strip()) if n))
    installed = [str(t) for t in get_available_trackers()]
    known = [*LOGGER_TYPE_TO_CLASS, "all"]
    for name in names:
        if name not in known:
            raise ValueError(f"--report_to {report_to}: {name!r} is not a tracker; {choice_hint(name, known)}")
    if not names:
        raise ValueError(f"--report_to {report_to!r}: names no tracker; give one such as tensorboard")
    if names == ["all"] and not installed:
        raise ValueError('--report_to all: no tracker is installed (tensorboard: pip install "hfzoo[tracking]")')
    missing = [n for n in names if n != "all" and n not in installed]
    if missing:
        packages = " ".join('"hfzoo[tracking]"' if n == "tensorboard" else n for n in missing)
        raise ValueError(
            f"--report_to {report_to}: the package of {', '.join(missing)} is not installed (pip install "
            f"{packages}); installed trackers: {installed or 'none'}"
        )
    return names


@contextlib.contextmanager
def missing_packages_refused(args: argparse.Namespace) -> Iterator[None]:
    """Around building the model: a package the arguments need but that is missing is refused in one line.

    transformers raises `ImportError` when `--attn_implementation` names a kernel whose package is not installed
    (`flash_attention_2` without `flash-attn`, a hub kernel without `kernels`), and when the code of a
    `--trust_remote_code` model imports a package that is not installed; both are the arguments' fault, not a bug.

    Args:
        args: the job's arguments (`attn_implementation`, `model_name_or_path`, `config_name`; any may be absent).

    Raises:
        ValueError: one line naming `--attn_implementation` (when it is neither eager nor sdpa) or the model, with
            transformers' message.
    """
    try:
        yield
    except ImportError as err:
        attention = getattr(args, "attn_implementation", None)
        if attention not in (None, "eager", "sdpa"):
            source = f"--attn_implementation {attention}"
        elif getattr(args, "model_name_or_path", None):
            source = f"--model_name_or_path {args.model_name_or_path}"
        else:
            source = f"--config_name {getattr(args, 'config_name', None)}"
        raise ValueError(f"{source}: {' '.join(str(err).split())}") from None


def check_hub_repository(args: argparse.Namespace, accelerator=None) -> str | None:
    """With `--push_to_hub`: create the run's hub repository before training (`hfzoo.hub.create_hub_repository`).

    As transformers' `Trainer` does when it starts, so that a refused `--hub_token`, no network, or a public
    repository with `--hub_private_repo`, stops the run before any work rather than after it. The main process asks
    the hub and tells the others (one answer for every process).

    Args:
        args: the run's arguments (`push_to_hub`, `hub_model_id`, `hub_token`, `hub_private_repo`, `output_dir`).
        accelerator: the run's `Accelerator` (None: this process alone).

    Returns:
        The repository's full id (`"user/name"`, on every process), None without `--push_to_hub`.

    Raises:
        ValueError: the repository cannot be created (one line naming it, the hub's answer: its error's type and
            first line, the token hidden, and the ways on), or it exists and is public with `--hub_private_repo`.
    """
    from .faults import decide_on_main

    if not getattr(args, "push_to_hub", False):
        return None
    name = hub_repository(args)

    def create() -> str:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import httpx  # the hub's HTTP client, under this name in every release

        from ..hub import create_hub_repository

        try:
            return create_hub_repository(name, token=args.hub_token, private=args.hub_private_repo)
        except (OSError, httpx.HTTPError, HFValidationError) as err:  # the hub's answer, offline mode, the network
            text = str(err).strip().splitlines()
            answer = f"{type(err).__name__}: {text[0] if text else ''}"
            if args.hub_token:
                answer = answer.replace(args.hub_token, "***")
            raise ValueError(
                f"--push_to_hub: cannot create the hub repository {name} ({answer}); check the network and "
                "--hub_token (or `hf auth login`), or train without --push_to_hub and upload the output folder later "
                "(`hf upload`)"
            ) from None
        except ValueError as err:  # an existing public repository with --hub_private_repo
            raise ValueError(f"--hub_private_repo: {err}") from None

    return decide_on_main(accelerator, create, ValueError)


def muon_settings(args: argparse.Namespace) -> MuonSettings | None:
    """The `MuonSettings` of parsed arguments with `--optim muon` (defaults for flags not given), else None."""
    if args.optim != "muon":
        return None
    given = {field: getattr(args, flag) for flag, field in MUON_FLAGS.items() if getattr(args, flag) is not None}
    return MuonSettings(**given)


def check_scheduler_arguments(args: argparse.Namespace) -> None:
    """Build the learning-rate schedule of `args` once, on a dummy parameter, before any data is read.

    A `--lr_scheduler_kwargs` argument the schedule does not take, or a required one missing (`min_lr` or
    `min_lr_rate` for `cosine_with_min_lr`), otherwise fails only when a job builds the schedule after reading
    and tokenizing the data. The total is `--max_train_steps` when given, else a long placeholder (the real total
    is known once the data is counted; the job builds the schedule again then). The jobs call it first thing.

    Args:
        args: parsed arguments with `lr_scheduler_type`, `lr_scheduler_kwargs`, `num_warmup_steps` and
            `max_train_steps`.

    Raises:
        ValueError: `create_scheduler`'s one-line message naming `--lr_scheduler_type` and `--lr_scheduler_kwargs`
            (among them a warmup or schedule arguments with `constant`, which would ignore them).
    """
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    total = args.max_train_steps or args.num_warmup_steps + 1_000_000
    create_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps,
        num_training_steps=total,
        scheduler_kwargs=args.lr_scheduler_kwargs,
    )
