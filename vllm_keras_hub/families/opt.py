"""OPT: served on the attention route keras-hub ships."""

from vllm_keras_hub.families.family import Family


FAMILY = Family("opt", "OPT", "OPTBackbone", tensor_parallel=True)
