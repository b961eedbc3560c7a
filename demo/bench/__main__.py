"""`python -m demo.bench`: the bench CLI (demo/bench/tools/cli.py)."""

import sys

from demo.bench.tools.cli import main

sys.exit(main())
