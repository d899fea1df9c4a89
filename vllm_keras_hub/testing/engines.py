"""Real vLLM engines for tests, started the cheap way where that is enough."""

import contextlib
import gc
import os

from vllm_keras_hub.entrypoints.llm import KerasHubLLM


def _engine_kwargs():
    from vllm.platforms import current_platform

    # 1 GiB of KV cache: enough for the tests' tiny models and short prompts,
    # and engines fit side by side. Eager, since compiling takes ~30 s per
    # engine: tests of the compiled mode ask for it.
    kwargs = dict(
        max_model_len=256,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 30,
    )
    if not current_platform.is_cpu():
        # vLLM checks each engine's share against the GPU's free memory at
        # start-up, whatever its KV cache size.
        kwargs["gpu_memory_utilization"] = 0.2
    return kwargs


TEST_ENGINE_KWARGS = _engine_kwargs()


@contextlib.contextmanager
def in_process_engine_env():
    """Makes vLLM engines started inside the block run in this process."""
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
        gc.collect()


@contextlib.contextmanager
def in_process_llm(model, **kwargs):
    """A `KerasHubLLM` whose engine core and worker run in this process.

    The same engine, scheduler, paged KV cache and attention kernel as the
    default multi-process layout, without spawning two Python processes
    (about 5 s to start instead of 40 s). Tests of the spawned layout (plugin
    registration in every process, the server) start engines normally.

    Args:
        model: Passed to `KerasHubLLM`.
        **kwargs: `vllm.LLM` arguments over `TEST_ENGINE_KWARGS`.
    """
    with in_process_engine_env():
        llm = KerasHubLLM(
            model,
            distributed_executor_backend="uni",
            **{**TEST_ENGINE_KWARGS, **kwargs},
        )
        try:
            yield llm
        finally:
            llm.close()
            del llm


def served_model(llm):
    """The model (a `KerasHubForCausalLM`, say) inside an `in_process_llm` engine."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    return executor.driver_worker.worker.model_runner.model
