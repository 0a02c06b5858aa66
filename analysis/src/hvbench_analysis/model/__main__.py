"""`python -m hvbench_analysis.model`: `hvbench model fit` (cli.py)."""

import sys

from hvbench_analysis.model.cli import main

if __name__ == "__main__":
    sys.exit(main())
