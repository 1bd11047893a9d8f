#!/usr/bin/env bash
# The per-token rule against the static frontier and each task's heads on held-out sets, at T = 1 (the
# shipped head and the cost head, a curve: results/rule/train_cost_heads.sh) or greedy (T=0: the greedy
# head; the rule's greedy form keeps the draft's token within λ nats of the target's best). Every decode is
# logged, so a rerun (or a run stopped midway) reads back what is done and goes on.
# Usage: bash results/rule/run.sh; T=0 bash results/rule/run.sh  (each about an hour on 2 CPU cores from
# no log; SCALE=0.5 halves every set; TASKS="math code" runs those tasks only)
set -euo pipefail
cd "$(dirname "$0")/../.."
SCALE=${SCALE:-1} T=${T:-1}
if [[ $T == 0 ]]; then kind=greedy lams=0.5,1.5,2,4; else kind=T1 lams=0.5,2,4,8; fi
for spec in general:spec_bench:100 summarization:spec_bench:40 math:arithmetic:100 code:mbpp:40; do
  IFS=: read -r task set limit <<< "$spec"
  [[ " ${TASKS:-general summarization math code} " == *" $task "* ]] || continue
  limit=$(python3 -c "print(max(2, round($limit * $SCALE)))")
  task_lams=$lams  # and the λ its sampled head was fitted at, where the sweep has no point there
  [[ $T != 0 && $task == summarization ]] && task_lams=0.5,2,4,5,8
  [[ $T == 0 && $task == summarization ]] && task_lams=0.5,1.5,2,2.5,3,4
  common=(--task "$task" --set "$set" --limit "$limit" --weights 0,0.25,0.5,0.75,1 --lams "$task_lams"
    --temperature "$T" --max-new-tokens 64 --n-draft 4 --dtype bfloat16 --log "results/rule/logs/$task-$set-$kind.jsonl")
  if [[ $T == 0 ]]; then heads=(--head "$task-greedy"); else heads=(--head "$task" --head "$task-cost"); fi
  .venv/bin/diversed-demo frontier "${common[@]}" "${heads[@]}" \
    --json "results/rule/$task-$set-$kind.json" --plot "results/rule/$task-$set-$kind.html"
  # the heads' cards (heads/<task>.json and <task>-cost.json, or the greedy twin's), from these decodes
  .venv/bin/diversed-demo frontier "${common[@]}" "${heads[@]}" --write-card >/dev/null
done
