#!/bin/bash
# The GPU figures of docs/performance.md in one short call on a lent GPU machine (repository root):
# BERT-base-shaped simcse_sup at batch 512 in one pass, sdpa_packed and flash_attention_2; one STS-B dev
# evaluation and checkpoint; then `platform bench suite --no-study` while BUDGET seconds last.
# It reads, from the ignored folder .gpu/ carried along: whl/ (wheels the GPU image lacks: pydantic,
# pydantic_core, annotated-types, typing-inspection, datasets, dill, multiprocess, for its Python),
# tok/ (a BERT WordPiece tokenizer: all-MiniLM-L6-v2's files without its weights) and data/ (nli/ and
# senteval/downstream/{STS,SICK} from CLSR_DATA_DIR). Results land in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh
STEPS=${STEPS:-10}; WARM=${WARM:-3}; DEV=${DEV:-auto}
P="python3 -m clsr.cli"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers, sentence_transformers as s; print(torch.__version__, transformers.__version__, s.__version__)"; python3 -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>&1 | tail -1; nproc; } 2>&1 | tee $OUT/env.txt
BB=/tmp/bert-base
python3 -c "from pathlib import Path; from clsr_bench.suite import shaped_encoder; shaped_encoder(Path('$BB'), '$PWD/.gpu/tok')" || exit 1
t0=$(date +%s)
for A in sdpa sdpa_packed flash_attention_2; do
  echo "== b512 $A (t=$(( $(date +%s)-t0 ))s)"
  $P bench train --method simcse_sup --model $BB --batch ${BATCH:-512} --length 32 --steps $STEPS --warmup $WARM --device $DEV --attention $A --json $OUT/b512_$A.json 2>&1 | grep -v Warning | tail -25
done
echo "== eval and checkpoint (t=$(( $(date +%s)-t0 ))s)"
python3 -c "
import json; from clsr_bench.suite import eval_and_checkpoint
r = eval_and_checkpoint('$BB', '$DEV'); print(r); json.dump(r, open('$OUT/evalckpt.json', 'w'))" 2>&1 | tail -5
left=$(( ${BUDGET:-520} - $(date +%s) + t0 ))
echo "== suite, no study, ${left}s left (t=$(( $(date +%s)-t0 ))s)"
[ $left -gt 120 ] && timeout $left $P bench suite --no-study --device $DEV --random-weights $PWD/.gpu/tok --json $OUT/suite.json 2>&1 | grep -v -i "warning\|it/s\|example" | tail -80
echo "== done (t=$(( $(date +%s)-t0 ))s)"
