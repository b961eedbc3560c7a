"""`python -m demo.compare`: the command keeps its name; the code is demo/bench/tools/compare.py."""

import sys

from demo.bench.tools.compare import main

if __name__ == "__main__":
    sys.exit(main())
