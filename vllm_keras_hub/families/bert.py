"""BERT: its text embedders only, attention bidirectional."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import ENCODER_ROUTES


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # One text per sequence: every token in segment 0, as BERT's text
    # embedder preprocessor packs it; its own `pooled_output` is unused.
    inputs = {
        "token_ids": token_ids,
        "segment_ids": ops.zeros_like(token_ids),
        "padding_mask": padding_mask,
    }
    return backbone(inputs, training=False)["sequence_output"]


FAMILY = Family(
    "bert",
    "BERT",
    "BertBackbone",
    OURS,
    embedder_only=True,
    attention=ENCODER_ROUTES,
    text_forward=text_forward,
    embedder="BertTextEmbedder",
)
