import json
import os
import time

import pytest

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")


def _keep_absl_off_the_capture_file():
    """Points absl's log handler at the real stderr.

    absl's handler keeps the `sys.stderr` of its creation: under pytest,
    capture's file. vLLM's `dictConfig` (`vllm/logger.py`) closes every
    logging handler when an in-process engine configures logging, and absl's
    `PythonHandler.close()` closes its stream unless it is `sys.stderr` at
    that moment, which a `capsys` test has replaced. Capture's file closed,
    every later test of the worker then errors ("I/O operation on closed
    file"). Outside pytest the stream is `sys.stderr` and stays open.
    """
    import sys

    from absl import logging as absl_logging

    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


_keep_absl_off_the_capture_file()

# The suite's own cache roots, not the user's ~/.cache/vllm and
# ~/.cache/vllm-keras-hub: vLLM's compile and model-info caches, and the
# SmolLM2 preset. Kept between runs, as a user's are (vLLM keys its saved
# compiles by config and traced sources, so a changed file compiles again);
# tests about reuse make their own. Delete the folder for a cold run.
_CACHE_ROOT = os.environ.get("VLLM_KERAS_HUB_TEST_CACHE") or os.path.join(
    os.path.expanduser("~"), ".cache", "vllm-keras-hub-tests"
)
os.environ["VLLM_CACHE_ROOT"] = os.path.join(_CACHE_ROOT, "vllm")
os.environ["VLLM_KERAS_HUB_CACHE"] = os.path.join(_CACHE_ROOT, "vllm-keras-hub")

_ROOT = os.path.dirname(os.path.abspath(__file__))
# A test the recorded run did not time counts as this long.
UNTIMED_S = 10.0


@pytest.fixture(scope="session")
def shared(request, tmp_path_factory):
    """The run's tiny presets and oracles (`testing/shared.py`), made once
    for all modules and both pytest-xdist workers."""
    from vllm_keras_hub.testing.shared import Shared

    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        # A worker's base is a folder in the run's own.
        base = base.parent
    return Shared(base / "shared")


