#!/usr/bin/env bash
# The per-token rule against the static frontier and each task's shipped head, at T = 1 on held-out sets:
# every decode is logged, so a rerun (or a run stopped midway) reads back what is done and goes on.
# Usage: bash results/rule/run.sh  (about 45 minutes on 2 CPU cores; SCALE=0.5 halves every set)
set -euo pipefail
cd "$(dirname "$0")/../.."
SCALE=${SCALE:-1}
for spec in general:spec_bench:100 summarization:spec_bench:40 math:arithmetic:100 code:mbpp:40; do
  IFS=: read -r task set limit <<< "$spec"
  limit=$(python3 -c "print(max(2, round($limit * $SCALE)))")
  .venv/bin/diversed-demo frontier --task "$task" --set "$set" --limit "$limit" --head "$task" \
    --weights 0,0.25,0.5,0.75,1 --lams 0.5,2,8 --temperature 1 --max-new-tokens 64 --n-draft 4 \
    --dtype bfloat16 --log "results/rule/logs/$task-$set-T1.jsonl" --json "results/rule/$task-$set-T1.json" \
    --plot "results/rule/$task-$set-T1.html"
done
