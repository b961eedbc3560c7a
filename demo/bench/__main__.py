"""`python -m demo.bench`: the bench CLI (demo/bench/cli.py)."""

import sys

from demo.bench.cli import main

sys.exit(main())
