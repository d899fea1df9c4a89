"""Mistral: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("mistral", "Mistral", "MistralBackbone", tensor_parallel=True)
