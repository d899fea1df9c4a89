"""Attention routes to vLLM for the families keras-hub 0.32 has none for.

Each route mirrors its layer's own `call`: the layer's own projections, its
own rotary layer at vLLM's per-token positions, unexpanded K/V with the
layer's own scale, sliding window, soft cap, ALiBi slopes or sinks into
keras-hub's `vllm_paged_attention`, then the layer's own output projection.
Each takes `(layer, hidden_states, positions)`, positions shaped
`(num_tokens, 1)`. Gemma3n's and Gemma4's are in `attention_routes_gemma.py`.
"""

import functools

from keras import ops
from keras_hub.src.models.qwen3_5.qwen3_5_attention import _apply_mrope
from keras_hub.src.models.smollm3.smollm3_utils import apply_rotary_pos_emb
from keras_hub.src.utils.keras_utils import fused_attention_op_available
from keras_hub.src.vllm.attention import vllm_paged_attention
from keras_hub.src.vllm.context import get_vllm_context

from vllm_keras_hub.layers import step


def paged_attention(
    query,
    key,
    value,
    scale,
    num_kv_heads=None,
    sliding_window=None,
    soft_cap=None,
    **options,
):
    """keras-hub's `vllm_paged_attention`, with options it does not forward.

    The bridge hands `paged_attention_func` only `sliding_window` and
    `soft_cap` (always, so those two must go through the bridge: bound here
    they would be overridden). For this one call, `options` (e.g.
    `alibi_slopes`, `sinks`, `kv_sharing_target`) are bound onto the
    context's function, so the bridge's own cache bookkeeping and reshapes
    stay the only ones.
    """
    context = get_vllm_context()
    paged_attention_func = context.paged_attention_func
    context.paged_attention_func = functools.partial(paged_attention_func, **options)
    try:
        return vllm_paged_attention(
            query,
            key,
            value,
            scale,
            num_kv_heads=num_kv_heads,
            sliding_window=sliding_window,
            soft_cap=soft_cap,
        )
    finally:
        context.paged_attention_func = paged_attention_func


def partial_rotary(rotary, x, rotary_dim, positions):
    """`rotary` at per-token `positions` on the first `rotary_dim` features."""
    if rotary_dim >= x.shape[-1]:
        return rotary(x, positions=positions)
    rotated = rotary(x[..., :rotary_dim], positions=positions)
    return ops.concatenate((rotated, x[..., rotary_dim:]), axis=-1)


# The q/k/v projections' names: public (Mixtral, Qwen-MoE) or private.
PUBLIC_QKV = ("query_dense", "key_dense", "value_dense")
PRIVATE_QKV = ("_query_dense", "_key_dense", "_value_dense")


def rotary_qkv(layer, hidden_states, positions, names):
    """The layer's q/k/v projections, q and k through its own rotary layer."""
    query_dense, key_dense, value_dense = (getattr(layer, name) for name in names)
    rotary = layer.rotary_embedding_layer
    return (
        rotary(query_dense(hidden_states), positions=positions),
        rotary(key_dense(hidden_states), positions=positions),
        value_dense(hidden_states),
    )


def attend(layer, query, key, value, sliding_window=None, **options):
    """The layer's heads through vLLM, with its own scale and KV heads.

    Args:
        layer: The attention layer (`_inv_norm_factor`, `num_key_value_heads`).
        query, key, value: Its projected (and rotated) heads.
        sliding_window: The window as vLLM counts it, query included.
        **options: What `paged_attention` binds (e.g. `sinks`).
    """
    attention = functools.partial(paged_attention, **options) if options else (
        vllm_paged_attention
    )
    return attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
    )


def unfused_window(sliding_window):
    """The window `generate()` applies: none where it runs the fused op.

    KerasHub bug: Qwen's, Qwen3's and Qwen3.5's `_compute_attention` apply
    `sliding_window_size` only on their non-fused path, and the fused one
    runs wherever `fused_attention_op_available()` (torch 2.x and JAX), so
    `generate()` attends to the whole context. Served as the layer computes.
    """
    if fused_attention_op_available():
        return None
    return sliding_window or None


def multi_head(layer, hidden_states, positions):
    # Keras's `MultiHeadAttention`, as KerasHub's `TransformerEncoder` (BERT,
    # XLM-RoBERTa) calls it on self-attention: no position encoding inside.
    query = layer._query_dense(hidden_states)
    key = layer._key_dense(hidden_states)
    value = layer._value_dense(hidden_states)
    output = vllm_paged_attention(
        query, key, value, layer._inverse_sqrt_key_dim, num_kv_heads=layer._num_heads
    )
    return layer._output_dense(output)


