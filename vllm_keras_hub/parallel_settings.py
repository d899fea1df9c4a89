"""The parallel layouts a preset can be served in: tensor, pipeline, expert.

Part of `settings.check`. A family is sharded across tensor-parallel ranks
only where its layers are mapped to vLLM's parallel linear layers, and cut
into pipeline stages unless its backbone is refused here; expert parallelism
is refused for every family. Each refusal names the family and what to
serve it with instead.
"""

from vllm_keras_hub import families


class UnsupportedParallelismError(ValueError):
    """A parallel layout KerasHub models cannot be served in yet."""


# Backbone class -> why it cannot be cut into pipeline stages
# (`models/pipeline.py`), from each family's row. Where a family can, some
# cuts still cannot be served; `pipeline.check_stages` refuses those at start-up.
PIPELINE_REFUSALS = {
    family.backbone: family.pipeline_refusal
    for family in families.FAMILIES
    if family.pipeline_refusal
}

# Why a family without `tensor_parallel` is refused at 2 ranks or more.
TENSOR_REFUSAL = "its layers are not mapped to vLLM's parallel linear layers"


def check_parallelism(
    family,
    tensor_parallel_size,
    pipeline_parallel_size=None,
    enable_expert_parallel=False,
):
    """Raises unless `family` can be served at this parallelism.

    Args:
        family: The preset's `families.Family`.
        tensor_parallel_size: vLLM's `tensor_parallel_size`.
        pipeline_parallel_size: vLLM's `pipeline_parallel_size`.
        enable_expert_parallel: vLLM's `enable_expert_parallel`.

    Raises:
        UnsupportedParallelismError: naming the family and what to use.
    """
    staged = pipeline_parallel_size and pipeline_parallel_size > 1
    reason = PIPELINE_REFUSALS.get(family.backbone) if staged else None
    if reason is not None:
        raise UnsupportedParallelismError(
            f"{family.display_name} cannot be served with pipeline parallelism "
            f"(pipeline_parallel_size={pipeline_parallel_size}): {reason}. "
            "Use tensor parallelism (--tensor-parallel-size) where it is "
            "supported, or data parallelism (--data-parallel-size)."
        )
    if enable_expert_parallel:
        raise UnsupportedParallelismError(
            "Expert parallelism (enable_expert_parallel) is not supported for "
            "KerasHub models: vLLM 0.32's CPU fused-MoE experts take no expert "
            "map, and its workers crashed when tried. Under tensor parallelism "
            "the experts are already sharded by vLLM's FusedMoE; serve without "
            "--enable-expert-parallel."
        )
    sharded = tensor_parallel_size and tensor_parallel_size > 1
    if sharded and not family.tensor_parallel:
        mapped = ", ".join(families.tensor_parallel_families())
        raise UnsupportedParallelismError(
            f"{family.display_name} cannot be served with tensor parallelism "
            f"yet (tensor_parallel_size={tensor_parallel_size}): {TENSOR_REFUSAL}. "
            f"Families that are: {mapped}. Serve it with tensor_parallel_size=1, "
            "or scale out with --data-parallel-size."
        )
