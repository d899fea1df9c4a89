"""The tiers (`testing/tiers.py`): every slice names real tests, and every
landing fits CI's budget by the durations the last runs recorded."""

import json

import pytest

from conftest import UNTIMED_S
from vllm_keras_hub.testing import tiers
from vllm_keras_hub.testing.reports import DURATIONS
from vllm_keras_hub.testing.reports import LAST_RUN

# `.ci/run` must pass in 45 minutes from a fresh clone with an empty test
# cache; its setup took 1.6 minutes in CI (a66f348) and 1.4 here (1210693).
# CI also runs slower than the recorded pace: stop 59's landing (slice 3 of
# 6a05537) took 48.0 minutes where this check, at the pace of 7a0cc25's
# run, put it at 46.0 (and at 44.1 at the pace of the run before).
CI_BUDGET_MIN = 45
SETUP_MIN = 2
CI_SLOWER_MIN = 2.5


def test_every_pattern_names_a_test(all_nodeids):
    empty = [
        (number, pattern)
        for number, patterns in tiers.SLICES.items()
        for pattern in patterns
        if not tiers.matching(pattern, all_nodeids)
    ]
    assert not empty, f"slice patterns that name no test (renamed or removed?): {empty}"


def test_no_test_is_in_two_slices(all_nodeids):
    doubled = {}
    for nodeid in all_nodeids:
        numbers = [
            number
            for number, patterns in tiers.SLICES.items()
            if any(tiers.matching(pattern, [nodeid]) for pattern in patterns)
        ]
        if len(numbers) > 1:
            doubled[nodeid] = numbers
    assert not doubled, doubled


def test_the_landings_take_turns():
    assert [tiers.landing_slice(count) for count in range(400, 406)] == [1, 2, 3, 4, 1, 2]


@pytest.mark.parametrize("number", sorted(tiers.SLICES))
def test_each_landing_fits_the_budget(all_nodeids, number):
    """Each landing's recorded work at the pace of the recorded run (a cold,
    whole run on two workers, `testing/reports.py`: its wall time per second
    of test time), so the machine's speed and the workers' overlap are
    measured, not guessed."""
    with open(DURATIONS) as f:
        durations = json.load(f)
    with open(LAST_RUN) as f:
        run = json.load(f)
    landing = [n for n in all_nodeids if tiers.slice_of(n) in (None, number)]
    untimed = [n for n in landing if n not in durations]
    work_s = sum(durations.get(n, UNTIMED_S) for n in landing)
    minutes = work_s * run["wall_s"] / run["tests_s"] / 60
    assert minutes + SETUP_MIN + CI_SLOWER_MIN <= CI_BUDGET_MIN, (
        f"the default tier and slice {number} would take {minutes:.1f} minutes in pytest, "
        f"{SETUP_MIN} in setup and {CI_SLOWER_MIN} for CI's slower pace, over "
        f"{CI_BUDGET_MIN}, at the pace of the run of "
        f"{run['date']} ({run['tests']} tests in {run['wall_s'] / 60:.1f} minutes); move "
        f"cases to a lighter slice ({len(untimed)} untimed tests counted at {UNTIMED_S} s each)"
    )
