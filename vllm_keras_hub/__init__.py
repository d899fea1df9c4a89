"""Serve KerasHub causal LMs through vLLM.

`KerasHubLLM("keras_hub:<preset>")` is a `vllm.LLM` whose model runs the
preset's own KerasHub layers on Keras's torch backend, with attention handed to
vLLM's paged KV cache.
"""

# Importing the package sets nothing: vLLM imports it (our plugin) in every
# process, for every model. `llm.py` and `cli.py`, where a user asks for a
# KerasHub model, and `backend.require_torch_backend()`, where one is
# served, make torch Keras's backend.

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so `import vllm_keras_hub.plugin` in every vLLM process does not
    # import vllm.LLM and its entrypoint machinery.
    if name == "KerasHubLLM":
        from vllm_keras_hub.entrypoints.llm import KerasHubLLM

        return KerasHubLLM
    raise AttributeError(name)


__all__ = ["KerasHubLLM"]
