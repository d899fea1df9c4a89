"""Tensor-parallel engines for tests, and what each rank holds."""

import contextlib

from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env


@contextlib.contextmanager
def tensor_parallel_llm(model, tensor_parallel_size=2, **kwargs):
    """A `KerasHubLLM` on vLLM's multiprocessing executor, one worker a rank.

    The engine core runs in this process (so `collective_rpc` can send the
    workers a test's function); the workers are spawned processes talking
    over vLLM's CPU communicator, as in serving.

    Args:
        model: Passed to `KerasHubLLM`.
        tensor_parallel_size: Ranks.
        **kwargs: `vllm.LLM` arguments over `TEST_ENGINE_KWARGS`.
    """
    from vllm_keras_hub.llm import KerasHubLLM

    with in_process_engine_env():
        llm = KerasHubLLM(
            model,
            tensor_parallel_size=tensor_parallel_size,
            **{**TEST_ENGINE_KWARGS, **kwargs},
        )
        try:
            yield llm
        finally:
            llm.close()
            del llm


def rank_report(worker):
    """What one worker's model holds; run on each with `collective_rpc`.

    Returns:
        A dict: `rank`; `linears`, `(held, full, shards)` elements of each
        vLLM parallel linear layer; `keras_kernels`, elements left in the
        Keras kernels those layers replaced; `heads`, `(query, kv)` heads
        of each vLLM `Attention`; `alibi_slopes` and `sinks` per layer;
        `experts`, each `FusedMoE`'s intermediate size on this rank;
        `head`, the output head's vocabulary rows here and in all.
    """
    from vllm.distributed import get_tensor_model_parallel_rank

    model = worker.model_runner.model
    linears = [
        (
            layer.input_size_per_partition * layer.output_size_per_partition,
            layer.input_size * layer.output_size,
            layer.tp_size,
        )
        for layer in model.parallel_linears
    ]
    keras_kernels = sum(
        layer._kernel.value.numel()
        for layer in model.backbone._flatten_layers(include_self=False)
        if hasattr(layer, "_packed_kernel") and hasattr(layer, "_kernel")
    )
    specs = model.attention_specs
    return dict(
        rank=get_tensor_model_parallel_rank(),
        linears=linears,
        keras_kernels=keras_kernels,
        heads=[(spec.num_heads, spec.num_kv_heads) for spec in specs],
        alibi_slopes=[spec.alibi_slopes for spec in specs],
        sinks=[spec.sinks for spec in specs],
        experts=[
            runner.routed_experts.intermediate_size_per_partition
            for runner in model.moe
        ],
        head=(model.lm_head.num_embeddings_per_partition, model.lm_head.org_vocab_size),
    )
