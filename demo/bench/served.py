"""`python -m demo.bench.served`: the command keeps its name; the code is demo/bench/tools/served.py."""

import sys

from demo.bench.tools.served import main

if __name__ == "__main__":
    sys.exit(main())
