#!/bin/bash
# BEFORE: a worktree of c80f305 (git worktree add ../before c80f305); AFTER: this checkout. Run from anywhere.
BEFORE=${BEFORE:?set BEFORE to a checkout of c80f305}; AFTER=${AFTER:-$(cd "$(dirname "$0")/../../.." && pwd)}
# A/B: `platform study validate studies/smoke.yaml` at the code before the house issue (c80f305) and now,
# alternating, whole-process wall time from /usr/bin/time.
cd $AFTER
for i in 1 2 3 4 5; do
  for side in before after; do
    if [ $side = before ]; then pp=$BEFORE/platform; else pp=$AFTER/platform; fi
    /usr/bin/time -f "$side %e s %M KB" env PYTHONPATH=$pp python -c "import sys; from clsr.cli import run; sys.argv=['platform','study','validate','studies/smoke.yaml']; run()" >/dev/null 2>>validate_ab.txt
  done
done
