"""How much the quick check of the host's passes (`runtime/costs.pass_check`) varies on one host, against
the drift that makes kept timings be timed again (docs/measurements/speed.md, "Kept timings and the host"):
ten checks in a row after one greedy decode, as a start runs it.

    python docs/measurements/probes/host_check.py
"""

import statistics
from types import SimpleNamespace

from diversed_demo.cli import pair_from_args
from diversed_demo.core.generate import generate
from diversed_demo.core.prompt import encode_prompt
from diversed_demo.runtime.costs import HOST_DRIFT, WIDE_DRIFT, pass_check
from diversed_demo.runtime.dtype_choice import calibration_prompt

pair = pair_from_args(SimpleNamespace(target=None, draft=None, device="cpu", dtype="auto"), compiled="wait")
prompt = encode_prompt(pair.tokenizer, calibration_prompt())
generate(pair, prompt, mode="exact", max_new_tokens=32, temperature=0.0)
checks = [pass_check(pair, prompt) for _ in range(10)]
for key, drift in (("target_ms", f"±{HOST_DRIFT:.0%}"), ("wide", f"±{WIDE_DRIFT}")):
    values = [check[key] for check in checks]
    spread = (max(values) - min(values)) / (statistics.median(values) if key == "target_ms" else 1)
    print(f"{key}: {' '.join(f'{v:.3f}' for v in values)}; spread {spread:.3f} (timed again beyond {drift})")
