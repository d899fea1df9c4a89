"""Routes to vLLM for families whose KerasHub attention has none.

keras-hub 0.32 ships a serving route (`_compute_vllm_attention`, reached from
a context check at the top of `call`) in 8 families' attention layers. For
the others, `install` gives the loaded backbone's attention layers the same
kind of route, written here, so the rest of the serving path is shared.

Each route mirrors keras-hub's own: the layer's own projections, its own
rotary layer at vLLM's per-token positions, unexpanded K/V with the layer's
own scale, sliding window and soft cap into `vllm_paged_attention`, then the
layer's own output projection. Only the instances of one loaded backbone get
a route; keras-hub's classes are never modified.
"""

import functools
import types

from keras import ops
from keras_hub.src.models.smollm3.smollm3_utils import apply_rotary_pos_emb
from keras_hub.src.utils.keras_utils import fused_attention_op_available
from keras_hub.src.vllm.attention import vllm_paged_attention
from keras_hub.src.vllm.context import get_vllm_context


def transformer_layers(backbone):
    """The backbone's transformer layers, one attention layer each.

    Gemma3n keeps them in its text model (`language_model`), not on the
    backbone.

    Raises:
        ValueError: the backbone has none.
    """
    for owner in (backbone, getattr(backbone, "language_model", None)):
        layers = getattr(owner, "transformer_layers", None)
        if layers is not None:
            return list(layers)
    raise ValueError(
        f"{type(backbone).__name__} has no `transformer_layers`; "
        "vllm-keras-hub cannot map its attention to vLLM."
    )


def token_embedding(backbone):
    """The backbone's token embedding, also its (tied) output projection.

    Gemma3n's is its text model's `token_embedding` (embedding scale and
    final logit soft cap included); `backbone.token_embedding` is `None`.
    """
    if backbone.token_embedding is not None:
        return backbone.token_embedding
    return backbone.language_model.token_embedding


def _paged_attention(
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


def _mixtral(layer, hidden_states, positions):
    # `CachedMixtralAttention`: a copy of Mistral's with public sublayers.
    query = layer.rotary_embedding_layer(
        layer.query_dense(hidden_states), positions=positions
    )
    key = layer.rotary_embedding_layer(
        layer.key_dense(hidden_states), positions=positions
    )
    value = layer.value_dense(hidden_states)
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=layer.sliding_window,
    )
    return layer.output_dense(output)


def _qwen(layer, hidden_states, positions):
    # `QwenAttention` (Qwen 2/2.5). Replaces keras-hub's own route, which
    # passes the window. KerasHub bug: `QwenAttention._compute_attention`
    # applies `sliding_window_size` only on its non-fused path, and the fused
    # one runs wherever `fused_attention_op_available()` (torch 2.x), so
    # `generate()` attends to the whole context. Serve what the layer computes.
    query = layer.rotary_embedding_layer(
        layer._query_dense(hidden_states), positions=positions
    )
    key = layer.rotary_embedding_layer(
        layer._key_dense(hidden_states), positions=positions
    )
    value = layer._value_dense(hidden_states)
    sliding_window = None
    if layer.use_sliding_window_attention and not fused_attention_op_available():
        sliding_window = layer.sliding_window_size
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
    )
    return layer._output_dense(output)


def _qwen_moe(layer, hidden_states, positions):
    # `QwenMoeAttention`: Qwen's attention (q/k/v biases) with public q/k/v.
    query = layer.rotary_embedding_layer(
        layer.query_dense(hidden_states), positions=positions
    )
    key = layer.rotary_embedding_layer(
        layer.key_dense(hidden_states), positions=positions
    )
    value = layer.value_dense(hidden_states)
    sliding_window = (
        layer.sliding_window_size if layer.use_sliding_window_attention else None
    )
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
    )
    return layer._output_dense(output)


