#!/usr/bin/env bash
# WideSearch or DeepWideSearch end to end with a real model, as the paper evaluates it (App. D.5):
# every task, TRIALS trials each, the experiential memory learning in task order; then the report.
#
#   MODEL=openai/gpt-5-mini DATA=../shared/data bash eval/benchmark.sh widesearch [OUT]
#   MODEL=openai/gpt-5-mini DATA=../shared/data bash eval/benchmark.sh deepwidesearch [OUT]
#
# DATA holds widesearch/ and deepwidesearch/ (the data sets are not bundled). Optional: API_BASE (an
# OpenAI-compatible endpoint), LIMIT (the first N tasks), TRIALS (default 4), MAX_COST (USD for the
# whole evaluation), JUDGE (a model id for llm_judge columns; default exact), EXECUTOR (local, ray
# or ray:ADDRESS). Interrupted? Run the same command again: it resumes.
set -euo pipefail
BENCHMARK="${1:?name the benchmark: widesearch or deepwidesearch}"
: "${MODEL:?set MODEL to a model id, e.g. MODEL=openai/gpt-5-mini}"
: "${DATA:?set DATA to the folder holding widesearch/ and deepwidesearch/}"
case "$BENCHMARK" in
  widesearch) tasks="$DATA/widesearch/widesearch.jsonl" gold="$DATA/widesearch/widesearch_gold" ;;
  deepwidesearch) tasks="$DATA/deepwidesearch/overall_20250916.jsonl" gold="$DATA/deepwidesearch/overall_20250916_tables" ;;
  *) echo "unknown benchmark '$BENCHMARK': use widesearch or deepwidesearch" >&2; exit 2 ;;
esac
OUT="${2:-runs/eval-$BENCHMARK}"
AMAPREDUCE="${AMAPREDUCE:-amapreduce}"
if [ -d "$OUT" ]; then
  "$AMAPREDUCE" eval run --resume "$OUT"
else
  flags=(--benchmark "$BENCHMARK" --tasks "$tasks" --gold-dir "$gold" --trials "${TRIALS:-4}" --model "$MODEL"
         --judge "${JUDGE:-exact}" --executor "${EXECUTOR:-local}" --out "$OUT")
  if [ -n "${API_BASE:-}" ]; then flags+=(--api-base "$API_BASE"); fi
  if [ -n "${LIMIT:-}" ]; then flags+=(--limit "$LIMIT"); fi
  if [ -n "${MAX_COST:-}" ]; then flags+=(--max-cost "$MAX_COST"); fi
  "$AMAPREDUCE" eval run "${flags[@]}"
fi
"$AMAPREDUCE" eval report "$OUT"
