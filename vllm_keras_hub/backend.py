"""Keras backend check: the served layers must be torch modules."""

import os


def require_torch_backend():
    """Raises unless Keras runs (or will run) on the torch backend.

    vLLM's model runner calls the model with torch tensors and binds torch KV
    caches to it, so a KerasHub model on JAX or TensorFlow cannot be served by
    it.
    """
    requested = os.environ.get("KERAS_BACKEND", "torch")
    import keras

    if keras.config.backend() != "torch":
        raise RuntimeError(
            "vllm-keras-hub needs Keras on the torch backend, but Keras is "
            f"running on '{keras.config.backend()}' (KERAS_BACKEND="
            f"{requested!r}). Set KERAS_BACKEND=torch before importing keras."
        )