def _qwen3(layer, hidden_states, positions):
    # `Qwen3Attention` and its copy `Qwen3MoeAttention`: per-head q/k RMSNorm
    # before RoPE. Replaces keras-hub's own Qwen3 route, which passes the
    # window that `generate()` never applies (below).
    query = layer._query_dense_layer_norm(layer._query_dense(hidden_states))
    query = layer.rotary_embedding_layer(query, positions=positions)
    key = layer._key_dense_layer_norm(layer._key_dense(hidden_states))
    key = layer.rotary_embedding_layer(key, positions=positions)
    value = layer._value_dense(hidden_states)
    # KerasHub bug: `Qwen3(Moe)Attention._compute_attention` applies
    # `sliding_window_size` only on its non-fused path, and the fused one runs
    # wherever `fused_attention_op_available()` (torch 2.x and JAX), so
    # `generate()` attends to the whole context. Serve what the layer computes
    # (its HF converter also sets the window even when HF's
    # `use_sliding_window` is off).
    sliding_window = layer.sliding_window_size or None
    if fused_attention_op_available():
        sliding_window = None
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
    )
    return layer._output_dense(output)


def _smollm3(layer, hidden_states, positions):
    # `SmolLM3Attention`: Dense q/k/v reshaped to heads; no RoPE on NoPE
    # layers (`use_rope` False, every 4th layer in SmolLM3-3B).
    num_tokens = ops.shape(hidden_states)[0]
    query = ops.reshape(
        layer.q_proj(hidden_states),
        (num_tokens, 1, layer.num_attention_heads, layer.head_dim),
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
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
    )
    return layer.o_proj(output)


def _phi3_su_rotary(rotary, inputs, positions):
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


def _phi3(layer, hidden_states, positions):
    # `Phi3Attention`: plain RoPE, or "su" (LongRoPE) scaled RoPE.
    query = layer.query_dense(hidden_states)
    key = layer.key_dense(hidden_states)
    value = layer.value_dense(hidden_states)
    if layer.rope_scaling_type == "su":
        query = _phi3_su_rotary(layer.rotary_embedding_layer, query, positions)
        key = _phi3_su_rotary(layer.rotary_embedding_layer, key, positions)
    else:
        query = layer.rotary_embedding_layer(query, positions=positions)
        key = layer.rotary_embedding_layer(key, positions=positions)
    output = vllm_paged_attention(
        query,
        key,
        value,
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
    )
    return layer.output_dense(output)


def _alibi_attention(layer, hidden_states, dense_layers):
    # Multi-head attention with biases whose ALiBi slopes go to vLLM.
    query_dense, key_dense, value_dense, output_dense = dense_layers
    output = _paged_attention(
        query_dense(hidden_states),
        key_dense(hidden_states),
        value_dense(hidden_states),
        layer.inv_norm_factor,
        alibi_slopes=layer._vllm_alibi_slopes,
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, layer.num_heads * layer.head_dim))
    return output_dense(output)


def _bloom(layer, hidden_states, positions):
    # `BloomAttention`: its `AlibiBias` adds `slope * (key_position -
    # last_key_position)` to the scaled scores, which softmax sees exactly as
    # vLLM's `slope * (key_position - query_position)` (a constant per query
    # row); slopes are in head order.
    return _alibi_attention(
        layer,
        hidden_states,
        (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense),
    )


def _bloom_alibi_slopes(transformer_layer, layer):
    return layer._alibi_layer._get_slopes(layer.num_heads)


def _falcon(layer, hidden_states, positions):
    # `FalconAttention` (RW-1B): the ALiBi bias comes from its decoder
    # (`slope * key_position`), added before the softmax scale.
    return _alibi_attention(
        layer,
        hidden_states,
        (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense),
    )


def _falcon_alibi_slopes(transformer_layer, layer):
    # `FalconTransformerDecoder._build_alibi_tensor`'s slopes; the bias is
    # added before the scale, so vLLM (which adds it after) gets them scaled.
    slopes = transformer_layer._get_slopes(layer.num_heads)
    return [slope * layer.inv_norm_factor for slope in slopes]


def _gpt_neox(layer, hidden_states, positions):
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
        rotated = layer.rotary_embedding_layer(
            x[..., : layer.rotary_dim], positions=positions
        )
        return ops.concatenate((rotated, x[..., layer.rotary_dim :]), axis=-1)

    output = vllm_paged_attention(
        rotate(query), rotate(key), value, layer._inv_norm_factor
    )
    num_tokens = ops.shape(hidden_states)[0]
    output = ops.reshape(output, (num_tokens, 1, layer.hidden_dim))
    return layer._output_dense(output)


