"""The training core that the jobs share (`hfzoo.pretraining`, `hfzoo.finetuning`, `hfzoo.study`).

- `accelerator.py`: `create_accelerator` (one process, DDP, DeepSpeed; mixed precision; timeouts).
- `precision.py`: `--mixed_precision auto` (bf16 where the GPU or CPU computes it natively, else fp32) and the
  CPU's capability class (honouring `ONEDNN_MAX_CPU_ISA` / `ATEN_CPU_CAPABILITY` caps).
- `optimization.py`: AdamW parameter groups (no weight decay on vectors, scalars, norms); the schedule.
- `objectives.py`: the pretraining objective registry (clm | mlm | span) and its collators.
- `streaming.py`: packed blocks streamed from files, and a device-side prefetching loader.
- `checkpointing.py`: atomic checkpoints with a manifest, verification, the choice of what to resume.
- `faults.py`: preemption signals, non-finite steps, failed processes, exit codes.
- `throughput.py`: tokens/s, TFLOP/s and MFU from the model's FLOPs (`hfzoo.models.flops`).
- `compilation.py`, `runtime.py`: `torch.compile` and process-level settings (allocator, SDPA backends).
- `arguments.py`: argument types and flags shared by the jobs' command lines.
- `plots.py`: the training-curve and result plots the jobs write.

The core imports the model code and `hfzoo.data`, never a job. Importing `hfzoo` does not import this
package (it needs the `train` extra).

The modules that lived here before the jobs had folders of their own (`MOVED_MODULES`) still import
under their old names, with a `DeprecationWarning`, until hfzoo 0.3; `python -m` under an old name runs
the new module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: Old module path -> where it lives now (the old paths import with a DeprecationWarning until hfzoo 0.3).
MOVED_MODULES = {
    "hfzoo.training.pretraining": "hfzoo.pretraining.loop",
    "hfzoo.training.evaluation": "hfzoo.pretraining.evaluation",
    "hfzoo.training.consolidate": "hfzoo.pretraining.consolidate",
    "hfzoo.training.train_tokenizer": "hfzoo.pretraining.tokenizer",
    "hfzoo.training.glue": "hfzoo.finetuning.glue",
    "hfzoo.training.glue_loop": "hfzoo.finetuning.loop",
    "hfzoo.training.glue_outputs": "hfzoo.finetuning.outputs",
    "hfzoo.training.glue_sweep": "hfzoo.finetuning.sweep",
    "hfzoo.training.peft_utils": "hfzoo.finetuning.adapters",
    "hfzoo.training.study": "hfzoo.study.runner",
    "hfzoo.training.study_report": "hfzoo.study.report",
    "hfzoo.training.flops": "hfzoo.models.flops",
}
#: `python -m OLD` runs the job's package where it is the same command (its `__main__`).
_RUN_AS = {
    "hfzoo.training.pretraining": "hfzoo.pretraining",
    "hfzoo.training.glue": "hfzoo.finetuning",
    "hfzoo.training.study": "hfzoo.study",
}


def _warn_moved(old: str) -> None:
    """Warn that `old` moved, attributed to the line that imported it (not to the import machinery)."""
    # `warnings` skips the frames of importlib's bootstrap itself; skip this file and `importlib.import_module`.
    frame, level = sys._getframe(1), 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            level += 1
            if name not in (__file__, importlib.__file__):
                break
        frame = frame.f_back
    warnings.warn(
        f"{old} moved to {MOVED_MODULES[old]}; the old name is deprecated and will be removed in hfzoo 0.3",
        DeprecationWarning,
        stacklevel=level,
    )


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path of `MOVED_MODULES` as the module it moved to (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        """A spec for the old paths of `MOVED_MODULES`; None for every other name."""
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def exec_module(self, module) -> None:
        """Put the new module under the old name (the import system then returns it)."""
        _warn_moved(module.__name__)
        sys.modules[module.__name__] = importlib.import_module(MOVED_MODULES[module.__name__])

    def get_code(self, fullname):
        """For `python -m OLD`: code that warns, then runs the new module as `__main__`."""
        target = _RUN_AS.get(fullname, MOVED_MODULES[fullname])
        source = (
            "import runpy, warnings\n"
            f"warnings.warn({fullname!r} + ' moved to ' + {MOVED_MODULES[fullname]!r} + '; the old name is "
            "deprecated and will be removed in hfzoo 0.3', DeprecationWarning, stacklevel=1)\n"
            f"runpy.run_module({target!r}, run_name='__main__', alter_sys=True)\n"
        )
        return compile(source, f"<{fullname}: moved to {MOVED_MODULES[fullname]}>", "exec")


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
