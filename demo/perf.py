"""`python -m demo.perf`: the command keeps its name; the code is demo/bench/tools/perf.py."""

import sys

from demo.bench.tools.perf import main

if __name__ == "__main__":
    sys.exit(main())