def mixtral(layer, hidden_states, positions):
    # `CachedMixtralAttention`: a copy of Mistral's with public sublayers.
    query, key, value = rotary_qkv(layer, hidden_states, positions, PUBLIC_QKV)
    return layer.output_dense(attend(layer, query, key, value, layer.sliding_window))


def qwen(layer, hidden_states, positions):
    # `QwenAttention` (Qwen 2/2.5). Replaces keras-hub's own route, which
    # passes the window `generate()` never applies (`unfused_window`).
    query, key, value = rotary_qkv(layer, hidden_states, positions, PRIVATE_QKV)
    window = layer.sliding_window_size if layer.use_sliding_window_attention else None
    return layer._output_dense(attend(layer, query, key, value, unfused_window(window)))


def qwen_moe_sliding_window(transformer_layer, layer):
    # `QwenMoeAttention._compute_attention` applies its window only on its
    # non-fused path, and `_use_fused_attention_op()` takes the fused one
    # on GPUs (but T4s) and TPUs only: on the CPU it windows, on most GPUs
    # it does not. Decided once, at install, as the layer decides it.
    if layer.use_sliding_window_attention and not layer._use_fused_attention_op():
        return layer.sliding_window_size
    return None


def qwen_moe(layer, hidden_states, positions):
    # `QwenMoeAttention`: Qwen's attention (q/k/v biases) with public q/k/v.
    query, key, value = rotary_qkv(layer, hidden_states, positions, PUBLIC_QKV)
    window = layer._vllm_sliding_window
    return layer._output_dense(attend(layer, query, key, value, window))


def qwen3(layer, hidden_states, positions):
    # `Qwen3Attention` and its copy `Qwen3MoeAttention`: per-head q/k RMSNorm
    # before RoPE. Replaces keras-hub's own Qwen3 route, which passes the
    # window that `generate()` never applies (`unfused_window`; its HF
    # converter also sets the window even when HF's `use_sliding_window` is
    # off).
    query = layer._query_dense_layer_norm(layer._query_dense(hidden_states))
    query = layer.rotary_embedding_layer(query, positions=positions)
    key = layer._key_dense_layer_norm(layer._key_dense(hidden_states))
    key = layer.rotary_embedding_layer(key, positions=positions)
    value = layer._value_dense(hidden_states)
    window = unfused_window(layer.sliding_window_size)
    return layer._output_dense(attend(layer, query, key, value, window))


def qwen3_5(layer, hidden_states, positions):
    # `Qwen3_5Attention` (Qwen3.5's full-attention layers): the query
    # projection carries a per-head output gate beside each head's query;
    # q/k RMSNorm, then RoPE on the first `rotary_dim` features only. The
    # window as for Qwen3 (`unfused_window`). Where the step has M-RoPE
    # positions (images: `models/mrope.py`), the layer's own `_apply_mrope`
    # at them, as `_apply_partial_rope` with `position_ids`.
    mrope = step.current().mrope_positions
    if mrope is not None and layer.mrope_section is not None:
        cos, sin = mrope_cos_sin(layer, mrope)

        def rotate(x):
            return mrope_rotate(x, cos, sin, layer.rotary_dim)
    else:

        def rotate(x):
            return partial_rotary(
                layer.rotary_embedding_layer, x, layer.rotary_dim, positions
            )

    query_and_gate = layer._query_dense(hidden_states)
    query = rotate(layer._query_norm(query_and_gate[..., : layer.head_dim]))
    gate = query_and_gate[..., layer.head_dim :]
    key = rotate(layer._key_norm(layer._key_dense(hidden_states)))
    value = layer._value_dense(hidden_states)
    output = attend(
        layer, query, key, value, unfused_window(layer.sliding_window_size)
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, -1)) * ops.sigmoid(
        ops.reshape(gate, (num_tokens, 1, -1))
    )
    # The rank's heads under tensor parallelism, not `num_query_heads`.
    output = ops.reshape(output, (num_tokens, 1, -1, layer.head_dim))
    return layer._output_dense(output)


