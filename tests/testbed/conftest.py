"""The testbed tier's summary: which module restored its host from a layer (layers.py), and
which made one."""

import layers


def pytest_terminal_summary(terminalreporter):
    if layers.REPORT:
        terminalreporter.section("provisioned layers")
        for line in layers.REPORT:
            terminalreporter.write_line(line)
