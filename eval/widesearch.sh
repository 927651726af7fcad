#!/usr/bin/env bash
# WideSearch end to end with a real model, as the paper evaluates it (App. D.5): every task, TRIALS
# trials each, the experiential memory learning in task order; then the report.
#
#   MODEL=openai/gpt-5-mini DATA=../shared/data bash eval/widesearch.sh [OUT]
#
# DATA holds widesearch/widesearch.jsonl and widesearch/widesearch_gold/ (not bundled). Optional:
# API_BASE (an OpenAI-compatible endpoint), LIMIT (the first N tasks), TRIALS (default 4), MAX_COST
# (USD for the whole evaluation), JUDGE (a model id for llm_judge columns; default exact), EXECUTOR
# (local, ray or ray:ADDRESS). Interrupted? Run the same command again: it resumes.
set -euo pipefail
: "${MODEL:?set MODEL to a model id, e.g. MODEL=openai/gpt-5-mini}"
: "${DATA:?set DATA to the folder holding widesearch/}"
OUT="${1:-runs/eval-widesearch}"
AMAPREDUCE="${AMAPREDUCE:-amapreduce}"
if [ -d "$OUT" ]; then
  "$AMAPREDUCE" eval run --resume "$OUT"
else
  flags=(--benchmark widesearch --tasks "$DATA/widesearch/widesearch.jsonl"
         --gold-dir "$DATA/widesearch/widesearch_gold" --trials "${TRIALS:-4}" --model "$MODEL"
         --judge "${JUDGE:-exact}" --executor "${EXECUTOR:-local}" --out "$OUT")
  if [ -n "${API_BASE:-}" ]; then flags+=(--api-base "$API_BASE"); fi
  if [ -n "${LIMIT:-}" ]; then flags+=(--limit "$LIMIT"); fi
  if [ -n "${MAX_COST:-}" ]; then flags+=(--max-cost "$MAX_COST"); fi
  "$AMAPREDUCE" eval run "${flags[@]}"
fi
"$AMAPREDUCE" eval report "$OUT"
