"""PaliGemma: vision-language, prefix-LM, on keras-hub's Gemma route.

Every prompt is an image and its text, attended bidirectionally; the output
causally (`media.py`).
"""

from keras import ops

from vllm_keras_hub.export import architectures
from vllm_keras_hub.families.family import Family


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # `PaliGemmaCausalLM.call_with_cache`: the given embeddings (prefixes,
    # images first, from `media.py`) or the scaled token embeddings,
    # the layers, the final norm. Their masks are vLLM's attention's.
    x = hidden
    if x is None:
        x = backbone.token_embedding(token_ids)
        x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    for layer in backbone.transformer_layers:
        x = layer(x)
    return backbone.layer_norm(x)


FAMILY = Family(
    "pali_gemma",
    "PaliGemma",
    "PaliGemmaBackbone",
    tensor_parallel=True,
    pipeline_refusal=(
        "its prefix (the image and the prompt, attended both ways) is not "
        "placed in pipeline stages yet"
    ),
    text_forward=text_forward,
    image_architecture=architectures.PREFIX_LM,
)
