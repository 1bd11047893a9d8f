#!/usr/bin/env bash
# The greedy twins (heads/<task>-greedy, T = 0), as docs/training.md's recipe: a warm start fitted on
# 16,000 positions recorded from the target's greedy responses (runs/positions/<task>-T0-N4, held out by
# prompt; recorded here if absent, 5-10 minutes a task on 2 CPU cores), the head reading the p/q terms'
# greedy forms (the target's margin over the draft's choice) beside the hidden states, half of whose
# entries each fit step drops, fitted to the per-token optimum at λ, then 6 RL steps at that λ.
# Resumable (each run's checkpoint in runs/heads/). Usage: bash results/rule/train_twins.sh [task ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A lam=([general]=2 [summarization]=2.5 [math]=2 [code]=2)
for task in "${@:-general summarization math code}"; do
  for t in $task; do
    .venv/bin/diversed-demo train --task "$t" --warm-start-positions 16000 --positions-dir runs/positions \
      --warm-start-hidden-dropout 0.5 --lam "${lam[$t]}" --steps 6 --max-new-tokens 64 --lr 2e-4 --epochs 4 \
      --dense-fidelity 1 --temperature 0 --rollouts-per-prompt 2 --dtype bfloat16 --name "$t-greedy" \
      --out "heads/$t-greedy.safetensors" --run-dir "runs/heads/$t-greedy-lam${lam[$t]}-d05-16k"
  done
done
