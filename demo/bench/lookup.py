"""`python -m demo.bench.lookup`: the command keeps its name; the code is demo/bench/tools/lookup.py."""

import sys

from demo.bench.tools.lookup import main

if __name__ == "__main__":
    sys.exit(main())
