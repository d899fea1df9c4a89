"""BERT: its text embedders and classifiers, attention bidirectional."""

from keras import ops

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers import step
from vllm_keras_hub.layers.attention.attention_routes import ENCODER_ROUTES


def segment_ids(token_ids):
    """The step's segment ids, shaped as `token_ids`.

    A single text is all in segment 0, as BERT's preprocessors pack it; a
    cross-encoder's pair has its second text in segment 1, given by the step.
    """
    segments = step.current().segment_ids
    if segments is None:
        return ops.zeros_like(token_ids)
    return ops.reshape(ops.cast(segments, token_ids.dtype), ops.shape(token_ids))


def text_forward(backbone, token_ids, padding_mask, positions, layers=None, hidden=None):
    # Its own `pooled_output` is unused: a classifier's head pools.
    inputs = {
        "token_ids": token_ids,
        "segment_ids": segment_ids(token_ids),
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
