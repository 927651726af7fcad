#!/usr/bin/env bash
# The offline stand-ins' ceiling: every gold table written as an answer and scored as one
# (docs/scorer-rules.md §11; WideSearch: 163/200 successes, mean row F1 0.9507, item F1 0.9892).
#
#   DATA=../shared/data bash eval/gold_ceiling.sh [OUT]
set -euo pipefail
: "${DATA:?set DATA to the folder holding widesearch/}"
OUT="${1:-runs/gold-ceiling}"
AMAPREDUCE="${AMAPREDUCE:-amapreduce}"
PYTHON="${PYTHON:-python3}"
tasks="$DATA/widesearch/widesearch.jsonl" gold="$DATA/widesearch/widesearch_gold"
"$PYTHON" "$(dirname "$0")/render_gold.py" --tasks "$tasks" --gold-dir "$gold" --out "$OUT/answers"
"$AMAPREDUCE" eval score --benchmark widesearch --tasks "$tasks" --gold-dir "$gold" --pred-dir "$OUT/answers" \
  --reference-date 2026-11-21 --out "$OUT/results.json"
