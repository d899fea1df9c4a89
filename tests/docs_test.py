"""The docs name real tests, each with the tier it runs in.

A page names a test as a node id in backticks, `tests/x_test.py::test_y[z]`
(a leading folder may be left out, `*` is any text), followed by its tier:
`(every landing)` or `(slice N)`, the extended slice that runs it every
third landing (`testing/tiers.py`; `python -m vllm_keras_hub.testing.tiers`
sets every page's tags to the tiers of the day). A test module named alone,
`x_test.py`, must exist. The old unchecked marker, "(extended)", is gone.
"""

import glob
import os
import re

import pytest

from vllm_keras_hub.testing import support_matrix
from vllm_keras_hub.testing import tiers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(
    os.path.relpath(path, _ROOT)
    for path in [os.path.join(_ROOT, "README.md"), *glob.glob(os.path.join(_ROOT, "docs", "*.md"))]
)
MODULE = re.compile(r"`((?:[\w.]+/)*\w+_test\.py)`")
OLD_MARKER = re.compile(r"\*\(?[Ee]xtended:?\)?:?\*")


def _text(page):
    with open(os.path.join(_ROOT, page)) as f:
        return f.read()


def _test_modules():
    found = {}
    for folder in ("tests", "vllm_keras_hub", "bench"):
        for path in glob.glob(os.path.join(_ROOT, folder, "**", "*_test.py"), recursive=True):
            relative = os.path.relpath(path, _ROOT)
            found.setdefault(os.path.basename(relative), []).append(relative)
    return found


def test_the_checker_reads_tags():
    text = "see `a_test.py::test_b[c]` *(slice 2)* and `tests/d_test.py::test_e` (every landing), `f_test.py::g`."
    assert [(pattern, tag) for pattern, tag, _, _ in tiers.references(text)] == [
        ("a_test.py::test_b[c]", "slice 2"),
        ("tests/d_test.py::test_e", "every landing"),
        ("f_test.py::g", None),
    ]


@pytest.mark.parametrize("page", PAGES)
def test_named_tests_exist_in_the_tier_the_page_says(page, all_nodeids):
    text = _text(page)
    problems = []
    for pattern, tag, _, _ in tiers.references(text):
        named = tiers.matching(pattern, all_nodeids)
        if not named:
            problems.append(f"{pattern}: no such test")
            continue
        if tag is None:
            problems.append(f"{pattern}: no tier given, write (every landing) or (slice N)")
            continue
        wrong = sorted({tiers.tier_name(nodeid) for nodeid in named} - {tag})
        if wrong:
            problems.append(f"{pattern}: said {tag!r}, but some run in {wrong}")
    for match in OLD_MARKER.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        problems.append(f"line {line}: {match.group(0)!r} names no test; name them with tiers")
    assert not problems, f"{page}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_named_test_modules_exist(page):
    modules = _test_modules()
    missing = []
    for match in MODULE.finditer(_text(page)):
        path = match.group(1)
        known = modules.get(os.path.basename(path), [])
        if not any(candidate.endswith(path) for candidate in known):
            missing.append(path)
    assert not missing, f"{page} names test modules that do not exist: {missing}"


def test_the_support_matrix_is_rendered_from_recorded_runs():
    """The page's matrix is `scripts/update-reports`'s rendering of the
    committed runs, never typed by hand; every cell names its run."""
    recorded = support_matrix.load(os.path.join(_ROOT, support_matrix.RECORDED))
    assert recorded["runs"], "no recorded run: run scripts/update-reports --run"
    assert support_matrix.page_block(recorded) in _text(support_matrix.PAGE)
