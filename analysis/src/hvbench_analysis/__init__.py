"""hvbench analysis: runs in `results/` → one tidy table → statistics, figures, the report."""
