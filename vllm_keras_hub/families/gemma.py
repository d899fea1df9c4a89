"""Gemma and Gemma2: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("gemma", "Gemma / Gemma2", "GemmaBackbone", tensor_parallel=True)
