"""Tensor parallelism: each rank holds its shard of the KerasHub matmuls.

As in vLLM's own models, every transformer layer's attention and MLP are
split across the tensor-parallel ranks:
- the query, key and value projections and the MLP's input projections are
  vLLM `ColumnParallelLinear`s: each rank holds its heads (or intermediate
  units) of the kernel and its slice of the bias;
- the attention output and MLP output projections are `RowParallelLinear`s
  over the rank's heads or units, with vLLM's all-reduce after them, and the
  layer's own bias added once, after the reduce;
- where there are fewer KV heads than ranks, each KV head is replicated on
  `ranks / kv_heads` ranks, as `QKVParallelLinear` replicates it;
- per-head tensors (ALiBi slopes, attention sinks) are cut to the rank's
  heads;
- a Gated DeltaNet layer in place of attention (Qwen3.5) keeps its heads
  (`parallel_state.py`).

The KerasHub layers keep their own code: an `EinsumDense` over a kernel
of `heads / ranks` heads gives `heads / ranks` heads out, and the layers'
reshapes, norms, rotary embeddings and activations work per head. Only the
head counts the attention routes pass on (`num_key_value_heads`) become the
rank's. The output head and the input embedding hold the rank's rows of the
vocabulary (`vocab_parallel.py`).
"""

from vllm_keras_hub.layers.attention.attention import routing_layers
from vllm_keras_hub.layers.linear import kernel_readers
from vllm_keras_hub.layers.moe import moe_routes
from vllm_keras_hub.layers.parallel import linear_shards
from vllm_keras_hub.layers.parallel import parallel_mlp
from vllm_keras_hub.layers.parallel import parallel_state
from vllm_keras_hub.layers.parallel import vocab_parallel
from vllm_keras_hub.layers.state import state_routes
from vllm_keras_hub.loading import heap
from vllm_keras_hub.parallel_settings import UnsupportedParallelismError

# Sublayer names, by what the sublayer is in its attention or decoder layer.
QUERY = ("_query_dense", "query_dense", "q_proj")
KEY = ("_key_dense", "key_dense", "k_proj")
VALUE = ("_value_dense", "value_dense", "v_proj")
# One projection whose output is per head `[query | key | value]` (GPT-NeoX):
# a column shard over its heads gives each rank its heads' q, k and v.
FUSED_QKV = ("_qkv_dense",)
ATTENTION_OUTPUT = ("_output_dense", "output_dense", "o_proj")
KV_HEAD_COUNTS = (
    "num_key_value_heads",
    "_num_key_value_heads",
    "effective_num_kv_heads",
)
MLP_INPUT = (
    "_feedforward_intermediate_dense",
    "_feedforward_gate_dense",
    "feedforward_intermediate_dense",
    "feedforward_gate_dense",
    "_mlp_intermediate_dense",
    "dense_h_to_4h",
    "gating_ffw",
    "gating_ffw_2",
    "gate_proj",
    "up_proj",
)
MLP_OUTPUT = (
    "_feedforward_output_dense",
    "feedforward_output_dense",
    "_mlp_output_dense",
    "dense_4h_to_h",
    "ffw_linear",
    "down_proj",
)


def _sublayer(owner, names, role):
    found = []
    for name in names:
        layer = getattr(owner, name, None)
        # Keras's `MultiHeadAttention` (GPT-2, OPT) names each projection
        # twice, as a private attribute and a public property.
        if layer is not None and all(layer is not seen for seen in found):
            found.append(layer)
    if not found or (len(found) > 1 and role != "mlp"):
        raise UnsupportedParallelismError(
            f"{owner.name}: expected one {role} projection among {names}, found "
            f"{len(found)}; it cannot be sharded."
        )
    return found


def _cut_per_head(attention, rank, ranks, weights):
    # The rank's heads of the tensors vLLM's `Attention` takes per head.
    slopes = getattr(attention, "_vllm_alibi_slopes", None)
    if slopes is not None:
        size = len(slopes) // ranks
        attention._vllm_alibi_slopes = slopes[rank * size : (rank + 1) * size]
    sinks = getattr(attention, "sinks", None)
    if sinks is not None:
        size = sinks.shape[0] // ranks
        whole = weights.read(sinks)
        weights.keep(sinks, whole[rank * size : (rank + 1) * size].clone())