@pytest.fixture(scope="session")
def default_server():
    """`vllm-keras-hub serve` of the default model as users start it
    (compiled), with an API key: `(base_url, process)`.

    One server for `server_test.py` and `reliability_test.py`, which share
    an xdist work unit (`GROUPS`), so the compile is paid once. It stops
    after the unit's last test (`pytest_runtest_teardown`): an idle vLLM
    server polls, and took a fifth of a core from the rest of the run.
    """
    import contextlib

    from vllm_keras_hub.smollm2 import DEFAULT_MODEL_NAME
    from vllm_keras_hub.testing.server import DEFAULT_SERVER_API_KEY as api_key
    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    port = free_port()
    command = serve_command(
        "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "16",
        "--api-key", api_key,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        _RUNNING_SERVERS[:] = [stack]
        yield stack.enter_context(
            running_server(command, port, model_name=DEFAULT_MODEL_NAME, api_key=api_key)
        )


# The default server's exit stack while it runs.
_RUNNING_SERVERS = []


def pytest_runtest_teardown(item, nextitem):
    """Stops the default server once its work unit is done."""
    unit = "default_server"
    if _RUNNING_SERVERS and work_unit(item.nodeid) == unit:
        if nextitem is None or work_unit(nextitem.nodeid) != unit:
            _RUNNING_SERVERS.pop().close()


# xdist work units: the tests of one unit run on one worker, in order. A
# module is one unit, so its module-scoped engines start once, except:
# modules whose every test starts its own engine, each test a unit...
SPREAD_MODULES = (
    "tests/model_test.py",
    "tests/native_families_test.py",
    "tests/parallel_test.py",
)
# ... and modules that share one unit, for a session-scoped server.
GROUPS = {
    "tests/server_test.py": "default_server",
    "tests/reliability_test.py": "default_server",
}


# Every test collected, before `-m` deselects any: what docs may name.
ALL_NODEIDS = pytest.StashKey[list]()


def _whole(config):
    """Whether this run collected the whole suite (before `-m`)."""
    return not config.args or sorted(config.args) == sorted(config.getini("testpaths"))


@pytest.fixture(scope="session")
def all_nodeids(request):
    """Every test of the suite, both tiers: this run's collection where it
    collected everything, else a collection of its own."""
    from vllm_keras_hub.testing import tiers

    config = request.config
    if _whole(config):
        return config.stash[ALL_NODEIDS]
    return tiers.collect_nodeids(_ROOT)


# The extended slice `scripts/test` chose for this landing, if any.
LANDING_SLICE = os.environ.get("VLLM_KERAS_HUB_SLICE", "")


def extended(nodeid):
    """Whether the test `nodeid` is in the extended tier (`testing/tiers.py`)."""
    from vllm_keras_hub.testing import tiers

    return tiers.slice_of(nodeid) is not None


def work_unit(nodeid):
    """The xdist work unit of the test `nodeid`."""
    module = nodeid.split("::")[0]
    if module in SPREAD_MODULES:
        return nodeid
    return GROUPS.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling over `work_unit`s.

    Not `--dist loadgroup`: pytest-xdist 3.8 marks a group by appending to
    `item._nodeid`, which pytest 9 no longer reads, so every test became
    its own unit and module-scoped engines started on both workers.
    """
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    return WorkUnits(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the extended tier and each test's slice, keeps the whole
    collection for `all_nodeids`, and orders the work units longest first by
    the recorded run's durations, so the two workers finish close together;
    tests within a unit keep their order. xdist (`--no-loadscope-reorder`)
    hands the units out in this order.
    """
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing import tiers

    try:
        with open(reports.DURATIONS) as f:
            durations = json.load(f)
    except (OSError, ValueError):
        durations = {}
    keys, units = [], {}
    config.stash[ALL_NODEIDS] = [item.nodeid for item in items]
    for index, item in enumerate(items):
        number = tiers.slice_of(item.nodeid)
        if number is not None:
            item.add_marker(pytest.mark.extended)
            item.add_marker(getattr(pytest.mark, f"slice{number}"))
        key = work_unit(item.nodeid)
        first, total = units.get(key, (index, 0.0))
        units[key] = (first, total + durations.get(item.nodeid, UNTIMED_S))
        keys.append(key)
    order = [(-units[key][1], units[key][0], index) for index, key in enumerate(keys)]
    items[:] = [item for _, item in sorted(zip(order, items), key=lambda pair: pair[0])]


def pytest_report_header(config):
    """Names the landing's slice in the log, as CI runs it."""
    if LANDING_SLICE:
        return f"tiers: the default tier and slice {LANDING_SLICE} of the extended tier"
    return None


def pytest_terminal_summary(terminalreporter):
    """Says how many tests of each tier ran, also under `-q`."""
    from vllm_keras_hub.testing import tiers

    ran = {}
    for nodeid in _TIMES:
        name = tiers.tier_name(nodeid)
        ran[name] = ran.get(name, 0) + 1
    if ran:
        counts = ", ".join(f"{ran[name]} {name}" for name in sorted(ran))
        terminalreporter.write_line(f"tiers: {counts}")


_TIMES = {}
_STARTED = []


def pytest_sessionstart(session):
    """Starts the clock, notes whether the test cache is cold, and on the
    controller clears the last run's outputs: `scripts/update-reports` must
    copy this run's, not a report an earlier run left beside them."""
    import shutil

    from vllm_keras_hub.testing import reports

    _STARTED.append(time.time())
    _COLD.append(not os.path.isdir(_CACHE_ROOT) or not os.listdir(_CACHE_ROOT))
    config = session.config
    if not hasattr(config, "workerinput") and not config.option.collectonly:
        shutil.rmtree(reports.RUN_REPORTS, ignore_errors=True)


def pytest_collection_finish(session):
    _COLLECTED[:] = [len(session.items)]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller's count of the tests the run selected."""
    _COLLECTED[:] = [len(ids)]


def pytest_runtest_logreport(report):
    """Adds up each test's setup, call and teardown (on the controller too)."""
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


_COLD = []
_COLLECTED = []


def _write_run(session, exitstatus):
    """This run's durations and record, in `build/test-reports/`."""
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing.support_matrix import commit_of

    config = session.config
    # Every test of a landing's tiers, or of all, ran: none was picked by
    # path, -k, --lf or --deselect, and none left out by -x or a crash.
    whole = (
        _whole(config)
        and not config.option.keyword
        and not config.getoption("deselect", None)
        and not config.getoption("lf", False)
        and _COLLECTED == [len(_TIMES)]
        and (not config.option.markexpr or config.option.markexpr.startswith("not extended"))
    )
    times = {nodeid: round(seconds, 2) for nodeid, seconds in sorted(_TIMES.items())}
    reports.write_json(reports.path(reports.RUN_DURATIONS), times)
    reports.write_json(reports.path(reports.RUN_RECORD), reports.run_record(
        commit=commit_of(_ROOT),
        workers=getattr(config.option, "numprocesses", None) or 0,
        wall_s=time.time() - _STARTED[0],
        times=times,
        whole=bool(whole),
        cold_cache=bool(_COLD and _COLD[0]),
        extended_slice=int(LANDING_SLICE) if LANDING_SLICE else None,
        extended_tests=sum(extended(nodeid) for nodeid in _TIMES),
        failed=session.testsfailed,
        exit_status=int(exitstatus),
    ))  # fmt: skip


def pytest_sessionfinish(session, exitstatus):
    """Writes what the run measured into `build/test-reports/`: per-test
    durations, the run's record, and the support matrix cells the tests
    recorded, with this run's commit and date.

    Under pytest-xdist (scripts/test), a worker hands its cells to the
    controller instead, which merges them in `pytest_testnodedown`; the
    controller sees every test's report, so it writes the durations.
    """
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing import support_matrix

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["support_matrix"] = {
            "rows": support_matrix.RESULTS,
            "chat": support_matrix.CHAT,
            "refused": {key: sorted(value) for key, value in support_matrix.REFUSED.items()},
        }
        return
    if _TIMES:
        _write_run(session, exitstatus)
    if support_matrix.RESULTS or support_matrix.CHAT or support_matrix.REFUSED:
        reports.write_json(reports.path("support_matrix.json"), support_matrix.this_run(_ROOT))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from vllm_keras_hub.testing import support_matrix

    cells = getattr(node, "workeroutput", {}).get("support_matrix", {})
    for name, values in cells.get("rows", {}).items():
        support_matrix.RESULTS.setdefault(name, {}).update(values)
    for name, kinds in cells.get("chat", {}).items():
        for kind, values in kinds.items():
            for value in values:
                support_matrix.record_chat(name, value, served=kind == "served")
    for backbone, columns in cells.get("refused", {}).items():
        for column in columns:
            support_matrix.record_refusal(backbone, column)
