"""Tensor parallelism for Gated DeltaNet layers: each rank holds its heads.

As vLLM's own Qwen3.5 shards its GDN layers (`QwenGatedDeltaNetAttention`),
a KerasHub `Qwen3_5GatedDeltaNet` is split by heads across the ranks:
- its `[q | k | v]` input projection gives each rank its query and key
  heads and its value heads (a `MergedColumnParallelLinear`'s slicing,
  here a column shard over channels ordered rank by rank); its gate `z`
  and its `b` and `a` projections, the rank's value heads;
- its convolution's channels, `A_log` and `dt_bias` are cut the same way;
- its output projection is a `RowParallelLinear` over the rank's value
  heads, with vLLM's all-reduce after it;
- its gated norm works per value head, so it stays whole.

The heads are independent through the convolution (per channel) and the
delta rule (per head), so each rank's recurrence is exact on its heads,
and its state in vLLM's state cache holds only them. The layer's own
`call` runs as before on the rank's head counts.
"""

import torch

from vllm_keras_hub.layers.parallel import linear_shards
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError


def shard(layer, rank, ranks, prefix, weights):
    """Keeps this rank's heads of a GDN layer; returns the vLLM linears made.

    Args:
        layer: The KerasHub `Qwen3_5GatedDeltaNet`, built, not yet loaded.
        rank: This rank's tensor-parallel index.
        ranks: The tensor-parallel size.
        prefix: Name prefix of the vLLM layers.
        weights: The backbone's `PresetWeights`.
    """
    for count, what in ((layer.num_k_heads, "key"), (layer.num_v_heads, "value")):
        if count % ranks:
            raise UnsupportedParallelismError(
                f"{layer.name}: its {count} Gated DeltaNet {what} heads do not "
                f"split into {ranks} shards."
            )
    channels = _rank_channels(layer, ranks)
    made = [
        linear_shards.column(
            layer.in_proj_qkv, rank, ranks, f"{prefix}qkv", weights, "channels", channels
        ),
        linear_shards.column(layer.in_proj_z, rank, ranks, f"{prefix}z", weights),
        linear_shards.column(layer.in_proj_b, rank, ranks, f"{prefix}b", weights),
        linear_shards.column(layer.in_proj_a, rank, ranks, f"{prefix}a", weights),
        linear_shards.row(layer.out_proj, rank, ranks, f"{prefix}out", weights),
    ]
    mine = channels.view(ranks, -1)[rank]
    weights.keep(layer.conv1d_weight, weights.read(layer.conv1d_weight)[mine].clone())
    size = layer.num_v_heads // ranks
    for variable in (layer.dt_bias, layer.A_log):
        whole = weights.read(variable)
        weights.keep(variable, whole[rank * size : (rank + 1) * size].clone())
    # What the layer's `call` (and `GatedDeltaNetSpec.of`) reads.
    layer.num_k_heads //= ranks
    layer.num_v_heads //= ranks
    layer.key_dim //= ranks
    layer.value_dim //= ranks
    return made


def _rank_channels(layer, ranks):
    """The `[q | k | v]` channels in the order `[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]`."""
    key, value = layer.key_dim // ranks, layer.value_dim // ranks
    parts = []
    for rank in range(ranks):
        parts += [
            torch.arange(rank * key, (rank + 1) * key),
            layer.key_dim + torch.arange(rank * key, (rank + 1) * key),
            2 * layer.key_dim + torch.arange(rank * value, (rank + 1) * value),
        ]
    return torch.cat(parts)
