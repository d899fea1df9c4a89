"""Llama: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("llama", "Llama", "LlamaBackbone", tensor_parallel=True)
