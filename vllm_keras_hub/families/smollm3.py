"""SmolLM3: Dense q/k/v, NoPE on every 4th layer."""

from keras import ops
from keras_hub.src.models.smollm3.smollm3_utils import apply_rotary_pos_emb

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import Route


def attention(layer, hidden_states, positions):
    # `SmolLM3Attention`: Dense q/k/v reshaped to heads; no RoPE on NoPE
    # layers (`use_rope` False, every 4th layer in SmolLM3-3B).
    # Heads are counted from the projection (a rank's share under tensor
    # parallelism), not from `num_attention_heads`.
    num_tokens = ops.shape(hidden_states)[0]
    query = ops.reshape(
        layer.q_proj(hidden_states), (num_tokens, 1, -1, layer.head_dim)
    )
    key = ops.reshape(
        layer.k_proj(hidden_states),
        (num_tokens, 1, layer.num_key_value_heads, layer.head_dim),
    )
    value = ops.reshape(
        layer.v_proj(hidden_states),
        (num_tokens, 1, layer.num_key_value_heads, layer.head_dim),
    )
    if layer.use_rope:
        # `SmolLM3RotaryEmbedding.call` takes only a start index; this is its
        # computation, with its own `inv_freq`, at per-token positions.
        rotary = layer.rotary_embedding
        freqs = ops.cast(positions, "float32")[..., None] * ops.cast(
            rotary.inv_freq, "float32"
        )
        embedding = ops.concatenate((freqs, freqs), axis=-1)
        cos = ops.cos(embedding) * rotary.attention_scaling
        sin = ops.sin(embedding) * rotary.attention_scaling
        query, key = apply_rotary_pos_emb(query, key, cos, sin, expansion_axis=2)
    return layer.o_proj(attend(layer, query, key, value))


FAMILY = Family(
    "smollm3",
    "SmolLM3",
    "SmolLM3Backbone",
    OURS,
    tensor_parallel=True,
    attention={"SmolLM3Attention": Route(attention)},
)
