"""One KerasHub matmul layer, column or row sharded onto a vLLM parallel linear.

`column` makes a Dense or plain-matmul EinsumDense a `ColumnParallelLinear`
over its first output axis (heads, units or channels), with its bias cut
to the rank's slice; `row` makes it a `RowParallelLinear` over its first
contracted axis, whose all-reduce follows it, and the layer's own bias
is added once, after the reduce. Either way the layer's own call runs, on
the vLLM layer's packed weight (`linear.use_packed_kernel`), and Keras's
kernel is released: each rank holds only its shard.
"""

import math

from vllm_keras_hub.layers.linear import linear
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError


def plan(layer):
    """`(variable, permutation, contracted_rank)` of a plain matmul, or raises."""
    weight = linear.matmul_weight(layer)
    if weight is None:
        raise UnsupportedParallelismError(
            f"{layer.name} ({type(layer).__name__}) is not a plain matmul; "
            "it cannot be sharded."
        )
    return weight


def heads(layer):
    """An EinsumDense projection's first output axis: its heads."""
    variable, permutation, contracted_rank = plan(layer)
    return variable.shape[permutation[contracted_rank]]


def column(layer, rank, ranks, prefix, weights, units="units", order=None):
    """Makes `layer` a `ColumnParallelLinear` over its first output axis.

    Args:
        layer: A built Dense or plain-matmul EinsumDense.
        rank: This rank's index among `ranks` shards.
        ranks: How many shards the output is cut into (fewer than the
            tensor-parallel size where KV heads are replicated).
        prefix: The vLLM layer's name.
        weights: The backbone's `PresetWeights`.
        units: What the first output axis counts, for the error message.
        order: For a flat output of several parts (Qwen3.5's `[q | k | v]`
            channels), the output's order with each rank's channels
            contiguous, rank by rank, as vLLM's `MergedColumnParallelLinear`
            gives each rank its slice of every part. A bias is refused.
    """
    from vllm.model_executor.layers.linear import ColumnParallelLinear

    variable, permutation, contracted_rank = plan(layer)
    kernel = weights.read(variable).detach().permute(permutation)
    in_size = math.prod(kernel.shape[:contracted_rank])
    out_shape = list(kernel.shape[contracted_rank:])
    if out_shape[0] % ranks:
        raise UnsupportedParallelismError(
            f"{layer.name}: {out_shape[0]} {units} do not split into {ranks} "
            "shards."
        )
    flat = kernel.reshape(in_size, -1)
    if order is not None:
        if len(out_shape) != 1 or getattr(layer, "bias", None) is not None:
            raise UnsupportedParallelismError(
                f"{layer.name}: only a flat output with no bias can be reordered."
            )
        flat = flat[:, order]
    vllm_linear = ColumnParallelLinear(
        in_size,
        math.prod(out_shape),
        bias=False,
        params_dtype=kernel.dtype,
        prefix=prefix,
        return_bias=False,
        tp_rank=rank,
        tp_size=ranks,
    )
    vllm_linear.weight.weight_loader(vllm_linear.weight, flat.t())
    out_shape[0] //= ranks
    bias = getattr(layer, "bias", None)
    if bias is not None:
        if tuple(bias.shape) != tuple(kernel.shape[contracted_rank:])[-bias.ndim :]:
            raise UnsupportedParallelismError(
                f"{layer.name}: a bias of shape {tuple(bias.shape)} over an "
                f"output of shape {tuple(kernel.shape[contracted_rank:])} "
                "cannot be sharded."
            )
        if bias.ndim == len(out_shape):
            size = out_shape[0]
            whole = weights.read(bias)
            weights.keep(bias, whole[rank * size : (rank + 1) * size].clone())
    _use(layer, vllm_linear, in_size, contracted_rank, tuple(out_shape), variable, weights)
    return vllm_linear


def row(layer, rank, ranks, prefix, weights):
    """Makes `layer` a `RowParallelLinear` over its first contracted axis.

    Args:
        layer: A built Dense or plain-matmul EinsumDense.
        rank: This rank's tensor-parallel index (vLLM's own narrows by it).
        ranks: The tensor-parallel size.
        prefix: The vLLM layer's name.
        weights: The backbone's `PresetWeights`.
    """
    from vllm.model_executor.layers.linear import RowParallelLinear

    variable, permutation, contracted_rank = plan(layer)
    kernel = weights.read(variable).detach().permute(permutation)
    in_shape = list(kernel.shape[:contracted_rank])
    if in_shape[0] % ranks:
        raise UnsupportedParallelismError(
            f"{layer.name}: an input of {in_shape[0]} does not split into "
            f"{ranks} shards."
        )
    in_size = math.prod(in_shape)
    vllm_linear = RowParallelLinear(
        in_size,
        math.prod(kernel.shape[contracted_rank:]),
        bias=False,
        params_dtype=kernel.dtype,
        prefix=prefix,
        return_bias=False,
    )
    vllm_linear.weight.weight_loader(
        vllm_linear.weight, kernel.reshape(in_size, -1).t()
    )
    out_shape = tuple(kernel.shape[contracted_rank:])
    _use(layer, vllm_linear, in_size // ranks, contracted_rank, out_shape, variable, weights)
    return vllm_linear


def _use(layer, vllm_linear, in_size, contracted_rank, out_shape, variable, weights):
    vllm_linear.quant_method.process_weights_after_loading(vllm_linear)
    linear.use_packed_kernel(layer, vllm_linear, in_size, contracted_rank, out_shape)
    weights.release([variable])
    layer._packed_kernel.freed = True
