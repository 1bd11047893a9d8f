#!/usr/bin/env bash
# vLLM beside this project's decoder on the same 13 Spec-Bench first turns (one per category), 64 new
# tokens, N = 4, fp32, probabilistic drafting in vLLM and no prompt lookup in the decoder (vLLM has none):
# at T = 1 (exact, the rule at λ = 4, the general head) and greedy (exact, the rule's greedy form at λ = 1,
# the general greedy head). The decoder runs first, and vLLM's report puts its figures beside (--beside).
# Run it alone on the machine: the figures are timings. Usage: bash results/vllm/run.sh  (about 40 minutes
# on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
run() {  # name temperature modes...
  local name=$1 t=$2 vllm_modes=$3 decoder_modes=$4
  .venv/bin/diversed-demo bench --per-category 1 --temperature "$t" --modes "$decoder_modes" --n-draft 4 \
    --max-new-tokens 64 --dtype float32 --json "results/vllm/$name-decoder.json" \
    --markdown "results/vllm/$name-decoder.md"
  .venv-vllm/bin/python -m diversed_demo.vllm bench --per-category 1 --temperature "$t" --modes "$vllm_modes" \
    --max-new-tokens 64 --beside "results/vllm/$name-decoder.json" --json "results/vllm/$name.json" \
    --markdown "results/vllm/$name.md"
}
run heads-T1 1 ar,exact,cost:4,dynamic:general \
  ar,exact/no-lookup,cost:4/no-lookup,dynamic:general/no-lookup
run heads-greedy 0 ar,exact,cost:1,dynamic:general-greedy \
  ar,exact/no-lookup,cost:1/no-lookup,dynamic:general-greedy/no-lookup
