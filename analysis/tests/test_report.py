"""The whole report on synthetic runs, and the page opened in a real headless browser."""

import re
import shutil
import subprocess

import numpy as np
import pytest
from hvbench_analysis import figures, report
from hvbench_analysis.synthetic import write_run
from PIL import Image

MS = 1_000_000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    rng = np.random.default_rng(11)
    for rep in (1, 2):
        write_run(
            results / f"credit-{rep}",
            rng.lognormal(np.log(8e6), 0.4, 3000),
            target="xen",
            sched="credit",
            rep=rep,
            warmup=50,
        )
        write_run(
            results / f"rtds-{rep}",
            rng.lognormal(np.log(5e6), 0.3, 3000),
            target="xen",
            sched="rtds",
            budget=77500,
            period=100000,
            rep=rep,
            warmup=50,
        )
    tail = rng.lognormal(np.log(5e6), 0.3, 3000)
    tail[1500] = 1.4e9  # a 1.4 s stall past the x limit
    write_run(results / "rtds-cap", tail, target="xen", sched="credit2", cap=50, missing=4)
    (results / "broken").mkdir()
    (results / "broken" / "meta.json").write_text("{")
    out = results.parent / "report"
    code = report.main(
        [
            "--results",
            str(results),
            "--out",
            str(out),
            "--ref",
            "sched=credit",
            "--deadline-ms",
            "10",
            "--xlim-ms",
            "40",
        ]
    )
    return code, out


def test_report_writes_page_tables_figures_and_logs(built):
    code, out = built
    assert code == 0
    page = (out / "index.html").read_text()
    assert "broken" in page and "not valid JSON" in page  # the skipped run, by name and reason
    assert "rtds-cap: records unaccounted for" in page  # the flagged run
    assert "Every record accounted for" in page
    assert page.count('<img class="figure"') >= 8
    assert "max 1,400.0 ms" not in page  # figures are images, the note is inside them
    for name in (
        "percentiles_by_config",
        "percentiles_by_run",
        "max_budget_period",
        "max_cap",
        "max_scheduler",
        "intended_vs_actual",
        "repetitions",
        "against_reference",
        "runs",
    ):
        assert (out / "tables" / f"{name}.md").exists(), name
        assert (out / "tables" / f"{name}.csv").exists(), name
    for name in ("ecdf_all", "density", "over_time_rtds-1", "ecdf_reps_xen_rtds_P100000_B77500"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 5_000, name
        assert (out / "figures" / f"{name}.svg").read_text().startswith("<?xml")
    assert sorted(p.name for p in (out / "hdr").iterdir()) == [
        "credit-1.hlog",
        "credit-2.hlog",
        "rtds-1.hlog",
        "rtds-2.hlog",
        "rtds-cap.hlog",
    ]
    cap = (out / "tables" / "max_cap.md").read_text()
    assert "| Credit2 | 50 | 1,400.00 |" in cap
    assert "| RTDS | 77500 | 100000 |" in (out / "tables" / "max_budget_period.md").read_text()


def test_report_refuses_when_nothing_is_readable(tmp_path, capsys):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("[]")
    with pytest.raises(SystemExit, match=r"no readable runs.*broken: meta\.json is not an object"):
        report.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise AssertionError("no chromium: `make test` installs it (Debian package chromium)")


def headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--allow-file-access-from-files",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_page_renders_in_a_real_browser_with_its_figures(built, tmp_path):
    _, out = built
    url = (out / "index.html").resolve().as_uri()
    # the DOM after rendering: every figure decoded to a real bitmap
    dom = headless(
        "--virtual-time-budget=5000", "--run-all-compositor-stages-before-draw", "--dump-dom", url
    ).stdout
    figures = dom.count('<img class="figure"')
    assert figures >= 8
    rendered = re.search(r'data-figures-rendered="(\d+)"', dom)
    assert rendered is not None, "the page's load check did not run"
    assert int(rendered.group(1)) == figures, "some figures did not decode"
    shot = tmp_path / "shot.png"
    headless("--window-size=1200,2400", f"--screenshot={shot}", url)
    image = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert image.shape[:2] == (2400, 1200)
    ink = (np.abs(image - 255).sum(axis=2) > 60).mean()  # share of pixels that are not white
    colours = len(np.unique(image.reshape(-1, 3)[::7], axis=0))
    assert ink > 0.03, f"page looks blank: {ink:.1%} of pixels drawn"
    assert colours > 50, f"only {colours} colours: figures did not render"


def test_the_density_of_equal_latencies_fits_its_grid():
    x, density = figures.log_density(np.full(20, 3.0))
    assert x.shape == density.shape == (512,)
    assert x[density.argmax()] == pytest.approx(3.0, rel=0.01)
