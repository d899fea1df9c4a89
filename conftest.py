import os

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


def pytest_sessionfinish(session):
    """Writes the support matrix the parity tests filled in, if they ran.

    Under pytest-xdist (scripts/test), a worker hands its rows to the
    controller instead, which merges them in `pytest_testnodedown`.
    """
    from vllm_keras_hub.testing import reports
    from vllm_keras_hub.testing import support_matrix

    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["support_matrix"] = support_matrix.RESULTS
    elif support_matrix.RESULTS:
        with open(reports.path("support_matrix.md"), "w") as f:
            f.write(support_matrix.render())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from vllm_keras_hub.testing import support_matrix

    rows = getattr(node, "workeroutput", {}).get("support_matrix", {})
    for name, values in rows.items():
        support_matrix.RESULTS.setdefault(name, {}).update(values)
