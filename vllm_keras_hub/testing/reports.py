"""Where a test run writes what it measured.

Into `build/test-reports/` (not committed), so a partial run never
overwrites the committed `reports/` or docs/supported-families.md's matrix;
`scripts/update-reports` copies a run's outputs there on purpose.
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_REPORTS = os.path.join(ROOT, "build", "test-reports")


def path(name):
    """The path of run output `name`, its folder made."""
    os.makedirs(RUN_REPORTS, exist_ok=True)
    return os.path.join(RUN_REPORTS, name)
