"""GPT-OSS: sinks and a sliding window on odd layers; swigluoai MoE."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import partial_rotary
from vllm_keras_hub.layers.attention.attention_routes import Route
from vllm_keras_hub.layers.moe import moe
from vllm_keras_hub.layers.moe.moe_routing import MoERoute
from vllm_keras_hub.layers.moe.moe_routing import MoERouteError


# KerasHub's GPT-OSS experts: `(up + 1) * gate * sigmoid(alpha * gate)`, the
# gate clipped from above and the up projection both ways at `limit`. vLLM's
# `swigluoai` kernels have these constants built in.
_SWIGLUOAI = {"alpha": 1.702, "limit": 7.0}


def attention(layer, hidden_states, positions):
    # `GptOssAttention`: GQA with biases, YaRN RoPE on the first `_rotary_dim`
    # features, learned sinks, a sliding window on odd layers.
    def rotate(x):
        return partial_rotary(
            layer.rotary_embedding_layer, x, layer._rotary_dim, positions
        )

    # KerasHub's window keeps keys with `key_position >= query_position -
    # sliding_window`: `sliding_window + 1` tokens, query included (HF's GPT-OSS
    # keeps `sliding_window`, and windows the even layers where KerasHub
    # windows the odd ones). Served as KerasHub computes it.
    sliding_window = layer.sliding_window + 1 if layer.sliding_window else None
    output = attend(
        layer,
        rotate(layer.query_dense(hidden_states)),
        rotate(layer.key_dense(hidden_states)),
        layer.value_dense(hidden_states),
        sliding_window,
        sinks=ops.convert_to_tensor(layer.sinks),
    )
    return layer.output_dense(output)


def moe_call(self, hidden_states):
    # `GptOssTopKRouter` returns the dense matrix itself (a softmax over
    # each token's top-k logits).
    shape = ops.shape(hidden_states)
    x = ops.reshape(hidden_states, (-1, self.hidden_dim))
    router_scores = self.router(x)
    out = moe.fused_experts(self, x, router_scores)
    return ops.reshape(out, shape), router_scores


def moe_spec(block):
    from vllm.model_executor.models.gpt_oss import GptOssRoutedExperts

    experts = block.experts
    constants = {"alpha": experts.alpha, "limit": experts.limit}
    if constants != _SWIGLUOAI:
        raise MoERouteError(
            f"{block.name}: vLLM's swigluoai expert kernels compute with "
            f"{_SWIGLUOAI}, but this block's experts use {constants}."
        )
    return moe.MoESpec(
        block.num_experts,
        block.top_k,
        block.hidden_dim,
        block.intermediate_dim,
        "swigluoai",
        has_bias=True,
        expert_weights_class=GptOssRoutedExperts,
    )


def moe_variables(block):
    experts = block.experts
    return [
        experts.gate_up_proj,
        experts.gate_up_proj_bias,
        experts.down_proj,
        experts.down_proj_bias,
    ]


def moe_weights(block, read):
    # Gate and up interleaved along the last axis, as `swigluoai` reads
    # them; vLLM's GPT-OSS loader takes each expert in this `(in, out)` form.
    gate_up, gate_up_bias, down, down_bias = (
        read(v) for v in moe_variables(block)
    )
    for expert in range(gate_up.shape[0]):
        yield "w13_weight", "gpt_oss_w13", expert, gate_up[expert]
        yield "w13_bias", "gpt_oss_w13", expert, gate_up_bias[expert]
        yield "w2_weight", "gpt_oss_w2", expert, down[expert]
        yield "w2_bias", "gpt_oss_w2", expert, down_bias[expert]


FAMILY = Family(
    "gpt_oss",
    "GPT-OSS",
    "GptOssBackbone",
    OURS,
    tensor_parallel=True,
    attention={"GptOssAttention": Route(attention)},
    moe={"GptOssSparseMoeBlock": MoERoute(moe_call, moe_spec, moe_weights, moe_variables)},
)
