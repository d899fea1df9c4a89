"""Attention routes for Gemma3n and Gemma4: per-layer heads and KV sharing.

Their last layers attend over an earlier layer's cache and compute only
their query; the targets come from the backbone (`*_kv_sharing_targets`).
"""

from keras import ops

from vllm_keras_hub.layers.attention_routes import paged_attention


def kv_placeholder(query, num_kv_heads):
    # keras-hub's bridge reads the KV head count from `key` and reshapes K/V;
    # a KV-sharing layer's vLLM `Attention` reads the target's cache instead,
    # and the serving model hands it no K/V at all.
    return ops.zeros_like(query[:, :, :num_kv_heads, :])


def gemma3n(layer, hidden_states, positions):
    # `Gemma3nTextAttention`: q/k RMSNorm before RoPE, a scale-free RMSNorm on
    # V, softmax scale 1, local and global RoPE bases and the window set per
    # layer. A KV-sharing layer computes only its query and attends over its
    # target's cache (`kv_sharing_target`).
    # Query heads counted from the projection: a rank's share under tensor
    # parallelism.
    num_tokens = ops.shape(hidden_states)[0]
    heads = (num_tokens, 1, -1, layer.head_dim)
    kv_heads = (num_tokens, 1, layer.num_key_value_heads, layer.head_dim)
    query = layer.q_norm(ops.reshape(layer.q_proj(hidden_states), heads))
    query = layer.rotary_embedding(query, positions=positions)
    if layer._vllm_kv_sharing_target is None:
        key = layer.k_norm(ops.reshape(layer.k_proj(hidden_states), kv_heads))
        key = layer.rotary_embedding(key, positions=positions)
        value = layer.v_norm(ops.reshape(layer.v_proj(hidden_states), kv_heads))
    else:
        key = value = kv_placeholder(query, layer.num_key_value_heads)
    output = paged_attention(
        query,
        key,
        value,
        1.0,
        num_kv_heads=layer.num_key_value_heads,
        # Its mask keeps `|query - key| < sliding_window`: `sliding_window`
        # tokens, query included, as vLLM counts them.
        sliding_window=layer.sliding_window,
        kv_sharing_target=layer._vllm_kv_sharing_target,
    )
    output = ops.reshape(output, (num_tokens, 1, -1))
    return layer.o_proj(output)


def gemma4(layer, hidden_states, positions):
    # `Gemma4TextAttention`: as Gemma3n's, plus per-layer head size and KV
    # heads (global layers: `global_head_dim`, and K=V from one projection
    # with `num_global_key_value_heads`), partial RoPE on global layers and
    # an optional logit soft cap. KV-sharing layers as in `gemma3n`.
    if layer.use_bidirectional_attention:
        raise ValueError(
            "Gemma4 with bidirectional attention (an embedding model) is not "
            "a causal LM; vllm-keras-hub serves causal attention only."
        )
    query = layer.query_norm(layer.query_dense(hidden_states))
    query = layer._apply_rope(query, 0, positions=positions)
    num_kv_heads = layer.effective_num_kv_heads
    if layer._vllm_kv_sharing_target is None:
        projected = layer.key_dense(hidden_states)
        key = layer._apply_rope(layer.key_norm(projected), 0, positions=positions)
        if not layer.attention_k_eq_v:
            projected = layer.value_dense(hidden_states)
        value = layer.value_norm(projected)
    else:
        key = value = kv_placeholder(query, num_kv_heads)
    # The decoder block windows local layers only (`_compute_attention_mask`),
    # keeping `sliding_window_size` tokens, query included.
    sliding_window = None
    if layer.use_sliding_window_attention and not layer.is_global_attention:
        sliding_window = layer.sliding_window_size
    output = paged_attention(
        query,
        key,
        value,
        1.0,
        num_kv_heads=num_kv_heads,
        sliding_window=sliding_window,
        soft_cap=layer.logit_soft_cap,
        kv_sharing_target=layer._vllm_kv_sharing_target,
    )
    return layer.output_dense(output)


def gemma3n_kv_sharing_targets(backbone):
    # `Gemma3nTextModel.call`: from `first_kv_shared_layer_idx` on (when it is
    # above 0), a layer reuses the K/V of the last earlier non-shared layer
    # of its `layer_types` entry.
    text_model = backbone.language_model
    first_shared = text_model.first_kv_shared_layer_idx
    targets, last_of_type = [], {}
    for index, layer_type in enumerate(text_model.layer_types):
        if index >= first_shared > 0:
            if layer_type not in last_of_type:
                raise ValueError(
                    f"Gemma3n layer {index} shares the K/V of an earlier "
                    f"{layer_type} layer, but none precedes it."
                )
            targets.append(last_of_type[layer_type])
        else:
            last_of_type[layer_type] = index
            targets.append(None)
    return targets


def gemma4_kv_sharing_targets(backbone):
    # `Gemma4Backbone` records each KV-sharing layer's source on its decoder
    # block (`kv_shared_layer_index`); with every layer shared (a drafter
    # reading another model's cache) there is no source in the model.
    targets = []
    for index, block in enumerate(backbone.transformer_layers):
        target = block.kv_shared_layer_index if block.is_kv_shared_layer else None
        if target is not None and not 0 <= target < index:
            raise ValueError(
                f"Gemma4 layer {index} shares the K/V of layer {target}, not an "
                "earlier layer of this model (a drafter reading another "
                "model's cache cannot be served on its own)."
            )
        targets.append(target)
    return targets