def _gpt_oss(layer, hidden_states, positions):
    # `GptOssAttention`: GQA with biases, YaRN RoPE on the first `_rotary_dim`
    # features, learned sinks, a sliding window on odd layers.
    def rotate(x):
        if layer._rotary_dim < layer._head_dim:
            rotated = layer.rotary_embedding_layer(
                x[..., : layer._rotary_dim], positions=positions
            )
            return ops.concatenate((rotated, x[..., layer._rotary_dim :]), axis=-1)
        return layer.rotary_embedding_layer(x, positions=positions)

    # KerasHub's window keeps keys with `key_position >= query_position -
    # sliding_window`: `sliding_window + 1` tokens, query included (HF's GPT-OSS
    # keeps `sliding_window`, and windows the even layers where KerasHub
    # windows the odd ones). Served as KerasHub computes it.
    sliding_window = layer.sliding_window + 1 if layer.sliding_window else None
    output = _paged_attention(
        rotate(layer.query_dense(hidden_states)),
        rotate(layer.key_dense(hidden_states)),
        layer.value_dense(hidden_states),
        layer._inv_norm_factor,
        num_kv_heads=layer.num_key_value_heads,
        sliding_window=sliding_window,
        sinks=ops.convert_to_tensor(layer.sinks),
    )
    return layer.output_dense(output)


def _kv_placeholder(query, num_kv_heads):
    # keras-hub's bridge reads the KV head count from `key` and reshapes K/V;
    # a KV-sharing layer's vLLM `Attention` reads the target's cache instead,
    # and the serving model hands it no K/V at all.
    return ops.zeros_like(query[:, :, :num_kv_heads, :])


