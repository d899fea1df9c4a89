"""Lets a restarted engine load the model compile vLLM saved (CPU).

In its default mode vLLM compiles the model's `forward` once per start
(Dynamo, AOTAutograd and Inductor: most of start-up) and saves the result
under `VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash>`, keyed
by the engine config and checked against the traced sources on load.

vLLM 0.32 bug: its CPU build never loads that file. The CPU platform
compiles with the plain `"inductor"` backend, and
`vllm.compilation.decorators._try_load_aot_compiled_fn` calls
`finalize_loading()` on every loaded function, a method only vLLM's own
backend's functions have. The load fails with "'function' object has no
attribute 'finalize_loading'", and the model compiles again.

A function the plain backend compiled is complete once loaded, so for our
model the missing step is a no-op. Other models keep vLLM's behaviour.
Remove when the plain backend's functions have `finalize_loading` or vLLM's
loader stops calling it for them; `load_saved_compiles` then does nothing.
"""

import functools


def _nothing_to_finalize(self, vllm_config):
    """A function compiled by the plain Inductor backend loads complete."""


def load_saved_compiles(model_class):
    """Lets `model_class` engines load the compile an earlier start saved.

    Re-entrant. Does nothing once vLLM's loader no longer needs it, or has
    changed.

    Args:
        model_class: The vLLM model class whose engines may load it.
    """
    from torch._dynamo.aot_compile_types import (
        BundledAOTAutogradSerializableCallable as PlainBackendFunction,
    )
    from vllm.compilation import decorators

    vllm_load = getattr(decorators, "_try_load_aot_compiled_fn", None)
    if vllm_load is None or hasattr(PlainBackendFunction, "finalize_loading"):
        return
    if hasattr(vllm_load, "__wrapped__"):
        return

    @functools.wraps(vllm_load)
    def load(model, path):
        if not isinstance(model, model_class):
            return vllm_load(model, path)
        PlainBackendFunction.finalize_loading = _nothing_to_finalize
        try:
            return vllm_load(model, path)
        finally:
            del PlainBackendFunction.finalize_loading

    decorators._try_load_aot_compiled_fn = load
