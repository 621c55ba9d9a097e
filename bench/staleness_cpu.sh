#!/bin/bash
# Issue 23's CPU comparison: the tool-task RL recipe synchronous (max_staleness 0) against max_staleness 1 at the
# same rollout budget, 2 seeds, interleaved (k0 s0, k1 s0, k1 s1, k0 s1) so a drift in the machine falls on both
# schedules; then each run's step times, accuracy and lag, and the simulator calibrated on each synchronous run.
# Needs the tool-task SFT checkpoint: rstar2 train sft --recipe sft-smollm2-tooltasks-cpu (28 min here).
# About 80 min on 2 cores for STEPS=4. Rerun to continue: finished runs are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
RSTAR2=${RSTAR2:-.venv/bin/rstar2}
OUT=${OUT:-runs/async}
STEPS=${STEPS:-4}
DB=$OUT/store.db
STAGES="[{steps: $STEPS, max_response_tokens: 640, max_turns: 3, data: tooltasks, data_seed: 7, data_size: 256}]"
mkdir -p "$OUT"
for run in 0:0 1:0 1:1 0:1; do
  k=${run%%:*} s=${run##*:}; name=async-k$k-s$s
  [ -f "$OUT/$name.done" ] && continue
  echo "$(date +%T) $name"
  "$RSTAR2" train rl --recipe rl-smollm2-tooltasks-cpu "stages=$STAGES" max_staleness="$k" seed="$s" \
    out="$OUT/$name" db="$DB" > "$OUT/$name.log" 2>&1
  touch "$OUT/$name.done"
done
for name in async-k0-s0 async-k1-s0 async-k1-s1 async-k0-s1; do
  "$RSTAR2" train report "$name" --db "$DB" --json | python3 -c '
import json, sys
h = json.load(sys.stdin)
r = lambda key, d=0: [round(m.get(key, 0), d) if d else round(m.get(key, 0)) for m in h]
print(sys.argv[1], "step_time", r("step_time"), "accuracy", r("accuracy", 3), "lag", r("policy_lag_max"),
      "learner_wait_s", r("learner_wait_s"), "time_update", r("time_update"))' "$name"
done
# contention: measured here (auto), or CONTENTION=1 (two jobs that each want both cores run at half speed)
for s in 0 1; do
  "$RSTAR2" bench simulate step --calibrate "async-k0-s$s" --measured async-k1-s0 --measured async-k1-s1 \
    --max-staleness 1 --contention "${CONTENTION:-auto}" --db "$DB"
done
