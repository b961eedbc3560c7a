"""`python -m demo.bench.sweep`: the command keeps its name; the code is demo/bench/tools/sweep.py."""

import sys

from demo.bench.tools.sweep import main

if __name__ == "__main__":
    sys.exit(main())
