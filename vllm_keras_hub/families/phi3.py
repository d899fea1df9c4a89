"""Phi-3: plain or "su" (LongRoPE) scaled RoPE; stops on `<|end|>`."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import attend
from vllm_keras_hub.layers.attention.attention_routes import Route


def phi3_su_rotary(rotary, inputs, positions):
    """`Phi3SuScaledRotaryEmbedding` at per-token positions.

    Its own `_compute_cos_sin_embedding` takes only 1-D positions and picks
    the short or long factors from `start_index + seq_len`. This is the same
    computation per token, with the rule `generate()` applies while decoding
    (long factors from position `pretraining_sequence_length` on). Up to that
    length it equals `generate()` exactly; past it, keras-hub's own prefill
    picks one factor set for the whole padded batch.
    """
    long = ops.cast(positions >= rotary.pretraining_sequence_length, "float32")
    # The factors are Keras-tracked lists, which torch.compile cannot turn
    # into tensors; plain tuples of floats it can.
    long_factor = tuple(float(f) for f in rotary.inverese_freq_long_factor)
    short_factor = tuple(float(f) for f in rotary.inverese_freq_short_factor)
    factor = long * ops.convert_to_tensor(long_factor, "float32") + (
        1.0 - long
    ) * ops.convert_to_tensor(short_factor, "float32")
    inverse_freq = rotary._get_inverse_freq(ops.shape(inputs)[-1]) / factor
    freq = ops.cast(positions, "float32") * inverse_freq
    # `(num_tokens, head_dim)` -> `(num_tokens, 1, 1, head_dim)`, like `inputs`.
    embedding = ops.concatenate((freq, freq), axis=-1)[:, None, None, :]
    cos = ops.cast(
        ops.cos(embedding) * rotary.embedding_scaling_factor, rotary.compute_dtype
    )
    sin = ops.cast(
        ops.sin(embedding) * rotary.embedding_scaling_factor, rotary.compute_dtype
    )
    return rotary._apply_rotary_pos_emb(inputs, cos, sin)


def attention(layer, hidden_states, positions):
    # `Phi3Attention`: plain RoPE, or "su" (LongRoPE) scaled RoPE.
    query = layer.query_dense(hidden_states)
    key = layer.key_dense(hidden_states)
    value = layer.value_dense(hidden_states)
    if layer.rope_scaling_type == "su":
        query = phi3_su_rotary(layer.rotary_embedding_layer, query, positions)
        key = phi3_su_rotary(layer.rotary_embedding_layer, key, positions)
    else:
        query = layer.rotary_embedding_layer(query, positions=positions)
        key = layer.rotary_embedding_layer(key, positions=positions)
    return layer.output_dense(attend(layer, query, key, value))


FAMILY = Family(
    "phi3",
    "Phi-3",
    "Phi3Backbone",
    OURS,
    ("<|end|>",),
    tensor_parallel=True,
    attention={"Phi3Attention": Route(attention)},
)
