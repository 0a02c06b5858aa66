"""hvbench's agent on every machine of a run: scheduler settings, machine facts, tuning and the
tether that ends a part when the harness goes. Standard library only, so that it installs on a
bare host as one wheel."""
