"""A backbone's forward pass on text tokens alone.

Most backbones take `token_ids` and `padding_mask` and nothing else. The
functional graphs of multimodal Gemma3n and Gemma4 presets (all their
published ones), of Gemma3's vision presets (`gemma3_4b` and up) and of
PaliGemma also demand image and audio inputs, so for those the path their
own `CausalLM.call_with_cache` runs is used instead, with no cache: the
same layers in the same order as the full graph.
"""

from keras import ops


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    """Final hidden states of `backbone` for `token_ids`.

    Args:
        backbone: A loaded KerasHub backbone.
        token_ids: `(batch, length)` token ids.
        padding_mask: `(batch, length)` ones where a token is real.
        positions: `(batch, length)` position of each token.
        layers: `(start, end)`: run only these transformer layers, a
            pipeline stage of a backbone whose text path is a loop over its
            layers (Gemma3 and Qwen3.5 vision presets, Gemma4); `pipeline.py`
            cuts the others.
        hidden: The hidden states entering layer `start`; at layer 0, the
            input embeddings of a preset served with images, images merged
            in (`vision.py`). Gemma4 then needs `token_ids` zero at its
            image tokens, as its graph makes them for its per-layer inputs.
            A Gemma4 stage after the first takes its per-layer inputs
            beside the hidden states.

    Returns:
        `(batch, length, hidden_size)` hidden states; from a Gemma4 stage
        before the last, with its per-layer inputs beside them.
    """
    name = type(backbone).__name__
    if name == "Gemma3nBackbone":
        return _gemma3n(backbone, token_ids, padding_mask, hidden)
    if name == "Gemma4Backbone":
        return _gemma4(backbone, token_ids, padding_mask, positions, hidden, layers)
    if name == "Gemma3Backbone" and (
        not backbone.text_only_model or backbone.is_embedding_model
    ):
        return _gemma3_loop(backbone, token_ids, padding_mask, layers, hidden)
    if name == "PaliGemmaBackbone":
        return _pali_gemma(backbone, token_ids, hidden)
    if name == "BertBackbone":
        # One text per sequence: every token in segment 0, as BERT's text
        # embedder preprocessor packs it; its own `pooled_output` is unused.
        inputs = {
            "token_ids": token_ids,
            "segment_ids": ops.zeros_like(token_ids),
            "padding_mask": padding_mask,
        }
        return backbone(inputs, training=False)["sequence_output"]
    if name in ("Qwen3_5Backbone", "Qwen3_5MoeBackbone") and not backbone.text_only_model:
        return _qwen3_5_vision(backbone, token_ids, padding_mask, layers, hidden)
    return backbone(
        {"token_ids": token_ids, "padding_mask": padding_mask}, training=False
    )


def _gemma3_loop(backbone, token_ids, padding_mask, layers=None, hidden=None):
    # `Gemma3CausalLM.call_with_cache` without images: scaled token
    # embeddings, the layers with no vision mask, the final norm. Also an
    # embedding backbone's graph up to its `sequence_output`: its pooling
    # over the whole packed step would mix requests (vLLM's pooler pools).
    start, end = layers or (0, len(backbone.transformer_layers))
    x = hidden
    if x is None:
        x = backbone.token_embedding(token_ids)
        x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    for layer in backbone.transformer_layers[start:end]:
        x = layer(x, padding_mask=padding_mask, vision_mask=None)
    if end < len(backbone.transformer_layers):
        return x
    return backbone.layer_norm(x)


def _pali_gemma(backbone, token_ids, hidden=None):
    # `PaliGemmaCausalLM.call_with_cache`: the given embeddings (prefixes,
    # images first, from `prefix_lm.py`) or the scaled token embeddings,
    # the layers, the final norm. Their masks are vLLM's attention's.
    x = hidden
    if x is None:
        x = backbone.token_embedding(token_ids)
        x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    for layer in backbone.transformer_layers:
        x = layer(x)
    return backbone.layer_norm(x)


def _qwen3_5_vision(backbone, token_ids, padding_mask, layers=None, hidden=None):
    # `Qwen3_5Backbone`'s graph without images (its `__call__` would run the
    # vision encoder on none): token embeddings, the layers, the final norm;
    # at a pipeline stage, its own layers (the norm on the last).
    start, end = layers or (0, len(backbone.transformer_layers))
    x = backbone.token_embedding(token_ids) if hidden is None else hidden
    for layer in backbone.transformer_layers[start:end]:
        x = layer(x, decoder_padding_mask=padding_mask)
    if end < len(backbone.transformer_layers):
        return x
    return backbone.layer_norm(x)


def _gemma3n(backbone, token_ids, padding_mask, embeddings=None):
    # `Gemma3nCausalLM.call_with_cache`: the embedding processor (token and
    # per-layer embeddings), then the text model (AltUp, Laurel, layers,
    # final norm). With images, the processor's per-layer inputs, projected
    # with the embeddings the images were merged into.
    processor = backbone.embedding_processor
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


def _gemma4(backbone, token_ids, padding_mask, positions, hidden=None, layers=None):
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
        x, per_layer_inputs = _gemma4_inputs(backbone, token_ids, hidden)
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


def _gemma4_inputs(backbone, token_ids, embeddings=None):
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
