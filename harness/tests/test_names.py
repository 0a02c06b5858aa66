"""Names are names (hvbench_agent.names): run ids, campaign names and point ids, a testbed's
guests and neighbours. A bad one is refused with one line naming the rule, before anything
is created."""

import pytest
import yaml
from hvbench_agent.names import BadName, check_name
from hvbench_agent.neighbours import Group, Load
from hvbench_harness import campaign, run
from hvbench_harness.parts import RunError
from hvbench_harness.testbed import Testbed, TestbedError

GOOD = ["try-1", "20261122T101500Z-xen-rtds-b77500-p100000-e0", "p03-2cpu+1membw-r2", "a.b_c"]
BAD = ["../../etc/x", "x;touch y/z", ".hidden", "..", "", "a b", "a/b", "-x", "é", "a" * 129]


@pytest.mark.parametrize("name", GOOD)
def test_a_name_is_taken_as_it_is(name):
    assert check_name(name, "RUN_ID") == name


@pytest.mark.parametrize("name", BAD)
def test_a_bad_name_is_refused_with_the_rule(name):
    with pytest.raises(BadName) as refused:
        check_name(name, "RUN_ID")
    assert str(refused.value).startswith("RUN_ID")
    assert "letters, digits" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["../../etc/x", "x;touch y/z", ".x"])
def test_a_run_with_a_bad_run_id_creates_nothing(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "manifest.json").write_text("{}")
    (tmp_path / "data").mkdir()
    code = run.main([f"RUN_ID={name}", "--work", "w/work", "--results", "w/results"])
    assert code == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"make run: RUN_ID={name!r} is not a name: letters, digits")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "model"]
    for folder in ("w/work", "w/results"):  # where the name would have led
        assert not (tmp_path / folder / name).resolve().exists()


def test_a_path_outside_its_folder_is_refused(tmp_path):
    assert run.under(str(tmp_path), "try-1") == tmp_path / "try-1"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(RunError, match="does not lie in"):
        run.under(str(tmp_path / "results"), "elsewhere")


def write(folder, name, doc):
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_campaign_whose_name_is_not_a_name_is_refused(tmp_path):
    path = write(tmp_path, "table 4;x", {"target": "bare", "settings": {"warmup": 0}})
    with pytest.raises(campaign.CampaignError, match="the campaign's name"):
        campaign.load(path)


def test_point_ids_are_names_whatever_the_settings_say(tmp_path):
    doc = {"target": "bare", "settings": {"warmup": 0}, "grid": {"noise": ["2:cpu, 1:membw"]}}
    doc["points"] = [{"noise_cpus": "job"}, {"noise_cpus": "0"}]
    c = campaign.load(write(tmp_path, "noisy", doc))
    assert [p.id for p in c.points] == ["p01-on-job", "p02-on-0"]
    doc["grid"] = {"noise": ["2:cpu, 1:membw", "1:cpu"]}
    ids = [p.id for p in campaign.load(write(tmp_path, "noisy", doc)).points]
    assert ids[0] == "p01-2cpu+1membw-on-job"  # the space dropped
    assert all(check_name(campaign.run_id(p, 9), "id") for p in c.points)


def test_a_point_id_too_long_is_refused(tmp_path):
    doc = {"target": "bare", "settings": {"warmup": 0}, "grid": {"governor": ["a" * 130, "b"]}}
    with pytest.raises(campaign.CampaignError, match="characters long"):
        campaign.load(write(tmp_path, "long", doc))


def guest_doc(**changes) -> dict:
    doc = {
        "target": "kvm",
        "realtime_domains": ["hvbench-rt"],
        "install_dir": "/opt/hvbench",
        "work_dir": "/w",
        "host": {"name": "lab-1", "address": "10.0.0.1"},
        "messaging_vms": [{"name": "m", "address": "10.0.0.2", "private_address": "10.0.0.2"}],
        "realtime_vms": [{"name": "rt", "address": "10.0.0.3", "private_address": "10.0.0.3"}],
        "neighbours": [{"name": "hvbench-neighbour-0", "address": "10.0.0.4"}],
    }
    return doc | changes


@pytest.mark.parametrize(
    "changes",
    [
        {"realtime_domains": ["rt; reboot"]},
        {"neighbours": [{"name": "../n", "address": "10.0.0.4"}]},
        {"messaging_vms": [{"name": "m x", "address": "10.0.0.2", "private_address": "x"}]},
        {"messaging_domain": "$(id)"},
    ],
)
def test_a_testbed_with_a_bad_guest_name_is_refused(changes):
    assert Testbed.from_json(guest_doc()).realtime_domain == "hvbench-rt"
    with pytest.raises(TestbedError, match="is not a name"):
        Testbed.from_json(guest_doc(**changes))


def test_a_loads_name_is_a_name(tmp_path):
    with pytest.raises(BadName, match="a load's name"):
        Load(Group(1, "cpu"), None, tmp_path, "../noise-0")
