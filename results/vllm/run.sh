#!/usr/bin/env bash
# vLLM beside this project's decoder on the same Spec-Bench first turns (3 per category at T = 1, whose
# acceptance varies more between runs than the two decoders differ; 1 greedy), 64 new tokens, N = 4, fp32,
# probabilistic drafting in vLLM and no prompt lookup in the decoder (vLLM has none): at T = 1 exact, the
# rule at λ = 4 and the general head; greedy exact, static w = 0.5, the rule's greedy form at λ = 1 and the
# general greedy head. The decoder runs first, and vLLM's report puts its figures beside (--beside).
# Run it alone on the machine: the figures are timings. Usage: bash results/vllm/run.sh  (about an hour on
# 2 CPU cores; RUNS="heads-greedy" runs that one only)
set -euo pipefail
cd "$(dirname "$0")/../.."
run() {  # name temperature per-category vllm-modes decoder-modes
  local name=$1 t=$2 per=$3 vllm_modes=$4 decoder_modes=$5
  [[ " ${RUNS:-heads-T1 heads-greedy} " == *" $name "* ]] || return 0
  .venv/bin/diversed-demo bench --per-category "$per" --temperature "$t" --modes "$decoder_modes" --n-draft 4 \
    --max-new-tokens 64 --dtype float32 --json "results/vllm/$name-decoder.json" \
    --markdown "results/vllm/$name-decoder.md"
  .venv-vllm/bin/python -m diversed_demo.vllm bench --per-category "$per" --temperature "$t" --modes "$vllm_modes" \
    --max-new-tokens 64 --beside "results/vllm/$name-decoder.json" --json "results/vllm/$name.json" \
    --markdown "results/vllm/$name.md"
}
run heads-T1 1 3 ar,exact,cost:4,dynamic:general \
  ar,exact/no-lookup,cost:4/no-lookup,dynamic:general/no-lookup
run heads-greedy 0 1 ar,exact,static:0.5,cost:1,dynamic:general-greedy \
  ar,exact/no-lookup,static:0.5/no-lookup,cost:1/no-lookup,dynamic:general-greedy/no-lookup
