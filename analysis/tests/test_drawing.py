"""Figures written by child processes: the same files as in-process, a failure named when the
page asks for the figure, never more children than workers at a time, none left behind."""

import os
from pathlib import Path

import pytest
from hvbench_analysis import drawing, figures


def a_figure():
    fig, ax = figures.axes()
    ax.plot([1, 2, 3], [3.0, 1.0, 2.0])
    ax.set_yscale("log")
    return fig


def test_a_child_writes_the_same_files_as_the_report_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    forked = figures.save(a_figure(), tmp_path / "forked", "f")
    assert forked.pid is not None  # written by a child
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "1")
    here = figures.save(a_figure(), tmp_path / "here", "f")
    assert here.pid is None
    assert forked.png() == here.png() == (tmp_path / "here" / "f.png").read_bytes()
    for suffix in ("svg", "pdf"):
        first, second = (tmp_path / d / f"f.{suffix}" for d in ("forked", "here"))
        assert first.read_bytes() == second.read_bytes(), suffix


def test_a_figure_that_cannot_be_written_fails_when_the_page_asks_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")

    def write() -> None:
        raise OSError("No space left on device")

    failed = drawing.start(write, "over_time_r1", tmp_path / "f.png")
    with pytest.raises(RuntimeError, match="figure over_time_r1: the process writing it exited"):
        failed.png()


def test_no_more_children_than_workers_and_none_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    running = []

    def write(path: Path) -> None:
        path.write_bytes(b"png")

    started = []
    for i in range(6):
        started.append(drawing.start(lambda i=i: write(tmp_path / f"{i}.png"), str(i),
                                     tmp_path / f"{i}.png"))  # fmt: skip
        running.append(len(drawing._running))
    assert max(running) <= 2
    drawing.finish()
    assert not drawing._running
    assert [d.png() for d in started] == [b"png"] * 6
    for child in started:  # each was waited for: no zombie is left
        with pytest.raises(ChildProcessError):
            os.waitpid(child.pid, os.WNOHANG)
