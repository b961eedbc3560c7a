"""`python -m demo.bench.hostile`: the command keeps its name; the code is demo/bench/tools/hostile.py."""

import sys

from demo.bench.tools.hostile import main

if __name__ == "__main__":
    sys.exit(main())
