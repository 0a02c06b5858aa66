"""The energy readers on recorded formats (this machine has no energy counter): a powercap
tree laid out as the kernel lays it out, `perf stat -I -x,` lines as perf 6.1 prints them and
`ipmitool dcmi power reading` as ipmitool 1.8.19 prints it; the wrap-around arithmetic; and
the real "not available" path of this machine."""

import io
import json
import os
import stat
import threading
from pathlib import Path

import pytest
from hvbench_agent import energy

UJ = 1_000_000
WRAP = 262_143_328_850  # max_energy_range_uj of a Xeon package (2^32 units of 61 µJ)


def zone(root: Path, name: str, label: str, uj: int, max_uj: int = WRAP) -> Path:
    path = root / name
    path.mkdir()
    (path / "name").write_text(label + "\n")
    (path / "energy_uj").write_text(f"{uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


@pytest.fixture
def rapl(tmp_path):
    """/sys/class/powercap of a one-socket server: the package, its core and DRAM subzones
    (listed flat, as the class directory lists them) and psys; intel-rapl-mmio is skipped."""
    zone(tmp_path, "intel-rapl:0", "package-0", 5 * UJ)
    zone(tmp_path, "intel-rapl:0:0", "core", 3 * UJ)
    zone(tmp_path, "intel-rapl:0:1", "dram", 1 * UJ)
    zone(tmp_path, "intel-rapl:1", "psys", 9 * UJ)
    zone(tmp_path, "intel-rapl-mmio:0", "package-0", 0)
    return tmp_path


def set_uj(root: Path, name: str, uj: int) -> None:
    (root / name / "energy_uj").write_text(f"{uj}\n")


def test_a_counter_that_wrapped_once_is_unwrapped():
    assert energy.counter_delta(100, 350, 1000) == 250
    assert energy.counter_delta(900, 50, 1000) == 150  # 900 → 999 → 0 → 50
    assert energy.counter_delta(WRAP - UJ, 2 * UJ, WRAP + 1) == 3 * UJ + 1


def test_powercap_zones_are_labelled_and_the_total_is_packages_and_dram(rapl):
    source = energy.Powercap(rapl)
    assert sorted(source.zones) == ["package-0", "package-0/core", "package-0/dram", "psys"]
    assert source.describe()["total_of"] == ["package-0", "package-0/dram"]
    assert source.wraps_at["package-0"] == WRAP + 1


def test_powercap_joules_across_a_wrap(rapl):
    counter = energy.Accumulator(energy.Powercap(rapl))
    first = counter.sample("start")
    assert first["joules"] == {
        "package-0": 0.0,
        "package-0/core": 0.0,
        "package-0/dram": 0.0,
        "psys": 0.0,
        "total": 0.0,
    }
    set_uj(rapl, "intel-rapl:0", WRAP - UJ)  # 262 138 J on: near the end of its range
    set_uj(rapl, "intel-rapl:0:1", 3 * UJ)
    counter.sample()
    set_uj(rapl, "intel-rapl:0", 4 * UJ)  # wrapped: 1 J to the end, 1 µJ to 0, 4 J on
    set_uj(rapl, "intel-rapl:0:1", 4 * UJ)
    last = counter.sample("end")["joules"]
    package = (WRAP - UJ - 5 * UJ + UJ + 1 + 4 * UJ) / 1e6
    assert last["package-0"] == pytest.approx(package)
    assert last["package-0/dram"] == pytest.approx(3.0)
    assert last["psys"] == 0.0  # unchanged, and never part of the total
    assert last["total"] == pytest.approx(package + 3.0)
    found = energy.window(counter.samples, "start", "end")
    assert found["joules"]["total"] == pytest.approx(package + 3.0)
    assert found["seconds"] >= 0


def test_powercap_readable_by_root_only_is_not_available(rapl, monkeypatch):
    def refused(path):
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return path.read_text()

    monkeypatch.setattr(energy, "read", refused)
    with pytest.raises(energy.Unavailable, match="root only"):
        energy.Powercap(rapl)


def test_no_rapl_zone_is_not_available(tmp_path):
    with pytest.raises(energy.Unavailable, match="no RAPL zone"):
        energy.Powercap(tmp_path)


def test_window_between_marks_and_missing_marks():
    samples = [
        {"t_s": 10.0, "mark": "start", "joules": {"total": 0.0}},
        {"t_s": 11.0, "mark": "measured", "joules": {"total": 40.0}},
        {"t_s": 12.0, "mark": None, "joules": {"total": 90.0}},
        {"t_s": 15.0, "mark": "sent", "joules": {"total": 200.0}},
    ]
    found = energy.window(samples, "measured", "sent")
    assert found["seconds"] == 4.0
    assert found["joules"] == {"total": 160.0}
    assert found["mean_w"] == {"total": 40.0}
    assert energy.window(samples, "measured", "drained") is None


# `perf stat -a -x, -I 100 -e power/energy-pkg/,power/energy-ram/` (perf 6.1, stat-display.c)
PERF_LINES = """\
# started on Thu Nov 26 10:00:00 2026

     0.100136257,2.46,Joules,power/energy-pkg/,400544172,100.00,,
     0.100136257,0.55,Joules,power/energy-ram/,400540012,100.00,,
     0.200311409,2.51,Joules,power/energy-pkg/,400612308,100.00,,
     0.200311409,<not counted>,Joules,power/energy-ram/,0,0.00,,
"""


def test_perf_interval_lines_are_parsed():
    parsed = [energy.parse_perf_interval(line) for line in PERF_LINES.splitlines()]
    assert [p for p in parsed if p] == [
        ("power/energy-pkg/", 2.46),
        ("power/energy-ram/", 0.55),
        ("power/energy-pkg/", 2.51),
    ]


def fake_perf(bin_dir: Path, said: str, then: str = "exec sleep 30") -> None:
    """A stand-in for perf that prints recorded output on its standard error, as perf stat
    does, then counts on until it is stopped (or exits as `then` says)."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "perf.out").write_text(said)
    script = bin_dir / "perf"
    script.write_text(f"#!/bin/sh\ncat {bin_dir / 'perf.out'} >&2\n{then}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_perf_source_sums_its_intervals(tmp_path, monkeypatch):
    pmu = tmp_path / "power"
    (pmu / "events").mkdir(parents=True)
    (pmu / "events" / "energy-pkg").write_text("event=0x02\n")
    fake_perf(tmp_path / "bin", PERF_LINES)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    source = energy.Perf(100, pmu)
    try:
        assert source.events == ["power/energy-pkg/"]
        for _ in range(100):  # the recorded lines come at once; the reader thread sums them
            if source.read().get("power/energy-pkg/") == pytest.approx(4.97):
                break
            threading.Event().wait(0.02)
        assert source.read() == {"power/energy-pkg/": pytest.approx(4.97),
                                 "power/energy-ram/": pytest.approx(0.55)}  # fmt: skip
    finally:
        source.close()


def test_perf_that_counts_nothing_is_not_available(tmp_path, monkeypatch):
    pmu = tmp_path / "power"
    (pmu / "events").mkdir(parents=True)
    (pmu / "events" / "energy-pkg").write_text("event=0x02\n")
    said = "event syntax error: 'power/energy-pkg/'\n  Cannot find PMU `power'.\n"
    fake_perf(tmp_path / "bin", said, then="exit 129")  # as perf 6.1 exits on it
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(energy.Unavailable, match=r"perf: counted nothing: .*Cannot find PMU"):
        energy.Perf(100, pmu)


# `ipmitool dcmi power reading` (ipmitool 1.8.19, lib/ipmi_dcmi.c: the timestamp line has no
# newline of its own, so the sampling period follows it on the same line)
DCMI = """
    Instantaneous power reading:                   212 Watts
    Minimum during sampling period:                 98 Watts
    Maximum during sampling period:                315 Watts
    Average power reading over sample period:      187 Watts
    IPMI timestamp:                           11/26/26 10:00:00 UTC    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated

"""  # noqa: E501


def test_dcmi_reading_is_parsed_and_integrated(monkeypatch):
    assert energy.parse_dcmi_watts(DCMI) == 212.0
    assert energy.parse_dcmi_watts("Could not open device at /dev/ipmi0") is None
    source = object.__new__(energy.Dcmi)  # without a BMC: its readings given in turn
    readings = iter([200.0, 220.0, 240.0])
    monkeypatch.setattr(source, "read", lambda: {"power": next(readings)})
    clock = iter([0.0, 2.0, 3.0])
    monkeypatch.setattr(energy.time, "monotonic", lambda: next(clock))
    counter = energy.Accumulator(source)
    counter.sample("a")
    counter.sample()
    found = counter.sample("b")["joules"]
    assert found["power"] == pytest.approx(210 * 2 + 230 * 1)
    assert found["total"] == found["power"]


def test_this_machine_records_not_available_with_every_reason():
    """The real path here: no RAPL zone, no power PMU, no BMC (where a machine has one of
    them, the source it offers is named instead)."""
    has_rapl = any(Path("/sys/class/powercap").glob("intel-rapl:*"))
    has_pmu = (energy.PERF_PMU / "events" / "energy-pkg").exists()
    has_bmc = any(Path(d).exists() for d in energy.IPMI_DEVICES)
    found = energy.offered()
    if has_rapl or has_pmu or has_bmc:
        assert found["available"] and found["source"] in ("powercap", "perf", "dcmi")
        return
    assert found == {"available": False, "reason": found["reason"]}
    for source in ("powercap:", "perf:", "dcmi:"):
        assert source in found["reason"]


def test_the_agent_command_says_not_available_or_samples_with_marks(rapl, monkeypatch):
    """`hvbench-agent energy`: the source line, a sample per mark, one at the end."""
    monkeypatch.setattr(energy, "open_source", lambda: energy.Powercap(rapl))
    read_end, write_end = os.pipe()
    os.write(write_end, b"mark measured\nmark sent\n")
    os.close(write_end)
    out = io.StringIO()
    with os.fdopen(read_end) as stdin:
        assert energy.run(5.0, out=out, stdin=stdin) == 0
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["available"] and lines[0]["source"] == "powercap"
    assert [line["mark"] for line in lines[1:]] == ["start", "measured", "sent", "stop"]
    monkeypatch.setattr(energy, "open_source", lambda: energy.Powercap(rapl / "none"))
    out = io.StringIO()
    energy.run(5.0, out=out, stdin=io.StringIO())
    assert json.loads(out.getvalue()) == {
        "available": False,
        "reason": f"powercap: {rapl / 'none'} has no RAPL zone (intel-rapl:*)",
    }
