"""ALBERT: its text classifiers, attention bidirectional.

Its layers are groups of `TransformerEncoder`s, each group's called again
and again (shared weights): every call runs on the encoder-only kernel its
layer holds, which keeps no cache.
"""

from vllm_keras_hub.families.bert import text_forward
from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import ENCODER_ROUTES

def layer_calls(backbone):
    # As `AlbertBackbone` calls them: each group's layers, in order, again
    # `num_layers // num_groups` times, group after group.
    calls, start = [], 0
    for group in backbone.transformer_layers:
        indices = list(range(start, start + len(group)))
        calls += indices * (backbone.num_layers // backbone.num_groups)
        start += len(group)
    return calls


FAMILY = Family(
    "albert",
    "ALBERT",
    "AlbertBackbone",
    OURS,
    embedder_only=True,
    attention=ENCODER_ROUTES,
    text_forward=text_forward,
    layer_calls=layer_calls,
)
