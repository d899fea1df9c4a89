"""Keras on the torch backend, in every process that serves a KerasHub model.

vLLM's model runner calls the model with torch tensors and binds torch KV
caches to it, so the KerasHub layers must be torch modules.

keras-hub 0.32 ships its own `vllm.general_plugins` entry point, which vLLM
may load before ours. It imports Keras at once, on Keras's default backend
(TensorFlow) when `KERAS_BACKEND` is unset; without TensorFlow that import
fails half-way and leaves `keras.src...` and `keras_hub.src...` submodules in
`sys.modules`. A later `import keras` would reuse them and fail again, or
run on the backend they were configured for. `forget_failed_keras_import()`
drops them, so Keras is imported afresh, on torch, once a KerasHub model is
served; nothing imports Keras for any other model.
"""

import importlib.util
import os
import sys

_KERAS_PACKAGES = ("keras", "keras_hub")


def default_to_torch():
    """Makes torch Keras's backend unless the environment names another."""
    require_keras_hub()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    forget_failed_keras_import()


def require_keras_hub():
    """Raises, with the command that installs it, unless keras-hub is installed.

    The package does not depend on keras-hub: keras-hub's metadata requires
    TensorFlow, which serving never uses (`pyproject.toml`).
    """
    if importlib.util.find_spec("keras_hub") is None:
        raise ImportError(
            "vllm-keras-hub serves KerasHub models, and keras-hub is not "
            "installed. Install it without its TensorFlow dependency: "
            "pip install --no-deps keras-hub==0.32.0"
        )


def forget_failed_keras_import():
    """Drops the submodules a failed `import keras` (or keras_hub) left.

    A package whose import raised is removed from `sys.modules`, its
    submodules that finished are not. With `keras` itself absent, nothing
    can use them; with it present, Keras was imported and is kept.
    """
    if "keras" in sys.modules:
        return
    for name in [n for n in sys.modules if n.split(".")[0] in _KERAS_PACKAGES]:
        del sys.modules[name]


def require_torch_backend():
    """Raises unless Keras runs, or will run, on the torch backend.

    Call it before importing Keras where a KerasHub model is served: a
    backend named in `KERAS_BACKEND` is refused before Keras tries to import
    it (TensorFlow and JAX are not installed with vllm-keras-hub).
    """
    require_keras_hub()
    requested = os.environ.setdefault("KERAS_BACKEND", "torch")
    if requested != "torch":
        raise RuntimeError(
            "vllm-keras-hub serves KerasHub models on Keras's torch backend, "
            f"but KERAS_BACKEND={requested!r}. Unset it, or set "
            "KERAS_BACKEND=torch, for the processes that serve this model."
        )
    forget_failed_keras_import()
    import keras

    if keras.config.backend() != "torch":
        raise RuntimeError(
            "vllm-keras-hub serves KerasHub models on Keras's torch backend, "
            f"but Keras was already imported on '{keras.config.backend()}'. "
            "Set KERAS_BACKEND=torch before anything imports keras."
        )
