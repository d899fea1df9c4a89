"""GPT-2: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("gpt2", "GPT-2", "GPT2Backbone", tensor_parallel=True)
