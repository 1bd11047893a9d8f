"""Evaluation: what a decoding mode is worth, in speed and quality.

Data and rewards: `tasks` (examples per task), `held_out` (the sets never trained on), `rewards` with
`code_reward` and `sandbox`. Speed: `theory` (the analytic bound), `costs` (c and v[N] on this machine),
`bench` and `bench_report` (Spec-Bench), `hf_baseline` (transformers' generate). The speed–quality
frontier: `frontier`, `point`, `margins`, `decode_log`, `cards`, `frontier_figure`; `table` (the results
table)."""
