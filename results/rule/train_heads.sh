#!/usr/bin/env bash
# The sampled ensemble heads (heads/<task>, T = 1), as docs/training.md's recipe: a warm start fitted on
# 100k positions recorded at scale (runs/positions/<task>-T1-N4: teacher-forced passes over the target's
# own responses to the task's prompt pool, held out by prompt; recorded here if absent, 15-60 minutes a
# task on 2 CPU cores), the head reading the p/q terms beside the hidden states, then 6 RL steps, at the
# λ of the per-token rule where it relaxes on every task (the cost heads' default, 4; 5 for summarization).
# Resumable (each run's checkpoint in runs/heads/). Usage: bash results/rule/train_heads.sh [task ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A lam=([general]=4 [summarization]=5 [math]=4 [code]=4)
for task in "${@:-general summarization math code}"; do
  for t in $task; do
    .venv/bin/diversed-demo train --task "$t" --warm-start-positions 100000 --positions-dir runs/positions \
      --lam "${lam[$t]}" --steps 6 --max-new-tokens 64 --lr 2e-4 --epochs 4 \
      --dense-fidelity 1 --dtype bfloat16 --name "$t" \
      --out "heads/$t.safetensors" --run-dir "runs/heads/$t"
  done
done
