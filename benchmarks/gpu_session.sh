#!/usr/bin/env bash
# hfzoo's GPU measurements in one command on a machine without network: hfzoo runs from this checkout
# (PYTHONPATH), its missing dependencies come from the wheels of .offline/ (scripts/offline_bundle.sh), the data
# from .offline/shared/ (linked as ../shared when that does not exist).
#
# Usage: bash benchmarks/gpu_session.sh [--tiny] [--budget SECONDS] STAGE...
#   check    benchmarks/gpu_check.py, one section at a time, each with its own time limit (so that a slow
#            section leaves time to the next), with --profile_dir and --log_dir (the recipe launches' output,
#            there even when the section runs out of time). Sections and order: $CHECK_SECTIONS (default
#            "training flex recipe generation"; recipe includes deepspeed); limits $T_TRAINING, $T_FLEX, $T_RECIPE,
#            $T_GENERATION seconds (defaults from one H200 with empty compile caches: 180, 150, 150, 120)
#   readme   README command 1 (recipes/gutenberg_decoder.sh)
#   study    the README's GPU study command (recipes/studies/narang_gpu.yaml, 8 processes)
#   --tiny   the same at a tiny size on the CPU (a rehearsal)
# Stages run in the order given, within --budget seconds in all (default 560). Outputs (at most 8 files: logs,
# tables, a tarball of the profiles and results) go to $OUT, default outputs/gpu-session.
set -u
tiny=0 budget=560 stages=()
while [ $# -gt 0 ]; do
    case "$1" in
        --tiny) tiny=1 ;;
        --budget) budget=$2; shift ;;
        check|readme|study) stages+=("$1") ;;
        *) echo "benchmarks/gpu_session.sh: unknown argument $1 (expected check, readme, study, --tiny, --budget S)" >&2
           exit 2 ;;
    esac
    shift
done
[ ${#stages[@]} -gt 0 ] || { echo "benchmarks/gpu_session.sh: name at least one stage: check, readme, study" >&2; exit 2; }
check_sections=${CHECK_SECTIONS:-training flex recipe generation}
for name in $check_sections; do
    case "$name" in
        training|flex|recipe|generation) ;;
        *) echo "benchmarks/gpu_session.sh: CHECK_SECTIONS: unknown section $name (expected training, flex, recipe," \
                "generation)" >&2
           exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
repo=$PWD
[ -d .offline/wheels ] || { echo "benchmarks/gpu_session.sh: no .offline/wheels (run scripts/offline_bundle.sh)" >&2; exit 2; }
start=$SECONDS
out=${OUT:-outputs/gpu-session}
mkdir -p "$out" && out=$(cd "$out" && pwd)
exec > >(tee -a "$out/session.log") 2>&1
left() { echo $((budget - (SECONDS - start))); }
stamp() { echo "[$(date +%T) +$((SECONDS - start))s] $*"; }

site=${HFZOO_OFFLINE_SITE:-/tmp/hfzoo-offline-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .offline/wheels/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$site:$repo"
# the console scripts (and `python`, `accelerate`) without installing hfzoo
bin=/tmp/hfzoo-offline-bin
mkdir -p "$bin"
python3 - "$bin" <<'PY'
import os, sys, tomllib
bin_dir = sys.argv[1]
scripts = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]
code = {name: "import sys; from {} import {} as f; sys.exit(f())".format(*spec.split(":")) for name, spec in scripts.items()}
code["accelerate"] = "import sys; from accelerate.commands.accelerate_cli import main; sys.exit(main())"
for name, body in {**{k: f'exec python3 -c "{v}" "$@"' for k, v in code.items()}, "python": 'exec python3 "$@"'}.items():
    with open(os.path.join(bin_dir, name), "w") as f:
        f.write(f"#!/bin/sh\n{body}\n")
    os.chmod(os.path.join(bin_dir, name), 0o755)
PY
export PATH="$bin:$PATH" VIRTUAL_ENV=${VIRTUAL_ENV:-$site}
[ -e ../shared ] || ln -s "$repo/.offline/shared" ../shared
export HFZOO_DATA_DIR=${HFZOO_DATA_DIR:-$repo/../shared/data}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
python3 - <<'PY' || exit 1
import importlib, re, sys, tomllib
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
# hfzoo's own requirements (the core and the train extra: every stage imports them) by their module names
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
modules = {"scikit-learn": "sklearn", "pyyaml": "yaml"}
required = [re.match(r"[A-Za-z0-9_.-]+", spec)[0].lower() for spec in
            project["dependencies"] + project["optional-dependencies"]["train"]]