def mrope_cos_sin(layer, mrope):
    """The cos and sin of the step's M-RoPE positions, as the layer's own
    `_apply_mrope` computes them, once a step for all layers alike.

    `_apply_mrope` computes them anew for each query and key of each layer.
    Its rotation is linear in its input: on `[1, ..., 1, 0, ..., 0]` it
    gives each feature pair's cos in the first half and sin in the second.

    Args:
        layer: A `Qwen3_5Attention` with `mrope_section`.
        mrope: The step's `(3, num_tokens)` positions.

    Returns:
        float32 `(cos, sin)`, `(num_tokens, 1, 1, rotary_dim)` each.
    """
    rotary_dim, half = layer.rotary_dim, layer.rotary_dim // 2
    rotary = layer.rotary_embedding_layer
    key = ("mrope", rotary_dim, tuple(layer.mrope_section), rotary.max_wavelength)
    rows = step.current().rotary_rows
    if rows is not None and key in rows:
        return rows[key]
    # KerasHub's channels: (text, temporal, height, width), the first
    # unused; each token a batch row of one.
    position_ids = ops.stack([mrope[0], mrope[0], mrope[1], mrope[2]], axis=1)[..., None]
    basis = ops.concatenate([ops.ones((half,)), ops.zeros((half,))])
    basis = ops.broadcast_to(ops.cast(basis, "float32"), (ops.shape(mrope)[1], 1, 1, rotary_dim))
    both = _apply_mrope(basis, rotary, position_ids, layer.mrope_section, rotary_dim)
    cos = ops.concatenate([both[..., :half], both[..., :half]], axis=-1)
    sin = ops.concatenate([both[..., half:], both[..., half:]], axis=-1)
    if rows is not None:
        rows[key] = (cos, sin)
    return cos, sin


def mrope_rotate(x, cos, sin, rotary_dim):
    """`x`'s first `rotary_dim` features rotated by `mrope_cos_sin`'s cos
    and sin, in float32 as `_apply_mrope` rotates them; the rest as they are.

    Args:
        x: `(num_tokens, 1, heads, head_dim)` queries or keys.
        cos: `mrope_cos_sin`'s cos.
        sin: `mrope_cos_sin`'s sin.
        rotary_dim: The layer's `rotary_dim`.
    """
    x_rope = ops.cast(x[..., :rotary_dim], "float32")
    x1, x2 = x_rope[..., : rotary_dim // 2], x_rope[..., rotary_dim // 2 :]
    rotated = x_rope * cos + ops.concatenate([-x2, x1], axis=-1) * sin
    return ops.concatenate([ops.cast(rotated, x.dtype), x[..., rotary_dim:]], axis=-1)


def smollm3(layer, hidden_states, positions):
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


def phi3(layer, hidden_states, positions):
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


def alibi_attention(layer, hidden_states, dense_layers):
    # Multi-head attention with biases whose ALiBi slopes go to vLLM.
    query_dense, key_dense, value_dense, output_dense = dense_layers
    output = paged_attention(
        query_dense(hidden_states),
        key_dense(hidden_states),
        value_dense(hidden_states),
        layer.inv_norm_factor,
        alibi_slopes=layer._vllm_alibi_slopes,
    )
    num_tokens = ops.shape(hidden_states)[0]
    # The rank's heads under tensor parallelism, all heads otherwise.
    output = ops.reshape(output, (num_tokens, 1, -1))
    return output_dense(output)


def bloom(layer, hidden_states, positions):
    # `BloomAttention`: its `AlibiBias` adds `slope * (key_position -
    # last_key_position)` to the scaled scores, which softmax sees exactly as
    # vLLM's `slope * (key_position - query_position)` (a constant per query
    # row); slopes are in head order.
    return alibi_attention(
        layer,
        hidden_states,
        (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense),
    )


def bloom_alibi_slopes(transformer_layer, layer):
    return layer._alibi_layer._get_slopes(layer.num_heads)


def falcon(layer, hidden_states, positions):
    # `FalconAttention` (RW-1B): the ALiBi bias comes from its decoder
    # (`slope * key_position`), added before the softmax scale.
    return alibi_attention(
        layer,
        hidden_states,
        (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense),
    )


def falcon_alibi_slopes(transformer_layer, layer):
    # `FalconTransformerDecoder._build_alibi_tensor`'s slopes; the bias is
    # added before the scale, so vLLM (which adds it after) gets them scaled.
    slopes = transformer_layer._get_slopes(layer.num_heads)
    return [slope * layer.inv_norm_factor for slope in slopes]


def gpt_neox(layer, hidden_states, positions):
    # `GPTNeoXAttention`: fused per-head q/k/v projection, RoPE on the first
    # `rotary_dim` features of each head only. Here the query is rotated at
    # its own position; KerasHub's cached decode (what `generate()` runs)
    # rotates it at position 0, a KerasHub bug, so serving matches the
    # layer's full-sequence forward instead (see `model_test.py`).
    query_key_value = layer._qkv_dense(hidden_states)
    size = layer.attn_head_size
    query = query_key_value[..., :size]
    key = query_key_value[..., size : 2 * size]
    value = query_key_value[..., 2 * size :]

    def rotate(x):
        return partial_rotary(layer.rotary_embedding_layer, x, layer.rotary_dim, positions)

    output = vllm_paged_attention(
        rotate(query), rotate(key), value, layer._inv_norm_factor
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, -1))
    return layer._output_dense(output)


def gpt_oss(layer, hidden_states, positions):
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
