#!/usr/bin/env bash
# The main job, end to end on real data (README command 1):
#   1. train a byte-level BPE tokenizer on Gutenberg shard 01,
#   2. pretrain a small decoder on shard 00 with `accelerate launch` (5% of its books held out),
#   3. in a fresh process: reload with AutoModelForCausalLM.from_pretrained, evaluate on WikiText-2
#      validation and print a greedy sample, generated with and without the KV cache (a difference fails the job).
# Data: $HFZOO_DATA_DIR (default ../shared/data beside the checkout). Output: $OUTPUT_DIR (default outputs/gutenberg-decoder).
# Extra arguments are passed to recipes/pretrain.py (hfzoo-pretrain) (e.g. --max_train_steps 200 for a quicker run).
# It checkpoints every 500 steps: run it again with --resume_from_checkpoint latest to continue a killed run, or
# with --overwrite_output_dir to start over (a new run beside an earlier run's checkpoints is refused).
# With a CUDA GPU (and HFZOO_DEVICE unset or cuda) it pretrains there: one GPU, bf16, SDPA, --torch_compile;
# HFZOO_DEVICE=cpu runs on the CPU anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
DATA=${HFZOO_DATA_DIR:-../shared/data}
OUT=${OUTPUT_DIR:-outputs/gutenberg-decoder}
mkdir -p "$OUT"
SECONDS=0
DEVICE=${HFZOO_DEVICE:-auto}
LAUNCH_ARGS=()
case "$DEVICE" in auto|cpu|cuda) ;; *) echo "error: HFZOO_DEVICE=$DEVICE: expected auto, cpu or cuda" >&2; exit 2 ;; esac
if [ "$DEVICE" = auto ]; then
    DEVICE=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
if [ "$DEVICE" = cuda ]; then
    LAUNCH_CONFIG=accelerate_configs/single_gpu.yaml
    DEVICE_ARGS=(--attn_implementation sdpa --torch_compile)
else
    LAUNCH_CONFIG=accelerate_configs/cpu_single_process.yaml
    DEVICE_ARGS=()
    # accelerate's own choice for one CPU process, a thread per physical core, given so that it does not warn
    # that it chose it (OMP_NUM_THREADS, when set, is used instead, as accelerate does)
    if [ -z "${OMP_NUM_THREADS:-}" ]; then
        LAUNCH_ARGS=(--num_cpu_threads_per_process "$(python -c 'import psutil; print(psutil.cpu_count(logical=False) or 1)')")
    fi
fi
echo "device: $DEVICE (accelerate config $LAUNCH_CONFIG)"

echo "== 1/3 tokenizer =="
hfzoo-train-tokenizer \
    --train_file "$DATA/gutenberg/pg_top100_en.01.jsonl.xz" --max_characters 30000000 \
    --vocab_size 4096 --min_frequency 2 --model_family decoder --output_dir "$OUT/tokenizer"

echo "== 2/3 pretraining (accelerate launch) =="
# --quiet: a run that stops with an error ends with its own one-line message, not the launcher's traceback around it
accelerate launch --quiet "${LAUNCH_ARGS[@]}" --config_file "$LAUNCH_CONFIG" recipes/pretrain.py \
    --config recipes/configs/decoder_gutenberg.yaml "${DEVICE_ARGS[@]}" \
    --train_file "$DATA/gutenberg/pg_top100_en.00.jsonl.xz" \
    --tokenizer_name "$OUT/tokenizer" --output_dir "$OUT/model" "$@"

echo "== 3/3 reload in a fresh process, evaluate on WikiText-2, generate =="
hfzoo-evaluate-lm --model_name_or_path "$OUT/model" \
    --validation_file "$DATA/wikitext-2/wiki.valid.tokens" \
    --prompt "It was a dark and stormy night, and" --max_new_tokens 32 --output_file "$OUT/evaluation.json"

python - "$OUT/model/all_results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"held-out books: perplexity {r['perplexity']:.2f}, unigram (add-one) perplexity {r['unigram_perplexity']:.2f}, "
      f"ratio {r['perplexity_ratio_to_unigram']:.3f}; {r['train_steps']} steps, {r['train_tokens_seen']:,} tokens, "
      f"{r['train_tokens_per_second']:.0f} tokens/s")
PY
echo "done in ${SECONDS}s; outputs in $OUT"
