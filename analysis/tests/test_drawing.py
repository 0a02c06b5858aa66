"""Figures written by worker processes: the same files as in-process, a failure named when the
page asks for the figure, never more workers than asked for, none left behind."""

import gc
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hvbench_analysis import drawing, figures
from hvbench_analysis.stats import percentile


@pytest.fixture(autouse=True)
def no_workers_left():
    yield
    drawing.finish()


def a_figure():
    fig, ax = figures.axes()
    ax.plot([1, 2, 3], [3.0, 1.0, 2.0])
    ax.set_yscale("log")
    figures.plain_log_axis(ax.yaxis)
    return fig


def test_a_worker_writes_the_same_files_as_the_report_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    sent = figures.save(tmp_path / "worker", "f", a_figure)
    assert sent.future is not None  # written by a worker
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "1")
    here = figures.save(tmp_path / "here", "f", a_figure)
    assert here.future is None
    assert sent.read() == here.read() == (tmp_path / "here" / "f.svg").read_bytes()
    assert sent.formats == here.formats == ("svg", "pdf")
    for suffix in ("svg", "pdf"):
        first, second = (tmp_path / d / f"f.{suffix}" for d in ("worker", "here"))
        assert first.read_bytes() == second.read_bytes(), suffix


def cannot_write(path: Path) -> None:
    raise OSError(28, "No space left on device", str(path))


def test_a_figure_that_cannot_be_written_fails_with_its_error_when_the_page_asks(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    failed = drawing.start(cannot_write, tmp_path / "f.svg", name="figure over_time_r1",
                           path=tmp_path / "f.svg")  # fmt: skip
    with pytest.raises(RuntimeError, match=r"figure over_time_r1: .*No space left on device"):
        failed.read()


def test_a_worker_that_dies_fails_its_figure_and_not_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    died = drawing.start(os._exit, 9, name="figure density", path=tmp_path / "f.svg")
    with pytest.raises(RuntimeError, match="figure density: "):
        died.wait()
    drawing.finish()  # returns: the pool is ended, not waited for forever


def write_and_say_who(path: Path) -> int:
    path.write_bytes(b"svg")
    return os.getpid()


def test_no_more_workers_than_asked_and_none_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    paths = [tmp_path / f"{i}.svg" for i in range(12)]
    started = [drawing.start(write_and_say_who, p, name=p.stem, path=p) for p in paths]
    assert len(drawing._unfinished) <= drawing.WAITING_PER_WORKER * 2
    assert [d.read() for d in started] == [b"svg"] * 12
    writers = {d.future.result() for d in started}
    assert 1 <= len(writers) <= 2 and os.getpid() not in writers
    drawing.finish()
    for pid in writers:  # each worker ended and was waited for: no zombie is left
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_what_the_report_held_is_frozen_while_workers_draw_and_thawed_when_they_end(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HVBENCH_REPORT_WORKERS", "2")
    assert gc.get_freeze_count() == 0
    held = [[] for _ in range(1000)]  # containers a report holds before its first figure
    drawn = drawing.start(write_and_say_who, tmp_path / "f.svg", name="f", path=tmp_path / "f.svg")
    assert gc.get_freeze_count() >= len(held)  # the collectors do not walk it while workers draw
    assert drawn.read() == b"svg"
    drawing.finish()
    assert (
        gc.get_freeze_count() == 0
    )  # a caller that goes on (a test, a notebook) collects it again


def test_the_per_bin_statistics_are_the_nearest_rank_ones_of_each_bin():
    rng = np.random.default_rng(3)
    t = np.sort(np.concatenate([rng.uniform(0, 10, 997), [10.0, 10.0, 10.0]]))
    values = rng.lognormal(1.0, 1.0, len(t))
    edges = np.array([0.0, 0.001, 2.5, 2.6, 7.0, 10.0 + 1e-9])  # a bin likely empty, ends at 10
    mids, p50, p99, top = figures.per_bin(t, values, edges)
    expected = []
    for lo, hi in itertools.pairwise(edges):
        chunk = values[(t >= lo) & (t < hi)]
        if len(chunk):
            expected.append(((lo + hi) / 2, percentile(chunk, 50), percentile(chunk, 99),
                             chunk.max()))  # fmt: skip
    assert np.allclose(mids, [e[0] for e in expected])
    assert list(p50) == [e[1] for e in expected]
    assert list(p99) == [e[2] for e in expected]
    assert list(top) == [e[3] for e in expected]
    assert sum((t >= lo) & (t < hi) for lo, hi in itertools.pairwise(edges)).all()  # each once


def test_the_last_bin_keeps_the_last_sample_where_its_time_is_too_large_to_round():
    t = 1e9 + np.arange(5.0)  # t[-1] + 1e-9 == t[-1]
    edges = np.linspace(t[0], t[-1] + 1e-9, 3)
    _, _, _, top = figures.per_bin(t, np.array([1.0, 2.0, 3.0, 4.0, 100.0]), edges)
    assert top[-1] == 100.0


def test_samples_outside_the_edges_are_left_out_of_every_bin():
    t = np.arange(10.0)
    _, p50, _, top = figures.per_bin(t, t * 10, np.array([2.0, 5.0, 7.0]))
    assert list(top) == [40.0, 70.0] and list(p50) == [30.0, 60.0]  # 2–4 and 5–7
