#!/bin/bash
# Issue 17's open GPU figures and issue 55's determinism check on a lent GPU machine (repository root),
# ~12 minutes in all (STEPS picks them):
#   1. Table 3's transfer fits on the card (eval.transfer_device: auto: the SentEval PyTorch stacks in
#      the trial's process) on hashed bags of words, MR, CR and SUBJ: against the 153 / 67 / 122 s that
#      two CPU processes took on the H200 machine (docs/performance.md);
#   2. `platform study plan studies/gclsr_ablations.yaml --probe` with the fits on the card: eight copies
#      of Table 3's trial (components) and of a Table 5 trial (weight_decay) at once, and the full
#      study's projection on one GPU from them (target: 20 minutes);
#   3. issue 55's determinism on the card: MiniLM with trainer.deterministic: true run twice, and once
#      SIGKILLed after its first checkpoint and resumed, each pair bitwise equal (final checkpoints, weights
#      digest, MLflow histories; python -m clsr_bench.determinism, exit 1 on a difference). The result,
#      $OUT/determinism.json, goes into docs/training.md's Determinism section.
# Set-up as benchmarks/gpu_check.sh (both source benchmarks/gpu_env.sh): the ignored folder .gpu/ carried
# along holds whl/ (wheels the GPU image lacks, for its Python: gpu_check.sh's list plus gensim,
# smart_open and wrapt) and data/ (wiki/,
# senteval/downstream/ and sts_original/ from CLSR_DATA_DIR). The word vectors are random ones in
# word2vec's binary format for the carried data's words (benchmarks/random_word2vec.py). Results: $OUT.
# Knobs (defaults for the GPU): FITDEV=cuda TASKS=mr,cr,subj FIT_S=200 FIT_ARGS= PROBE_S=280 GPU=(the card's)
# DET_S=240 DET_MODEL=minilm STEPS="fits probe determinism" (the three pass one call's 10 minutes: run
# STEPS="fits probe" in one device call and STEPS=determinism, up to 4 minutes, in another)
# PROBE_ARGS= (a CPU rehearsal: docs/performance.md, "Study throughput")
# shellcheck disable=SC2086  # FIT_ARGS and PROBE_ARGS are lists of arguments
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc; python3 -c "import torch; print(torch.__version__)"; } | tee "$OUT/env.txt"
VEC=/tmp/random-300.bin
# the projection's GPU kind: the card's own (the device tool may lend an H200 for an H100)
GPU=${GPU:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o -i -m1 'h100\|h200\|a100' | tr '[:upper:]' '[:lower:]')}
GPU=${GPU:-h100}
STEPS=${STEPS:-fits probe determinism}
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if step fits || step probe; then python3 benchmarks/random_word2vec.py "$CLSR_DATA_DIR" $VEC || exit 1; fi
if step fits; then
echo "== transfer fits on ${FITDEV:-cuda} (t=$(( $(date +%s)-t0 ))s)"
timeout "${FIT_S:-200}" python3 benchmarks/transfer_eval.py --embedding bow --tasks "${TASKS:-mr,cr,subj}" \
  --fit-device "${FITDEV:-cuda}" ${FIT_ARGS:-} 2>&1 | grep --line-buffered -v -i warning | tee "$OUT/transfer_fits.txt" | tail -20
fi
if step probe; then
echo "== study plan --probe: components and weight_decay, fits on the card (t=$(( $(date +%s)-t0 ))s)"
timeout "${PROBE_S:-280}" python3 -m clsr.cli study plan studies/gclsr_ablations.yaml --probe \
  --probe-ablation components --probe-ablation weight_decay --gpus 1 --gpu "$GPU" \
  --set base.model.vectors=$VEC --set base.eval.transfer_device=auto ${PROBE_ARGS:-} 2>&1 \
  | grep --line-buffered -v -i "warning\|it/s" | tee "$OUT/plan.txt" | tail -60
fi
if step determinism; then
  echo "== determinism: ${DET_MODEL:-minilm} twice, and killed + resumed, trainer.deterministic: true (t=$(( $(date +%s)-t0 ))s)"
  rm -rf /tmp/determinism
  timeout "${DET_S:-240}" python3 -m clsr_bench.determinism --folder /tmp/determinism --model "${DET_MODEL:-minilm}" \
    --json "$OUT/determinism.json" 2>&1 | grep --line-buffered -v -i "warning\|it/s" | tail -20
  echo "determinism exit: ${PIPESTATUS[0]} (0: both pairs bitwise equal; 124: out of time)"
fi
echo "== done (t=$(( $(date +%s)-t0 ))s)"
