"""Gemma3n: per-layer heads, and KV sharing.

Its last `num_kv_shared_layers` layers attend over an earlier layer's cache
and compute only their query; the targets come from the backbone
(`kv_sharing_targets`).
"""

from keras import ops

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import kv_placeholder
from vllm_keras_hub.layers.attention.attention_routes import OUTPUT_WEIGHTS_AND_CACHE
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.paged_attention import paged_attention


def attention(layer, hidden_states, positions):
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
        layer,
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


def kv_sharing_targets(backbone):
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


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # `Gemma3nCausalLM.call_with_cache`: the embedding processor (token and
    # per-layer embeddings), then the text model (AltUp, Laurel, layers,
    # final norm). With images, the processor's per-layer inputs, projected
    # with the embeddings the images were merged into.
    processor = backbone.embedding_processor
    embeddings = hidden
    if embeddings is None:
        embeddings, per_layer_inputs = processor({"token_ids": token_ids})
    else:
        in_vocabulary = ops.logical_and(
            token_ids >= 0, token_ids < processor.vocab_size_per_layer_input
        )
        per_layer_ids = ops.where(in_vocabulary, token_ids, ops.zeros_like(token_ids))
        text_model = backbone.language_model
        per_layer_inputs = text_model.project_per_layer_inputs(
            embeddings, text_model.get_per_layer_inputs(per_layer_ids)
        )
    return backbone.language_model(
        token_ids, ops.cast(padding_mask, "bool"), embeddings, per_layer_inputs
    )


FAMILY = Family(
    "gemma3n",
    "Gemma3n",
    "Gemma3nBackbone",
    OURS,
    ("<end_of_turn>",),
    tensor_parallel=True,
    pipeline_refusal=(
        "its layers pass a stack of AltUp hidden states and per-layer "
        "inputs from layer to layer, not one hidden state"
    ),
    attention={
        "Gemma3nTextAttention": Route(
            attention,
            returns=OUTPUT_WEIGHTS_AND_CACHE,
            kv_sharing_targets=kv_sharing_targets,
        )
    },
    text_forward=text_forward,
    image_architecture=architectures.GEMMA3N_VISION,
    speculative_refusals={
        "eagle3": "its layers pass AltUp's stack of hidden states, not the one "
        "residual stream an EAGLE-3 head reads."
    },
)
