"""Only a cold, whole run on two workers, of a committed tree, is recorded
as the run CI's budget is judged by."""

import json

from vllm_keras_hub.testing import reports

COLD_LANDING = {"commit": "abc1234", "whole": True, "cold_cache": True, "workers": 2}


def test_a_cold_whole_run_of_a_commit_on_two_workers_is_recorded():
    assert reports.why_not_recorded(COLD_LANDING) is None


def test_every_other_run_says_why_not():
    cases = {
        "uncommitted": {"commit": None},
        "part of its tiers": {"whole": False},
        "warm": {"cold_cache": False},
        "on 0 workers": {"workers": 0},
    }
    for words, change in cases.items():
        why = reports.why_not_recorded({**COLD_LANDING, **change})
        assert why and words in why, (change, why)


def test_recording_merges_the_durations_and_replaces_the_record(tmp_path, monkeypatch):
    runs, committed = tmp_path / "build", tmp_path / "reports"
    runs.mkdir(), committed.mkdir()
    monkeypatch.setattr(reports, "RUN_REPORTS", str(runs))
    monkeypatch.setattr(reports, "DURATIONS", str(committed / "test-durations.json"))
    monkeypatch.setattr(reports, "LAST_RUN", str(committed / "test-run.json"))
    (committed / "test-durations.json").write_text(json.dumps({"a": 1.0, "b": 2.0}))
    (runs / reports.RUN_DURATIONS).write_text(json.dumps({"b": 3.0, "c": 4.0}))
    warm = {**COLD_LANDING, "cold_cache": False}

    assert "warm" in reports.record_timings(warm)
    assert not (committed / "test-run.json").exists()
    reports.record_timings(COLD_LANDING)
    assert json.loads((committed / "test-durations.json").read_text()) == {
        "a": 1.0, "b": 3.0, "c": 4.0
    }  # fmt: skip
    assert json.loads((committed / "test-run.json").read_text()) == COLD_LANDING
