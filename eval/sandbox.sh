#!/usr/bin/env bash
# The bundled sandbox benchmark end to end, offline: the tasks with the experiential memory, the same
# tasks without it, and one report comparing the two (report.md and plots in OUT/memory).
#
#   bash eval/sandbox.sh [OUT]                  # default OUT: runs/eval-sandbox
#   LIMIT=8 TRIALS=2 bash eval/sandbox.sh       # fewer tasks, more trials
#
# The model is the simulated one (deterministic code, not an LLM); the pipeline, the scorer and the
# memory are real. Interrupted? Run the same command again: each half resumes where it stopped.
set -euo pipefail
OUT="${1:-runs/eval-sandbox}"
AMAPREDUCE="${AMAPREDUCE:-amapreduce}"
flags=(--benchmark sandbox --limit "${LIMIT:-42}" --trials "${TRIALS:-1}" --encoder hashing)
for half in memory no-memory; do
  extra=()
  if [ "$half" = no-memory ]; then extra=(--no-memory); fi
  if [ -d "$OUT/$half" ]; then
    "$AMAPREDUCE" eval run --resume "$OUT/$half"
  else
    "$AMAPREDUCE" eval run "${flags[@]}" "${extra[@]}" --out "$OUT/$half"
  fi
done
"$AMAPREDUCE" eval report "$OUT/memory" --compare "$OUT/no-memory"
