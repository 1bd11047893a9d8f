"""Exact SD with prompt lookup, its blocks of copies on and off (docs/results.md, "Prompt lookup"): the bench
for target-only and exact SD (README's command at N = 2 unless bench arguments follow), with exact
decoding's blocks of copies alone (core/lookup.py) turned off in the process when asked. Run the two
alternately, alone on the CPU:

    python docs/measurements/probes/copy_blocks.py on runs/copy_blocks_on_1.json
    python docs/measurements/probes/copy_blocks.py off runs/copy_blocks_off_1.json
    python docs/measurements/probes/copy_blocks.py off runs/app_off_1.json --app-examples 1 --n-draft 1
"""

import sys

from diversed_demo import cli
from diversed_demo.core import decode
from diversed_demo.core.lookup import PromptLookup

README_BENCH = ["--per-category", "2", "--max-new-tokens", "64", "--n-draft", "2"]


def main(switch: str, out: str, *bench_args: str) -> int:
    if switch == "off":
        with_blocks = decode.make_lookup

        def without_blocks(row, sampler, draft) -> PromptLookup | None:
            lookup = with_blocks(row, sampler, draft)
            if lookup is not None:
                lookup.copy_blocks = False
            return lookup

        decode.make_lookup = without_blocks
    bench_args = list(bench_args) or README_BENCH
    return cli.main(["bench", *bench_args, "--temperature", "0", "--modes", "ar,exact", "--json", out])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
