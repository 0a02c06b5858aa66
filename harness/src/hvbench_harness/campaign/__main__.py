"""`python -m hvbench_harness.campaign`: the campaign's command line (cli.py)."""

import os
import sys

from hvbench_harness.campaign.cli import main

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
