"""DistilBERT: its text classifiers only, attention bidirectional."""

from vllm_keras_hub.families.family import Family
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.layers.attention.attention_routes import ENCODER_ROUTES


FAMILY = Family(
    "distil_bert",
    "DistilBERT",
    "DistilBertBackbone",
    OURS,
    embedder_only=True,
    attention=ENCODER_ROUTES,
)
