"""hvbench's harness: the controller side of a run, a campaign and a rerun."""
