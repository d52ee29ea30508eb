#!/usr/bin/env bash
# Make .offline/: what a GPU machine without network needs to run hfzoo from this checkout (benchmarks/gpu_session.sh).
#   .offline/wheels/   Python wheels of hfzoo's dependencies at the tested versions (constraints/tested.txt) for
#                      another Python (default 3.12) on x86-64 Linux, except torch and what such machines
#                      usually have (numpy, scipy, pandas, pyarrow, accelerate, ...: see the list below); a
#                      DeepSpeed wheel built here with its compiled ops off (they are built just in time where used)
#   .offline/shared/   the real data the GPU session reads, from $HFZOO_DATA_DIR (default ../shared/data):
#                      Gutenberg shard 00 whole, the first books of shard 01 (36M characters: the tokenizers of
#                      README command 1 and the studies read at most 30M), SST-2, WikiText-2 validation, and
#                      ../shared/reference (the paper's tables)
# Usage: bash scripts/offline_bundle.sh [PYTHON_VERSION]   (run with .venv active or python3 on PATH)
# The folder is git-ignored; copy or carry it with the checkout. About 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
data=${HFZOO_DATA_DIR:-../shared/data}
reference=${HFZOO_REFERENCE_DIR:-$(dirname "$data")/reference}
[ -d "$data/gutenberg" ] || { echo "scripts/offline_bundle.sh: no $data/gutenberg (set HFZOO_DATA_DIR)" >&2; exit 2; }
out=.offline
rm -rf "$out" && mkdir -p "$out/wheels" "$out/shared/data/gutenberg" "$out/shared/data/glue" \
    "$out/shared/data/wikitext-2" "$out/shared/reference"
pin() { sed -n "s/^$1==\([^ ;#]*\).*/$1==\1/p" constraints/tested.txt; }
# hfzoo's needs that a CUDA machine image with torch does not bring at these versions (pure Python, or small).
# DeepSpeed's own requirements come along too: accelerate imports DeepSpeed wherever it is installed, so a DeepSpeed
# missing one of them (0.19.8 imports einops) breaks every accelerate run, not only the DeepSpeed ones.
packages="transformers huggingface-hub tokenizers datasets dill multiprocess evaluate peft hjson pydantic
pydantic-core annotated-types typing-inspection httpx2 httpcore2 truststore idna click fsspec typing-extensions
regex einops msgpack ninja py-cpuinfo kernels tomlkit"
specs=()
for name in $packages; do
    spec=$(pin "$name")
    [ -n "$spec" ] || { echo "scripts/offline_bundle.sh: $name is not pinned in constraints/tested.txt" >&2; exit 2; }
    specs+=("$spec")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/wheels" "${specs[@]}"
# DeepSpeed publishes a source distribution only: build a wheel with its ops off (needs torch here).
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation -w "$out/wheels" "$(pin deepspeed)"
# hfzoo's own requirements (the core and the train extra) and every requirement of a bundled wheel (for that Python
# on x86-64 Linux) must be bundled or be one the GPU machine brings: torch, accelerate, and the requirements of its
# transformers and huggingface_hub (the bundle's newer ones shadow those), plus pandas, pyarrow, requests and xxhash,
# which datasets imported on the H200 machine, and matplotlib, scikit-learn and scipy, with which the training
# curves and the study's GLUE metrics were made there (their wheels would not fit in the 64 MiB carried along).
image="torch accelerate numpy packaging pyyaml safetensors tqdm psutil filelock typer hf-xet anyio h11 requests pandas
pyarrow xxhash matplotlib scikit-learn scipy"
python3 - "$out/wheels" "$py" $image <<'PY' || exit 2
import glob, os, sys, tomllib, zipfile
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
folder, version, image = sys.argv[1], sys.argv[2], {canonicalize_name(name) for name in sys.argv[3:]}
environment = {"python_version": version, "python_full_version": version + ".0", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": "",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
bundled = {canonicalize_name(parse_wheel_filename(os.path.basename(w))[0]) for w in wheels}
missing = {}
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for spec in project["dependencies"] + project["optional-dependencies"]["train"]:
    name = canonicalize_name(Requirement(spec).name)
    if name not in bundled | image:
        missing.setdefault(name, []).append("hfzoo")
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    for line in (line for line in lines if line.startswith("Requires-Dist:")):
        requirement = Requirement(line.split(":", 1)[1])
        name = canonicalize_name(requirement.name)
        if (requirement.marker is None or requirement.marker.evaluate(environment)) and name not in bundled | image:
            missing.setdefault(name, []).append(os.path.basename(wheel).split("-")[0])
if missing:
    sys.exit("scripts/offline_bundle.sh: requirements neither bundled nor on the GPU machine: "
             + "; ".join(f"{name} (of {', '.join(sorted(set(of)))})" for name, of in sorted(missing.items())))
PY
cp "$data/gutenberg/pg_top100_en.00.jsonl.xz" "$out/shared/data/gutenberg/"
python3 - "$data/gutenberg/pg_top100_en.01.jsonl.xz" "$out/shared/data/gutenberg/pg_top100_en.01.jsonl.xz" <<'PY'
import json, lzma, sys
characters = 0
with lzma.open(sys.argv[1], "rt") as source, lzma.open(sys.argv[2], "wt", preset=9) as target:
    for line in source:  # whole books, until 36M characters (more than any tokenizer here reads)
        target.write(line)
        characters += len(json.loads(line).get("text", ""))
        if characters > 36_000_000:
            break
PY
cp -r "$data/glue/SST-2" "$out/shared/data/glue/" && rm -f "$out/shared/data/glue/SST-2/test.tsv"
cp "$data/wikitext-2/wiki.valid.tokens" "$out/shared/data/wikitext-2/"
cp "$reference"/*.tsv "$out/shared/reference/"
du -sh "$out"/*
