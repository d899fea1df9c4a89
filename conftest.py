import os

# Before anything imports keras: the served layers run on torch.
os.environ.setdefault("KERAS_BACKEND", "torch")


def pytest_sessionfinish(session):
    """Writes the support matrix the parity tests filled in, if they ran."""
    from vllm_keras_hub.testing import support_matrix

    if support_matrix.RESULTS:
        os.makedirs("reports", exist_ok=True)
        with open(os.path.join("reports", "support_matrix.md"), "w") as f:
            f.write(support_matrix.render())
