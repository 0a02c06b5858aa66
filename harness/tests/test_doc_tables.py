"""The docs' tables of settings say what the code's tables say (spec.FIELDS, the agent's
SCHEDULERS): a field or a scheduler parameter added to one is found missing from the other."""

import json
import re
from pathlib import Path

from hvbench_agent.sched import PARAM_NAMES, SCHEDULERS
from hvbench_harness import spec

REPO = Path(__file__).resolve().parents[2]


def test_the_campaign_readme_lists_every_campaign_setting():
    text = (REPO / "campaigns/README.md").read_text()
    listed = re.search(r"Settings are `make run`'s variables in lower case: `([^`]*)`", text)
    assert listed, "campaigns/README.md: the list of settings"
    assert set(listed.group(1).split()) == set(spec.CAMPAIGN_KEYS) - {"rate"}
    assert "`rate`" in text


def test_results_md_names_every_key_of_the_typed_sections():
    """Each section of sections.py (`requested`: the run request's fields) has its every key,
    its nested sections' too, named in its row of the meta.json table."""
    from hvbench_analysis import results, sections

    rows = meta_json_rows()
    for name, (kind, _) in results.SECTIONS.items():
        keys = named_keys(sections.schema_of(kind))
        if keys:
            # "every scheduler parameter" names the scheduler's (the agent's table) at once
            missing = keys - rows[name] - set(PARAM_NAMES)
            assert missing == set(), f"docs/results.md `{name}` lacks {sorted(missing)}"


def meta_json_rows() -> dict[str, set[str]]:
    """docs/results.md's meta.json table: each key of the first cell → the names its row
    gives in backticks."""
    text = (REPO / "docs/results.md").read_text()
    part = text[text.index("| key | what |", text.index("## meta.json")) :]
    rows = {}
    for line in part[: part.index("\n\n")].splitlines()[2:]:
        named = set(re.findall(r"`([a-z_0-9.]+)`", line))
        for key in re.findall(r"`([a-z_]+)`", line.split("|")[1]):
            rows[key] = named
    return rows


def named_keys(schema) -> set[str]:
    """Every key a JSON Schema's objects name, nested ones included."""
    if isinstance(schema, list):
        return set().union(*map(named_keys, schema))
    if not isinstance(schema, dict):
        return set()
    return set(schema.get("properties", {})).union(*map(named_keys, schema.values()))


def scheduler_rows() -> dict[tuple[str, str], set[str]]:
    """docs/schedulers.md's table: (backend, SCHED) → the parameters its row names."""
    text = (REPO / "docs/schedulers.md").read_text()
    rows, backend = {}, None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[2].startswith("`") or cells[2] == "`SCHED`":
            continue
        backend = cells[1] or backend
        rows[(backend, cells[2].strip("`"))] = set(re.findall(r"\b[A-Z][A-Z_]+\b", cells[3]))
    return rows


def test_the_schedulers_table_has_every_scheduler_and_its_parameters():
    expected = {
        (backend, sched): {PARAM_NAMES[p] for p in params}
        for backend, table in SCHEDULERS.items()
        for sched, params in table.items()
    }
    assert scheduler_rows() == expected


def test_results_md_has_a_row_for_every_section_of_meta_json():
    from hvbench_analysis import results

    assert set(meta_json_rows()) == set(results.SECTIONS)


def test_the_json_schema_of_meta_json_is_the_one_exported():
    from hvbench_analysis import results

    exported = json.loads((REPO / "docs/meta.schema.json").read_text())
    assert exported == results.json_schema(), (
        "python -m hvbench_analysis.results > docs/meta.schema.json"
    )
