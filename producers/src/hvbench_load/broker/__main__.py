"""`python -m hvbench_load.broker` (cli.py)."""

from hvbench_load.broker.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
