#!/usr/bin/env bash
# The cost heads (CostHead: the per-token rule's cost plus a learned correction, thresholded by λ), one per
# task at T = 1: a warm start that measures the rule they start as on 32 training prompts, then RL with the
# task's reward at λ = 0.5, 2 and 8 in turn. Resumable (each run's checkpoint in runs/cost-heads/).
# Usage: bash results/rule/train_cost_heads.sh  (about 20 minutes on 2 CPU cores); then results/rule/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
for task in general summarization math code; do
  .venv/bin/diversed-demo train --task "$task" --kind cost --lams 0.5,2,8 --temperature 1 --steps "${STEPS:-90}" \
    --warm-start-prompts 32 --max-new-tokens 64 --n-draft 4 --dtype bfloat16 --name "$task-cost" \
    --out "heads/$task-cost.safetensors" --run-dir "runs/cost-heads/$task"
done
