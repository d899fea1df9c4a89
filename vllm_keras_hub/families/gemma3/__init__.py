"""Gemma3 (text): served on the attention route keras-hub ships."""

from keras import ops

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families.family import Family


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # Text-only presets (not embedders) run their own graph.
    if backbone.text_only_model and not backbone.is_embedding_model:
        return None
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


FAMILY = Family(
    "gemma3",
    "Gemma3 (text)",
    "Gemma3Backbone",
    stop_tokens=("<end_of_turn>",),
    tensor_parallel=True,
    text_forward=text_forward,
    text_loop=lambda backbone: not backbone.text_only_model,
    image_architecture=architectures.GEMMA3_VISION,
    embedder="Gemma3TextEmbedder",
)
