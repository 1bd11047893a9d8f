#!/usr/bin/env bash
# The per-token rule against the static frontier and each task's shipped head, at T = 1 on held-out sets
# (resumable: every decode is logged, a rerun reads the logs back). Usage: bash results/rule/run.sh [LIMIT]
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT=${1:-100}
for spec in general:spec_bench summarization:spec_bench math:arithmetic code:mbpp; do
  task=${spec%%:*} set=${spec##*:}
  .venv/bin/diversed-demo frontier --task "$task" --set "$set" --limit "$LIMIT" --head "$task" \
    --weights 0,0.25,0.5,0.75,1 --lams 0.5,2,8 --temperature 1 --max-new-tokens 64 --n-draft 4 \
    --dtype bfloat16 --log "results/rule/logs/$task-$set-T1.jsonl" --json "results/rule/$task-$set-T1.json" \
    --plot "results/rule/$task-$set-T1.html"
done
