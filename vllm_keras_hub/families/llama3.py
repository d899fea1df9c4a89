"""Llama3: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("llama3", "Llama3", "Llama3Backbone", tensor_parallel=True)