missing = []
for name in required + ["deepspeed", "triton", "pyarrow"]:
    module_name = modules.get(name, name.replace("-", "_"))
    try:
        module = importlib.import_module(module_name)
        where = (getattr(module, "__file__", None) or "?").split("/site-packages")[0]
        print(f"{name} {getattr(module, '__version__', '?')} ({where})")
    except Exception as error:  # a missing package shows here, before any stage
        print(f"{name}: IMPORT FAILED: {error!r}")
        missing += [name] if name in required else []
if missing:  # every stage would fail on it: stop now, naming them
    sys.exit(f"benchmarks/gpu_session.sh: hfzoo's requirements {missing} do not import here; add their wheels to "
             ".offline/wheels (scripts/offline_bundle.sh)")
import hfzoo  # noqa: F401
PY
# accelerate imports DeepSpeed wherever its metadata says it is installed: one that fails to import would fail every
# accelerate run, so it leaves (only the check's deepspeed rows then fail, naming it).
if [ -d "$site/deepspeed" ] && ! python3 -c "import deepspeed" > /dev/null 2>&1; then
    echo "deepspeed does not import: removed from $site, the check's deepspeed section will fail"
    rm -rf "$site"/deepspeed "$site"/deepspeed-*.dist-info
fi

if [ "$tiny" = 1 ]; then
    check_args=(--device cpu --tiny --recipe_steps 4)
    # on a fresh CPU machine DeepSpeed first builds its shared-memory op (about 60 s on 2 cores) in the ZeRO launches
    recipe_limit=${T_RECIPE:-320}
    readme_args=(--max_train_steps 6 --max_eval_samples 16)
    study_args=(--max_train_steps 8 --num_warmup_steps 1 --variants "Vanilla Transformer" GeGLU --seeds 0
                --glue_max_train_samples 64 --glue_num_train_epochs 1 --max_eval_samples 16 --parallel_runs 2)
else
    check_args=()
    recipe_limit=${T_RECIPE:-150}
    readme_args=()
    study_args=(--parallel_runs 8)
fi
limited() {  # NAME LIMIT COMMAND...: run within min(LIMIT, time left)
    local name=$1 limit=$2
    shift 2
    [ "$(left)" -lt "$limit" ] && limit=$(left)
    if [ "$limit" -lt 20 ]; then stamp "skip $name: ${limit}s left"; return; fi
    stamp "$name (limit ${limit}s)"
    timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
    stamp "$name: exit $?"
    grep -v '^W[0-9]' "$out/$name.log" | tail -n 30
}
for stage in "${stages[@]}"; do
    case "$stage" in
        check)
            declare -A limit=([training]=${T_TRAINING:-180} [flex]=${T_FLEX:-150} [recipe]=$recipe_limit
                              [generation]=${T_GENERATION:-120})
            for name in $check_sections; do
                sections=("$name")
                [ "$name" = recipe ] && sections=(recipe deepspeed)
                limited "check-$name" "${limit[$name]}" python3 benchmarks/gpu_check.py "${check_args[@]}" \
                    --sections "${sections[@]}" --output_json "$out/check-$name.json" --profile_dir "$out/profiles" \
                    --log_dir "$out/launch-logs"
            done ;;
        readme)
            OUTPUT_DIR=$out/readme1 limited readme1 "${T_README:-240}" bash recipes/gutenberg_decoder.sh "${readme_args[@]}" ;;
        study)
            OMP_NUM_THREADS=2 limited study "${T_STUDY:-540}" python3 -m hfzoo.study --study recipes/studies/narang_gpu.yaml \
                --output_dir "$out/study" "${study_args[@]}" ;;
    esac
done
# at most 8 files come back: logs stay, everything else goes into one tarball
(cd "$out" && tar czf results.tgz --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' --exclude=checkpoints \
    --exclude='*.log' --exclude=results.tgz . 2>/dev/null; find . -mindepth 1 -maxdepth 1 ! -name '*.log' \
    ! -name results.tgz -exec rm -rf {} +)
ls -la "$out"
stamp "done"
