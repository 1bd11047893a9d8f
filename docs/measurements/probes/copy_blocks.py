"""Exact SD with prompt lookup, its blocks of copies on and off (docs/results.md, "Prompt lookup"): README's
bench command for target-only and exact SD at a fixed N, with exact decoding's blocks of copies alone
(core/lookup.py) turned off in the process when asked. Run the two alternately, alone on the CPU:

    python docs/measurements/probes/copy_blocks.py on runs/copy_blocks_on_1.json
    python docs/measurements/probes/copy_blocks.py off runs/copy_blocks_off_1.json
"""

import sys

from diversed_demo import cli
from diversed_demo.core import decode
from diversed_demo.core.lookup import PromptLookup


def main(switch: str, out: str, n_draft: str = "2") -> int:
    if switch == "off":
        with_blocks = decode.make_lookup

        def without_blocks(row, sampler, draft) -> PromptLookup | None:
            lookup = with_blocks(row, sampler, draft)
            if lookup is not None:
                lookup.copy_blocks = False
            return lookup

        decode.make_lookup = without_blocks
    args = ["bench", "--per-category", "2", "--max-new-tokens", "64", "--modes", "ar,exact"]
    return cli.main([*args, "--n-draft", n_draft, "--json", out])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
