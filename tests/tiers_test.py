"""The tiers (`testing/tiers.py`): every slice names real tests, and every
landing fits CI's budget by the durations the last runs recorded."""

import json

import pytest

from conftest import DURATIONS
from vllm_keras_hub.testing import tiers

# A cold landing must pass `.ci/run` in 45 minutes on 2 cores: setup takes
# 2 to 4, and runs here have been up to 1.32x slower than the durations
# they left behind, so two workers get at most this much recorded work.
LANDING_BUDGET_WORKER_MIN = 2 * (45 - 4) / 1.32


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
    assert [tiers.landing_slice(count) for count in range(400, 406)] == [2, 3, 1, 2, 3, 1]


@pytest.mark.parametrize("number", sorted(tiers.SLICES))
def test_each_landing_fits_the_budget(all_nodeids, number):
    with open(DURATIONS) as f:
        durations = json.load(f)
    landing = [n for n in all_nodeids if tiers.slice_of(n) in (None, number)]
    untimed = [n for n in landing if n not in durations]
    minutes = sum(durations.get(n, 10.0) for n in landing) / 60
    assert minutes <= LANDING_BUDGET_WORKER_MIN, (
        f"the default tier and slice {number} took {minutes:.1f} worker-minutes in the "
        f"last runs, over {LANDING_BUDGET_WORKER_MIN:.1f}; move cases to a lighter slice "
        f"({len(untimed)} untimed tests counted at 10 s each)"
    )
