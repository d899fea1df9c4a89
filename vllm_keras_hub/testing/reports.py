"""Where a test run writes what it measured, and how a run is recorded.

Into `build/test-reports/` (not committed), so a partial run never
overwrites the committed `reports/` or docs/supported-families.md's matrix;
`scripts/update-reports` copies a run's outputs there on purpose. Timings
are copied only from a run CI's budget can be judged by: a cold (empty
test cache), whole run (every test of its tiers) on two workers, of a
committed tree. `tests/tiers_test.py` judges each landing by them.
"""

import json
import os
import platform
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_REPORTS = os.path.join(ROOT, "build", "test-reports")
# The recorded run: per-test durations (setup, call and teardown, seconds),
# which also order a run's work units, longest first; and its wall time,
# machine and outcome.
DURATIONS = os.path.join(ROOT, "reports", "test-durations.json")
LAST_RUN = os.path.join(ROOT, "reports", "test-run.json")
RUN_DURATIONS = "test-durations.json"
RUN_RECORD = "test-run.json"


def path(name):
    """The path of run output `name`, its folder made."""
    os.makedirs(RUN_REPORTS, exist_ok=True)
    return os.path.join(RUN_REPORTS, name)


def write_json(file, value):
    """Writes `value` to `file` whole or not at all (one line a key for
    durations, to keep their diffs short)."""
    os.makedirs(os.path.dirname(file), exist_ok=True)
    with open(file + ".tmp", "w") as f:
        json.dump(value, f, indent=0 if file.endswith(RUN_DURATIONS) else 2)
        f.write("\n")
    os.replace(file + ".tmp", file)


def run_record(commit, workers, wall_s, times, whole, cold_cache, extended_slice,
               extended_tests, failed, exit_status):
    """What `LAST_RUN` holds of one run (`times`: seconds per test id)."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "machine": f"{os.cpu_count()} cores ({cpu})",
        "workers": workers,
        "whole": whole,
        "cold_cache": cold_cache,
        "wall_s": round(wall_s, 1),
        "tests_s": round(sum(times.values()), 1),
        "tests": len(times),
        "extended_slice": extended_slice,
        "extended_tests": extended_tests,
        "failed": failed,
        "exit_status": exit_status,
    }


def why_not_recorded(run):
    """Why `run` (a run record) cannot judge CI's budget, or None."""
    reasons = [
        why for why, bad in (
            ("the tree had uncommitted changes", not run.get("commit")),
            ("it ran part of its tiers", not run.get("whole")),
            ("the test cache was warm", not run.get("cold_cache")),
            (f"it ran on {run.get('workers')} workers, not 2", run.get("workers") != 2),
        ) if bad
    ]  # fmt: skip
    return "; ".join(reasons) or None


def last_run():
    """The last run's record (`build/test-reports/`), or None."""
    try:
        with open(os.path.join(RUN_REPORTS, RUN_RECORD)) as f:
            return json.load(f)
    except OSError:
        return None


def record_timings(run):
    """Copies the timings of `run`, the last run, into `reports/`; says
    what it did, or why not."""
    with open(os.path.join(RUN_REPORTS, RUN_DURATIONS)) as f:
        times = json.load(f)
    why = why_not_recorded(run)
    if why:
        return f"timings not recorded: {why}"
    with open(DURATIONS) as f:
        known = json.load(f)
    write_json(DURATIONS, dict(sorted({**known, **times}.items())))
    write_json(LAST_RUN, run)
    return f"{DURATIONS} and {LAST_RUN} updated"


if __name__ == "__main__":
    import sys

    run = last_run()
    if run is None:
        sys.exit(f"no {RUN_REPORTS}/{RUN_RECORD}: run the tests first")
    if not run["commit"]:
        # Nothing of it is recorded (the matrix's merge refuses it too).
        sys.exit("the last run had uncommitted changes: commit, then run again")
    print(record_timings(run))