def _gemma3n(layer, hidden_states, positions):
    # `Gemma3nTextAttention`: q/k RMSNorm before RoPE, a scale-free RMSNorm on
    # V, softmax scale 1, local and global RoPE bases and the window set per
    # layer. A KV-sharing layer computes only its query and attends over its
    # target's cache (`kv_sharing_target`).
    num_tokens = ops.shape(hidden_states)[0]
    heads = (num_tokens, 1, layer.num_attention_heads, layer.head_dim)
    kv_heads = (num_tokens, 1, layer.num_key_value_heads, layer.head_dim)
    query = layer.q_norm(ops.reshape(layer.q_proj(hidden_states), heads))
    query = layer.rotary_embedding(query, positions=positions)
    if layer._vllm_kv_sharing_target is None:
        key = layer.k_norm(ops.reshape(layer.k_proj(hidden_states), kv_heads))
        key = layer.rotary_embedding(key, positions=positions)
        value = layer.v_norm(ops.reshape(layer.v_proj(hidden_states), kv_heads))
    else:
        key = value = _kv_placeholder(query, layer.num_key_value_heads)
    output = _paged_attention(
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


def _gemma4(layer, hidden_states, positions):
    # `Gemma4TextAttention`: as Gemma3n's, plus per-layer head size and KV
    # heads (global layers: `global_head_dim`, and K=V from one projection
    # with `num_global_key_value_heads`), partial RoPE on global layers and
    # an optional logit soft cap. KV-sharing layers as in `_gemma3n`.
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
        key = value = _kv_placeholder(query, num_kv_heads)
    # The decoder block windows local layers only (`_compute_attention_mask`),
    # keeping `sliding_window_size` tokens, query included.
    sliding_window = None
    if layer.use_sliding_window_attention and not layer.is_global_attention:
        sliding_window = layer.sliding_window_size
    output = _paged_attention(
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


def _gemma3n_kv_sharing_targets(backbone):
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


def _gemma4_kv_sharing_targets(backbone):
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


# Attention-layer class name -> the family route computing its output from
# `(layer, hidden_states, positions)`, positions shaped `(num_tokens, 1)`.
ROUTES = {
    "CachedMixtralAttention": _mixtral,
    "QwenAttention": _qwen,
    "QwenMoeAttention": _qwen_moe,
    "Qwen3Attention": _qwen3,
    "Qwen3MoeAttention": _qwen3,
    "SmolLM3Attention": _smollm3,
    "Phi3Attention": _phi3,
    "BloomAttention": _bloom,
    "FalconAttention": _falcon,
    "GPTNeoXAttention": _gpt_neox,
    "GptOssAttention": _gpt_oss,
    "Gemma3nTextAttention": _gemma3n,
    "Gemma4TextAttention": _gemma4,
}

# Attention-layer classes whose `call` returns `(output, cache)` even when the
# cache is `None`, as their decoders unpack it.
RETURNS_CACHE_ALWAYS = ("GPTNeoXAttention", "Gemma4TextAttention")

# Attention-layer classes whose `call` returns `(output, weights, cache)`.
RETURNS_WEIGHTS_AND_CACHE = ("Gemma3nTextAttention",)

# Attention-layer class name -> the index of the earlier layer whose K/V
# each layer reads (`None`: its own), from the backbone. Read once at
# install into each layer's `_vllm_kv_sharing_target`; the route passes it
# on, and the serving model gives that layer's vLLM `Attention` the target's
# cache (`kv_sharing_target_layer_name`).
KV_SHARING_TARGETS = {
    "Gemma3nTextAttention": _gemma3n_kv_sharing_targets,
    "Gemma4TextAttention": _gemma4_kv_sharing_targets,
}

# Attention-layer class name -> its ALiBi slopes, as vLLM adds them (after the
# softmax scale), from `(transformer_layer, attention_layer)`. Read once at
# install into the layer's `_vllm_alibi_slopes`.
ALIBI_SLOPES = {
    "BloomAttention": _bloom_alibi_slopes,
    "FalconAttention": _falcon_alibi_slopes,
}


def _compute_vllm_attention(self, hidden_states, cache, vllm_context):
    """The route every installed layer takes while vLLM serves.

    Named like keras-hub's own routes: the serving model finds the routing
    layer as `self` of the `_compute_vllm_attention` frame.
    """
    positions = ops.reshape(vllm_context.positions, (-1, 1))
    name = type(self).__name__
    output = ROUTES[name](self, hidden_states, positions)
    if name in RETURNS_WEIGHTS_AND_CACHE:
        return output, None, cache
    if cache is not None or name in RETURNS_CACHE_ALWAYS:
        return output, cache
    return output


def _routed_call(self, *args, **kwargs):
    """The layer's `call`, going to vLLM while a serving context is active.

    Keras binds `__call__`'s arguments against `_call_signature`, taken from
    the class's `call` when the layer was built, so the arguments arrive
    here exactly as the class's `call` would receive them.
    """
    context = get_vllm_context()
    if context is not None and context.paged_attention_func is not None:
        arguments = self._call_signature.bind(*args, **kwargs).arguments
        hidden_states = next(iter(arguments.values()))
        # SmolLM3 takes its cache as `self_attention_cache` in `**kwargs`.
        cache = arguments.get("cache")
        if cache is None:
            cache = arguments.get("kwargs", {}).get("self_attention_cache")
        return self._compute_vllm_attention(hidden_states, cache, context)
    return type(self).call(self, *args, **kwargs)


def _attention_layer(transformer_layer):
    """The one sublayer of `transformer_layer` that has a route in `ROUTES`."""
    found = [
        layer
        for layer in transformer_layer._flatten_layers(include_self=False)
        if type(layer).__name__ in ROUTES
    ]
    if len(found) != 1:
        raise ValueError(
            f"Expected one attention layer with a route in "
            f"{transformer_layer.name}, found "
            f"{[type(layer).__name__ for layer in found]}."
        )
    return found[0]


def install(backbone, family):
    """Gives `backbone`'s attention layers a vLLM route, where ours is needed.

    Args:
        backbone: The loaded KerasHub backbone.
        family: Its `families.Family`; `family.route` says whose route it
            uses: `"keras_hub"` (keras-hub's own, nothing to install) or
            `"vllm_keras_hub"` (ours).
    """
    if family.route == "keras_hub":
        return
    if family.route != "vllm_keras_hub":
        raise ValueError(f"{family.display_name} has no route to install.")
    layers = [_attention_layer(block) for block in transformer_layers(backbone)]
    targets = [None] * len(layers)
    kv_sharing_targets = KV_SHARING_TARGETS.get(type(layers[0]).__name__)
    if kv_sharing_targets is not None:
        targets = kv_sharing_targets(backbone)
    for transformer_layer, layer, target in zip(
        transformer_layers(backbone), layers, targets
    ):
        layer._vllm_kv_sharing_target = target
        alibi_slopes = ALIBI_SLOPES.get(type(layer).__name__)
        if alibi_slopes is not None:
            layer._vllm_alibi_slopes = tuple(
                float(slope) for slope in alibi_slopes(transformer_layer, layer)
            )
        layer._compute_vllm_attention = types.MethodType(
            _compute_vllm_attention, layer
        )
        layer.call = types.MethodType(_routed_call, layer)
