import json
import os
import time

import pytest

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")
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
# Per-test durations of the last runs (setup, call and teardown, seconds),
# which every run updates: they order the next run, longest work first.
# Beside them, the last run's wall time, machine and outcome.
DURATIONS = os.path.join(_ROOT, "reports", "test-durations.json")
LAST_RUN = os.path.join(_ROOT, "reports", "test-run.json")
# A test not timed yet counts as this long.
_UNTIMED_S = 10.0


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
    an xdist work unit (`XDIST_GROUP`), so the compile is paid once.
    """
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
    with running_server(
        command, port, model_name=DEFAULT_MODEL_NAME, api_key=api_key
    ) as (base_url, process):
        yield base_url, process


def _work_unit(item):
    """The xdist work unit of `item`: tests of one unit run on one worker.

    A module's tests stay together (its module-scoped engines start once),
    unless it sets `XDIST_SPREAD = True` (each test on its own) or names a
    group with `XDIST_GROUP` (modules sharing one engine or server).
    """
    module = item.module
    if getattr(module, "XDIST_SPREAD", False):
        return None
    return getattr(module, "XDIST_GROUP", None) or item.nodeid.split("::")[0]


def _nodeid(nodeid):
    """A test's id without the `@group` suffix xdist's loadgroup adds."""
    return nodeid.rsplit("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups the tests into xdist work units, longest first.

    Before xdist's own hook turns `xdist_group` marks into units. Ordered
    by the durations the last runs wrote, so the two workers finish close
    together; tests within a unit keep their order.
    """
    try:
        with open(DURATIONS) as f:
            durations = json.load(f)
    except (OSError, ValueError):
        durations = {}
    keys, units = [], {}
    for index, item in enumerate(items):
        unit = _work_unit(item)
        if unit is not None:
            item.add_marker(pytest.mark.xdist_group(unit))
        key = unit or item.nodeid
        first, total = units.get(key, (index, 0.0))
        units[key] = (first, total + durations.get(item.nodeid, _UNTIMED_S))
        keys.append(key)
    order = [(-units[key][1], units[key][0], index) for index, key in enumerate(keys)]
    items[:] = [item for _, item in sorted(zip(order, items), key=lambda pair: pair[0])]


_TIMES = {}
_STARTED = []


def pytest_sessionstart(session):
    _STARTED.append(time.time())


def pytest_runtest_logreport(report):
    """Adds up each test's setup, call and teardown (on the controller too)."""
    nodeid = _nodeid(report.nodeid)
    _TIMES[nodeid] = _TIMES.get(nodeid, 0.0) + report.duration


def _write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=0 if path == DURATIONS else 2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def _write_run(session, exitstatus):
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        cpu = platform.processor()
    workers = getattr(session.config.option, "numprocesses", None) or 0
    _write_json(LAST_RUN, {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{os.cpu_count()} cores ({cpu})",
        "workers": workers,
        "wall_s": round(time.time() - _STARTED[0], 1),
        "tests_s": round(sum(_TIMES.values()), 1),
        "tests": len(_TIMES),
        "failed": session.testsfailed,
        "exit_status": int(exitstatus),
    })


def _write_durations():
    try:
        with open(DURATIONS) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    known.update({nodeid: round(seconds, 2) for nodeid, seconds in _TIMES.items()})
    _write_json(DURATIONS, dict(sorted(known.items())))


def pytest_sessionfinish(session, exitstatus):
    """Writes what the run measured: per-test durations, and the support
    matrix the parity tests filled in.

    Under pytest-xdist (scripts/test), a worker hands its matrix rows to the
    controller instead, which merges them in `pytest_testnodedown`; the
    controller sees every test's report, so it writes the durations.
    """
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing import support_matrix

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["support_matrix"] = support_matrix.RESULTS
        return
    if _TIMES:
        _write_durations()
        _write_run(session, exitstatus)
    if support_matrix.RESULTS:
        with open(reports.path("support_matrix.md"), "w") as f:
            f.write(support_matrix.render())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from vllm_keras_hub.testing import support_matrix

    rows = getattr(node, "workeroutput", {}).get("support_matrix", {})
    for name, values in rows.items():
        support_matrix.RESULTS.setdefault(name, {}).update(values)
