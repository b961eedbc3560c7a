"""`python -m demo.export_drafter`: the command keeps its name; the code is demo/models/export_drafter.py."""

import sys

from demo.models.export_drafter import main

if __name__ == "__main__":
    sys.exit(main())
