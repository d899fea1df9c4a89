import os
import shutil
import tempfile

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")
# The suite's own cache roots, not the user's ~/.cache: vLLM's compile cache
# and vllm-keras-hub's (the SmolLM2 preset). Tests about reuse make their own.
_CACHE_ROOT = tempfile.mkdtemp(prefix="vllm-keras-hub-tests-")
os.environ["VLLM_CACHE_ROOT"] = os.path.join(_CACHE_ROOT, "vllm")
os.environ["VLLM_KERAS_HUB_CACHE"] = os.path.join(_CACHE_ROOT, "vllm-keras-hub")


def pytest_sessionfinish(session):
    """Writes the support matrix the parity tests filled in, if they ran."""
    from vllm_keras_hub.testing import support_matrix

    from vllm_keras_hub.testing import reports

    if support_matrix.RESULTS:
        with open(reports.path("support_matrix.md"), "w") as f:
            f.write(support_matrix.render())
    shutil.rmtree(_CACHE_ROOT, ignore_errors=True)
