"""Tensor parallelism for MLPs that need more than column and row shards.

- Gemma4's decoder block does not call its feed-forward layers: it reads
  their kernels (`ops.matmul(x, self.gating_ffw.kernel)`, a KerasHub
  workaround for a graph-tracer bug). Their calls cannot be handed to
  vLLM's parallel linears, so each rank keeps its slice of the Keras
  kernels instead: the gate and up projections by columns, the down
  projection by rows. The norm that follows the MLP all-reduces its input
  first, where vLLM's `RowParallelLinear` would.
- Gemma3n's activation sparsity cuts the gate's activations at their mean
  plus a multiple of their standard deviation over the whole intermediate
  width, which a rank holds only part of. Its own `_gaussian_topk` runs on
  the gate gathered from all ranks, and each rank keeps its part of the
  result. (As read, vLLM's own Gemma3n takes the statistics per shard, so
  its output at 2 ranks differs from 1 rank's.)
"""

from vllm_keras_hub.layers.linear.kernel_readers import BLOCKS
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError

_REDUCED_CLASSES = {}
_GATHERED_CLASSES = {}


def gather_statistics(mlp, rank, ranks):
    """Makes a sharded `mlp`'s sparsity statistics whole-width, if it has any.

    Args:
        mlp: The block's MLP layer, its projections already sharded.
        rank: This rank's tensor-parallel index.
        ranks: The tensor-parallel size.
    """
    if getattr(mlp, "activation_sparsity", 0.0) > 0.0:
        mlp.__class__ = _gathered_class(type(mlp), rank, ranks)


def shard(block, rank, ranks, weights):
    """Keeps this rank's slices of `block`'s MLP kernels.

    Args:
        block: A decoder block `kernel_readers.reads_kernels` is true for.
        rank: This rank's tensor-parallel index.
        ranks: The tensor-parallel size.
        weights: The backbone's `PresetWeights`.
    """
    columns, row = BLOCKS[type(block).__name__]
    for name in columns:
        _keep_slice(getattr(block, name), 1, rank, ranks, weights)
    _keep_slice(getattr(block, row), 0, rank, ranks, weights)
    # Gemma4's MoE blocks norm the dense MLP's output on its own before
    # adding the experts' (which vLLM's `FusedMoE` all-reduces itself).
    norm = block.post_ffw_norm_dense if block.enable_moe_block else block.post_ffw_norm
    norm.__class__ = _reduced_class(type(norm))


def _keep_slice(layer, axis, rank, ranks, weights):
    variable = layer._kernel
    whole = weights.read(variable).detach()
    if whole.ndim != 2 or whole.shape[axis] % ranks:
        raise UnsupportedParallelismError(
            f"{layer.name}: a kernel of shape {tuple(whole.shape)} does not "
            f"split into {ranks} shards along axis {axis}."
        )
    size = whole.shape[axis] // ranks
    weights.keep(variable, whole.narrow(axis, rank * size, size).clone())
    layer._tensor_parallel_whole_shape = tuple(whole.shape)


def _reduced_class(cls):
    if cls not in _REDUCED_CLASSES:

        def call(self, x, *args, **kwargs):
            from vllm.distributed import tensor_model_parallel_all_reduce

            return cls.call(self, tensor_model_parallel_all_reduce(x), *args, **kwargs)

        _REDUCED_CLASSES[cls] = type(cls.__name__, (cls,), {"call": call})
    return _REDUCED_CLASSES[cls]


def _gathered_class(cls, rank, ranks):
    key = (cls, rank, ranks)
    if key not in _GATHERED_CLASSES:

        def _gaussian_topk(self, inputs):
            from vllm.distributed import tensor_model_parallel_all_gather

            whole = tensor_model_parallel_all_gather(inputs.contiguous(), dim=-1)
            size = inputs.shape[-1]
            return cls._gaussian_topk(self, whole).narrow(-1, rank * size, size)

        _GATHERED_CLASSES[key] = type(
            cls.__name__, (cls,), {"_gaussian_topk": _gaussian_topk}
        )
    return _GATHERED_CLASSES[key]
