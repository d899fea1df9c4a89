"""Gemma4: per-layer head sizes, KV sharing, and an expert bank.

KV-sharing layers attend over an earlier layer's cache as Gemma3n's do
(`kv_sharing_targets`); the MoE layers' expert bank is routed by its
decoder block's own router.
"""

import torch
from keras import ops

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families.family import Drafter
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import kv_placeholder
from vllm_keras_hub.layers.attention.attention_routes import OUTPUT_AND_CACHE
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.attention.paged_attention import paged_attention
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import gate_up_down_weights
from vllm_keras_hub.layers.moe.moe_routing import MoERoute


def attention(layer, hidden_states, positions):
    # `Gemma4TextAttention`: as Gemma3n's, plus per-layer head size and KV
    # heads (global layers: `global_head_dim`, and K=V from one projection
    # with `num_global_key_value_heads`), partial RoPE on global layers and
    # an optional logit soft cap. KV-sharing layers as in Gemma3n's.
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
        layer,
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


def kv_sharing_targets(backbone):
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


def record_top_k(backbone, blocks):
    # Gemma4's expert bank does not know its top-k; its router does.
    banks = {id(block) for block in blocks if type(block).__name__ == "Gemma4MoEBlock"}
    if not banks:
        return
    for layer in backbone._flatten_layers(include_self=False):
        bank = getattr(layer, "moe_expert_bank", None)
        if bank is not None and id(bank) in banks:
            bank._gemma4_top_k = layer.moe_router.num_experts_per_token


def moe_call(self, x, dispatch_weights):
    # `Gemma4MoEBlock` is the expert bank alone; its decoder block's own
    # `Gemma4Router` computed `dispatch_weights`. `per_expert_scale` is
    # folded into the routing weights (`expert_scale`).
    return moe.fused_experts(self, x, ops.cast(dispatch_weights, x.dtype))


def moe_spec(block):
    # `Gemma4MoEBlock.call`: `gelu(gate, approximate=True) * up`.
    return moe.MoESpec(
        block.num_experts,
        block._gemma4_top_k,
        block.hidden_dim,
        block.expert_intermediate_dim,
        "gelu_tanh",
    )


def moe_variables(block):
    return [block.gate_proj, block.up_proj, block.down_proj]


def moe_weights(block, read):
    return gate_up_down_weights(moe_variables(block), read)


def expert_scale(block, read):
    # KerasHub casts the scale to the compute dtype before multiplying.
    scale = read(block.per_expert_scale)
    return scale.to(getattr(torch, block.compute_dtype)).float()


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # `Gemma4Backbone`'s graph (as its `CausalLM`'s `call_with_cache`, with
    # no cache): scaled token embeddings (or the given ones, images merged
    # in and scaled), per-layer inputs where the preset has them, and each
    # KV-sharing layer handed its source layer's K/V (in the same stage:
    # `pipeline.py`). A stage after the first takes the hidden states with
    # the per-layer inputs beside them, and all but the last return both.
    count = len(backbone.transformer_layers)
    start, end = layers or (0, count)
    per_layer = backbone.hidden_size_per_layer_input
    if start == 0:
        x, per_layer_inputs = _inputs(backbone, token_ids, hidden)
    else:
        x = hidden[..., : backbone.hidden_dim]
        per_layer_inputs = hidden[..., backbone.hidden_dim :] if per_layer > 0 else None
    shared_kv = {}
    for index in range(start, end):
        layer = backbone.transformer_layers[index]
        per_layer_input = None
        if per_layer > 0:
            per_layer_input = per_layer_inputs[..., index * per_layer : (index + 1) * per_layer]
        source = layer.kv_shared_layer_index if layer.is_kv_shared_layer else None
        x, shared_kv[index] = layer(
            x,
            padding_mask=padding_mask,
            per_layer_input=per_layer_input,
            shared_kv=shared_kv.get(source),
            positions=positions,
        )
    if end < count:
        return x if per_layer_inputs is None else ops.concatenate([x, per_layer_inputs], -1)
    return backbone.layer_norm(x)


def _inputs(backbone, token_ids, embeddings=None):
    """Gemma4's input embeddings and its per-layer inputs of all layers,
    `(batch, length, layers * per_layer)`, or `None` without them."""
    x = backbone.token_embedding(token_ids) if embeddings is None else embeddings
    per_layer = backbone.hidden_size_per_layer_input
    if per_layer > 0:
        per_layer_embedding = ops.cast(
            backbone.per_layer_token_embedding(token_ids), x.dtype
        )
        per_layer_embedding = per_layer_embedding * ops.cast(
            float(per_layer) ** 0.5, x.dtype
        )
    if embeddings is None:
        x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    if per_layer <= 0:
        return x, None
    per_layer_projection = backbone.per_layer_model_projection(x)
    per_layer_projection = per_layer_projection * ops.cast(
        float(backbone.hidden_dim) ** -0.5, per_layer_projection.dtype
    )
    inputs = []
    for index in range(len(backbone.transformer_layers)):
        block = slice(index * per_layer, (index + 1) * per_layer)
        projection = per_layer_projection[:, :, block]
        inputs.append(
            (
                backbone.per_layer_projection_norm(projection)
                + per_layer_embedding[:, :, block]
            )
            * ops.cast(2.0**-0.5, projection.dtype)
        )
    return x, ops.concatenate(inputs, -1)


FAMILY = Family(
    "gemma4",
    "Gemma4",
    "Gemma4Backbone",
    OURS,
    ("<turn|>",),
    tensor_parallel=True,
    attention={
        "Gemma4TextAttention": Route(
            attention, returns=OUTPUT_AND_CACHE, kv_sharing_targets=kv_sharing_targets
        )
    },
    moe={
        "Gemma4MoEBlock": MoERoute(
            moe_call, moe_spec, moe_weights, moe_variables, expert_scale, record_top_k
        )
    },
    text_forward=text_forward,
    text_loop=lambda backbone: True,
    image_architecture=architectures.GEMMA4_VISION,
    # Its decoder block multiplies by its MLP's kernels (`ops.matmul(x,
    # self.gating_ffw.kernel)`), a KerasHub workaround for a tracer bug.
    kernel_readers={"Gemma4TextDecoderBlock": (("gating_ffw", "gating_ffw_2"), "ffw_linear")},
    # `Gemma4AssistantCausalLM` (the `gemma4_*_assistant` presets): vLLM
    # knows it by this model type, rewritten to `gemma4_mtp` by
    # `SpeculativeConfig.hf_config_override`.
    drafters={
        "Gemma4AssistantCausalLM": Drafter(
            "gemma4_assistant", "vllm_keras_hub.families.gemma4.mtp:KerasHubGemma4MTP"
        )
    },
)
