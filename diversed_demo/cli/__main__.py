"""`python -m diversed_demo.cli`, as the `diversed-demo` command."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
