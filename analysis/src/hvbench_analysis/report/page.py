"""The report's HTML page, where its files go, and the helpers every section shares."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from hvbench_analysis import drawing, tables
from hvbench_analysis.labels import config_label
from hvbench_analysis.load import by_run

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222 }
h1 { font-size: 1.6em } h2 { border-bottom: 1px solid #ccc; margin-top: 2em }
table { border-collapse: collapse; margin: 0.5em 0 1.5em } th, td { padding: 2px 8px }
th { background: #f0f0f0; text-align: left } td { border-top: 1px solid #e4e4e4 }
td.num { text-align: right; font-variant-numeric: tabular-nums }
img { max-width: 100%; display: block; margin: 0.5em 0 }
.flag { color: #b00; font-weight: bold } .note { color: #555 } pre { background: #f7f7f7;
padding: 0.5em; overflow-x: auto; font-size: 12px }
"""


MIME = {".svg": "image/svg+xml", ".png": "image/png", ".pdf": "application/pdf"}

# Marks on <body> how many figures decoded to a bitmap, for checks by a headless browser.
LOAD_CHECK = (
    "<script>addEventListener('load', () => { document.body.dataset.figuresRendered = "
    "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length })</script>"
)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("_") or "run"


class Heading(NamedTuple):
    """A section's heading: numbered, and listed in the contents, when the page is rendered."""

    text: str


class Page:
    """The HTML page, built section by section; figures are embedded as SVG (or PNG) data. A
    part of the page (`part`) can be filled after what follows it, and still shows in its
    place."""

    def __init__(self, title: str) -> None:
        self.title = title
        # a callable: a figure being drawn; a Page: a part filled later
        self.parts: list[str | Callable[[], str] | Heading | Page] = []

    def h(self, level: int, text: str) -> None:
        if level != 2:
            self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
            return
        self.parts.append(Heading(text))

    def part(self) -> Page:
        """An empty part of the page, here, for sections built later."""
        part = Page(self.title)
        self.parts.append(part)
        return part

    def shown(self) -> Iterator[str | Callable[[], str] | Heading]:
        """Every part in the order the page shows them, the parts filled later in their place."""
        for part in self.parts:
            if isinstance(part, Page):
                yield from part.shown()
            else:
                yield part

    def p(self, text: str, cls: str = "") -> None:
        attr = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{attr}>{html.escape(text)}</p>")

    def figure(self, drawn: drawing.Drawing, alt: str, name: str) -> None:
        """A figure whose files a worker process is writing: the one it shows (SVG, or PNG) is
        embedded when the page is rendered."""

        def markup() -> str:
            data = base64.b64encode(drawn.read()).decode()
            mime = MIME[drawn.path.suffix]
            files = f"figures/{name}.{drawn.formats[0]}" + "".join(
                f", .{suffix}" for suffix in drawn.formats[1:]
            )
            return (
                f'<figure><img class="figure" alt="{html.escape(alt)}" '
                f'src="data:{mime};base64,{data}"><figcaption class="note">'
                f"{html.escape(alt)} ({html.escape(files)})</figcaption></figure>"
            )

        self.parts.append(markup)

    def written(self, drawn: drawing.Drawing) -> None:
        """A file beside the page that a worker process is writing (a run's HdrHistogram log):
        nothing on the page, but the page is not rendered before it is written, and fails with
        its error if writing it failed."""

        def wait() -> str:
            drawn.wait()
            return ""

        self.parts.append(wait)

    def table(self, table: pd.DataFrame, name: str | None = None, digits: int = 2) -> None:
        if table.empty:
            self.p("No runs of this kind.", "note")
            return
        rows = ["<table><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)]
        for _, row in table.iterrows():
            cells = []
            for value in row:
                text = tables.cell(value, digits)
                numeric = isinstance(value, int | float | np.integer | np.floating)
                cells.append(
                    f'<td class="num">{text}</td>' if numeric else f"<td>{html.escape(text)}</td>"
                )
            rows.append("<tr>" + "".join(cells) + "</tr>")
        rows.append("</table>")
        if name:
            rows.append(f'<p class="note">tables/{html.escape(name)}.md, .tex, .csv</p>')
        self.parts.append("\n".join(rows))

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def render(self) -> str:
        body, sections = [], []  # sections: (anchor, heading), numbered in the order shown
        for part in self.shown():
            if isinstance(part, Heading):
                anchor = f"s{len(sections) + 1}-{safe_name(part.text).lower()}"
                sections.append((anchor, part.text))
                body.append(f'<a id="{anchor}"></a><h2>{html.escape(part.text)}</h2>')
            else:
                body.append(part if isinstance(part, str) else part())
        text = "\n".join(body)
        return (
            f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head>\n"
            f"<body>\n<h1>{html.escape(self.title)}</h1>\n{contents(sections)}\n"
            f"{text}\n{LOAD_CHECK}\n</body></html>\n"
        )


def contents(sections: list[tuple[str, str]]) -> str:
    """The sections' headings, each a link to its section."""
    items = "".join(
        f'<li><a href="#{anchor}">{html.escape(text)}</a></li>' for anchor, text in sections
    )
    return f'<nav class="contents"><h2>Contents</h2><ol>{items}</ol></nav>' if items else ""


def curves(groups: list[tuple[dict, pd.DataFrame]]) -> list[tuple[str, np.ndarray]]:
    return [(config_label(tags), group["latency_ns"].to_numpy()) for tags, group in groups]


class OutDirs(NamedTuple):
    """Where the report writes its figures, tables and HdrHistogram logs."""

    figures: Path
    tables: Path
    hdr: Path


def table_with_note(page: Page, table: pd.DataFrame, name: str, dirs: OutDirs, note: str) -> None:
    """A table on the page and in tables/ (Markdown, LaTeX, CSV), with its note below."""
    page.table(table, name)
    tables.write(table, dirs.tables, name)
    page.p(note, "note")


def run_curves(groups: list[tuple[dict, pd.DataFrame]]) -> list[tuple[str, list[np.ndarray]]]:
    """(label, [latencies of each run]) per configuration."""
    return [
        (
            config_label(tags),
            [run.latency_ns for run in by_run(group)],
        )
        for tags, group in groups
    ]