def _attention_of(block):
    # The sublayer with a vLLM route: keras-hub's own or one we installed.
    found = routing_layers([block])
    if len(found) != 1:
        raise UnsupportedParallelismError(
            f"{block.name}: expected one attention layer with a vLLM route, "
            f"found {len(found)}; it cannot be sharded."
        )
    return found[0]


def shard(transformer_layers, rank, ranks, prefix, weights, first_index=0):
    """Shards every transformer layer's attention and MLP across the ranks.

    Call after the attention routes are installed (ALiBi slopes are read
    from all heads), inside `set_current_vllm_config`, with vLLM's
    distributed groups initialised. Each sharded weight is read whole from
    the preset, one at a time, and only this rank's slice is kept, as
    vLLM's own weight loaders do.

    Args:
        transformer_layers: The transformer layers of this pipeline stage,
            their attention routes installed.
        rank: This rank's tensor-parallel index.
        ranks: The tensor-parallel size.
        prefix: Name prefix of the vLLM layers.
        weights: The backbone's `PresetWeights`.
        first_index: The backbone's index of the first of the layers.

    Returns:
        The vLLM linear layers made, to be registered as the model's
        submodules.
    """
    made = []
    for index, block in enumerate(transformer_layers, start=first_index):
        name = f"{prefix}{index}."
        mixer = state_routes.state_layer(block)
        if mixer is not None:
            # A Gated DeltaNet layer in place of attention (Qwen3.5).
            made.extend(parallel_state.shard(mixer, rank, ranks, f"{name}gdn.", weights))
        else:
            made.extend(_shard_attention(block, rank, ranks, name, weights))
        if kernel_readers.reads_kernels(block):
            parallel_mlp.shard(block, rank, ranks, weights)
            heap.release_free_memory()
            continue
        if _has_moe(block):
            # vLLM's `FusedMoE` shards the experts and all-reduces their sum;
            # a shared expert and the router stay whole on every rank.
            heap.release_free_memory()
            continue
        # SmolLM3 keeps its projections in an `mlp` sublayer.
        mlp = getattr(block, "mlp", block)
        for index_in, layer in enumerate(_sublayer(mlp, MLP_INPUT, "mlp")):
            made.append(
                linear_shards.column(layer, rank, ranks, f"{name}mlp_in{index_in}", weights)
            )
        for index_out, layer in enumerate(_sublayer(mlp, MLP_OUTPUT, "mlp")):
            made.append(
                linear_shards.row(layer, rank, ranks, f"{name}mlp_out{index_out}", weights)
            )
        parallel_mlp.gather_statistics(mlp, rank, ranks)
        # Each whole kernel read for its shard is freed, but from the heap
        # (`loading/heap.py`), where the shards kept do not reuse it.
        heap.release_free_memory()
    return made


def _shard_attention(block, rank, ranks, name, weights):
    """Column shards of the block's q/k/v, a row shard of its output."""
    attention = _attention_of(block)
    (output,) = _sublayer(attention, ATTENTION_OUTPUT, "attention output")
    if any(getattr(attention, fused, None) is not None for fused in FUSED_QKV):
        (qkv,) = _sublayer(attention, FUSED_QKV, "fused query/key/value")
        made = [linear_shards.column(qkv, rank, ranks, f"{name}qkv", weights, "heads")]
    else:
        made = _shard_qkv(attention, rank, ranks, name, weights)
    made.append(linear_shards.row(output, rank, ranks, f"{name}o", weights))
    _cut_per_head(attention, rank, ranks, weights)
    return made


