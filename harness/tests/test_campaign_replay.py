"""A campaign replayed over a recorded one (`make campaign ... REPLAY=<folder>`): each run is
the recorded run of the same settings and repetition, copied under the new run's id; nothing
runs. The recorded campaign here is a grid of the stand-in harness of test_campaign.py."""

import json
import sys
from pathlib import Path

import pytest
from hvbench_analysis import results
from hvbench_analysis.campaign import summary
from hvbench_harness import campaign
from test_campaign import FAKE, run_args, write

# a harness that fails loudly if a replay starts it
NEVER = (sys.executable, "-c", "raise SystemExit('a replayed campaign started a run')")


def grid(name: str, budgets=(20_000, 40_000), order: str = "sequential") -> dict:
    return {
        "description": name,
        "target": "bare",
        "repetitions": 2,
        "order": order,
        "settings": {"records": 1200},
        "points": [{"sched": "deadline", "period": 100_000, "budget": b} for b in budgets],
    }


@pytest.fixture
def recorded(tmp_path) -> Path:
    script = tmp_path / "fake_run.py"
    script.write_text(FAKE)
    path = write(tmp_path, "recorded", grid("recorded"))
    code = campaign.run_campaign(
        campaign.load(path), run_args(tmp_path), harness=(sys.executable, str(script))
    )
    assert code == 0
    return tmp_path / "results" / "recorded"


def replay(tmp_path: Path, doc: dict, recorded: Path, name: str = "replayed") -> int:
    options = run_args(tmp_path / "replay")
    options = campaign.Options(**{**options.__dict__, "replay": str(recorded)})
    return campaign.run_campaign(campaign.load(write(tmp_path, name, doc)), options, NEVER)


def test_each_run_is_the_recorded_run_of_its_settings_and_repetition(tmp_path, recorded):
    # another order and other point names: runs are matched by settings, not by name
    assert replay(tmp_path, grid("replayed", (40_000, 20_000), "shuffled"), recorded) == 0
    folder = tmp_path / "replay" / "results" / "replayed"
    index = json.loads((folder / "campaign.json").read_text())
    assert len(index["runs"]) == 4 and {e["status"] for e in index["runs"]} == {"done"}
    assert index["replayed_from"] == str(recorded)
    assert f"Replayed: every run is a copy of a run of {recorded}" in summary(index)
    for entry in index["runs"]:
        meta = results.read_meta(folder / entry["run_id"])
        assert meta["run_id"] == entry["run_id"]  # the new id, the rest the recorded run's
        source = Path(meta["replayed_from"])
        assert source.parent == recorded
        original = results.read_meta(source)
        assert original["requested"]["rep"] == entry["rep"]
        assert f"b{entry['settings']['budget']}" in source.name
        assert meta["latency"] == original["latency"]
        log = (folder / "logs" / f"{entry['run_id']}.log").read_text()
        assert log == f"replayed: a copy of {source}\n"


def test_a_setting_the_recorded_campaign_lacks_fails_that_run_with_the_reason(tmp_path, recorded):
    assert replay(tmp_path, grid("replayed", (20_000, 30_000)), recorded) == 1
    index = json.loads((tmp_path / "replay" / "results" / "replayed" / "campaign.json").read_text())
    failed = [e for e in index["runs"] if e["status"] != "done"]
    assert [e["settings"]["budget"] for e in failed] == [30_000, 30_000]
    assert all("has no finished run of" in e["reason"] for e in failed)
    assert failed[1]["reason"].endswith("budget=30000, period=100000, sched=deadline, repetition 2")


def test_a_replay_from_no_campaign_another_target_or_its_own_folder_is_refused(tmp_path, recorded):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(campaign.CampaignError, match="holds no campaign"):
        replay(tmp_path, grid("a"), empty, "a")
    index = json.loads((recorded / "campaign.json").read_text())
    other = tmp_path / "xen-campaign"
    other.mkdir()
    (other / "campaign.json").write_text(json.dumps({**index, "target": "xen"}))
    with pytest.raises(campaign.CampaignError, match=r"ran on xen; .* runs on bare"):
        replay(tmp_path, grid("b"), other, "b")
    own = tmp_path / "replay" / "results" / "c"
    with pytest.raises(campaign.CampaignError, match="is where this campaign writes its runs"):
        replay(tmp_path, grid("c"), own, "c")
    # refused before anything was written
    assert not (tmp_path / "replay" / "results").exists()


def test_a_recorded_index_whose_run_id_is_a_path_is_refused(tmp_path, recorded):
    # a run id becomes the folder copied: `../outside` would copy a folder outside the campaign
    index = json.loads((recorded / "campaign.json").read_text())
    index["runs"][0]["run_id"] = "../outside"
    (recorded / "campaign.json").write_text(json.dumps(index))
    with pytest.raises(campaign.CampaignError, match=r"'\.\./outside' is not a name"):
        replay(tmp_path, grid("replayed"), recorded)
    index["runs"][0] |= {"run_id": "p01-b20000-r1", "settings": None}
    (recorded / "campaign.json").write_text(json.dumps(index))
    with pytest.raises(campaign.CampaignError, match="without its settings or repetition"):
        replay(tmp_path, grid("replayed"), recorded)
    assert not (tmp_path / "replay" / "results").exists()


def test_a_recorded_run_that_cannot_be_read_fails_that_run_and_the_rest_go_on(tmp_path, recorded):
    (recorded / "p02-b40000-r2" / "meta.json").write_text("{not json")
    assert replay(tmp_path, grid("replayed"), recorded) == 1
    folder = tmp_path / "replay" / "results" / "replayed"
    index = json.loads((folder / "campaign.json").read_text())
    failed = [e for e in index["runs"] if e["status"] != "done"]
    assert [e["run_id"] for e in failed] == ["p02-b40000-r2"]
    assert "p02-b40000-r2 could not be replayed: meta.json is not valid JSON" in failed[0]["reason"]
    assert len([e for e in index["runs"] if e["status"] == "done"]) == 3