def _shard_qkv(attention, rank, ranks, name, weights):
    """Column shards of separate q/k/v projections, KV heads replicated as needed.

    Gemma4's KV-sharing layers have no key or value projection (they read
    the rank's heads of the layer they share, cut the same way), and its
    `attention_k_eq_v` layers have no value projection.
    """
    (query,) = _sublayer(attention, QUERY, "query")
    key = _optional(attention, KEY, "key")
    value = _optional(attention, VALUE, "value")
    kv_heads = _kv_heads(attention, key)
    if kv_heads % ranks and ranks % kv_heads:
        raise UnsupportedParallelismError(
            f"{attention.name}: {kv_heads} KV heads neither split over nor "
            f"replicate onto {ranks} ranks."
        )
    # KV head `h` is on ranks `h * replicas ... (h + 1) * replicas - 1`.
    kv_shards = min(kv_heads, ranks)
    kv_rank = rank * kv_shards // ranks
    made = [linear_shards.column(query, rank, ranks, f"{name}q", weights, "heads")]
    for projection, suffix in ((key, "k"), (value, "v")):
        if projection is not None:
            made.append(
                linear_shards.column(
                    projection, kv_rank, kv_shards, f"{name}{suffix}", weights, "KV heads"
                )
            )
    # The KV head count the layer hands to vLLM's attention (Mistral keeps
    # it private; Gemma4 counts it per layer).
    for count in KV_HEAD_COUNTS:
        if hasattr(attention, count):
            setattr(attention, count, kv_heads // kv_shards)
    return made


def _optional(owner, names, role):
    if all(getattr(owner, name, None) is None for name in names):
        return None
    (layer,) = _sublayer(owner, names, role)
    return layer


def _kv_heads(attention, key):
    # A `Dense` key projection (SmolLM3) has one flat output axis, and a
    # KV-sharing layer (Gemma4) has none.
    if key is None:
        return attention.effective_num_kv_heads
    if len(key.kernel.shape) == 2:
        return attention.num_key_value_heads
    return linear_shards.heads(key)


def _has_moe(block):
    return any(
        type(layer).__name__ in moe_routes.ROUTES
        for layer in block._flatten_layers(include_self=False)
    )


def shard_stage(stage, weights, prefix):
    """This rank's shards of a pipeline stage's matmuls, and its output head.

    Call inside `set_current_vllm_config`, with vLLM's distributed groups
    initialised.

    Args:
        stage: This rank's `pipeline.Stage`.
        weights: The backbone's `PresetWeights`.
        prefix: The model's module prefix.

    Returns:
        `(linears, head, logits_processor)`: the vLLM parallel linears made
        (and on the first stage an untied input table), and on the last
        stage the vocabulary-parallel head and its `LogitsProcessor`
        (`None` elsewhere, and at one rank: no sharding).
    """
    from vllm.distributed import get_tensor_model_parallel_rank
    from vllm.distributed import get_tensor_model_parallel_world_size
    from vllm.logger import init_logger

    from vllm_keras_hub.layers.attention.attention import token_embedding

    ranks = get_tensor_model_parallel_world_size()
    if ranks == 1:
        return [], None, None
    embedding = token_embedding(stage.backbone)
    head = logits_processor = None
    if stage.last:
        head, logits_processor = vocab_parallel.head(
            embedding, f"{prefix}lm_head", weights
        )
    made, lookup = [], None
    if stage.first:
        lookup = vocab_parallel.input_lookup(
            embedding, head, f"{prefix}embed_tokens", weights
        )
        if lookup is not head:
            made.append(lookup)
    if head is not None:
        vocab_parallel.prepare_head(head, looks_up=lookup is head)
    # The Keras table (the variable, not the `embeddings` property's value)
    # is read by no one now.
    weights.release([vocab_parallel.table_layer(embedding)._embeddings])
    linears = shard(
        stage.layers,
        get_tensor_model_parallel_rank(),
        ranks,
        f"{prefix}parallel_linears.",
        weights,
        first_index=stage.start,
    )
    init_logger(__name__).info(
        "%d KerasHub matmul layers hold 1/%d of their weights on vLLM's "
        "parallel linear layers",
        len(linears),
        ranks,
    )
    return made + linears, head, logits_processor
