"""The vLLM model class of hybrid presets: attention and recurrent-state layers.

Qwen3.5's backbones mix full-attention layers with Gated DeltaNet layers,
whose per-request state vLLM keeps in its state cache beside the KV cache,
as for its own hybrid models. vLLM asks the model class (not an instance)
for the state's shapes, dtypes and copy functions before it builds the
model, to size cache pages; and it treats `IsHybrid` models differently
throughout (page sizes, block sizes, prefix caching in "align" mode). So
hybrid presets get this subclass, and nothing changes for the others: the
serving itself is `KerasHubForCausalLM`'s, with its `state.` layers
(`layers/state/state_routes.py`).
"""

from vllm.model_executor.models.interfaces import HasInnerState
from vllm.model_executor.models.interfaces import IsHybrid

from vllm_keras_hub.models.causal import KerasHubForCausalLM


def _spec(vllm_config):
    from vllm_keras_hub.layers.state.state import GatedDeltaNetSpec

    config = vllm_config.model_config.hf_text_config
    return GatedDeltaNetSpec(
        config.linear_num_key_heads,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        config.linear_conv_kernel_dim,
    )


class KerasHubHybridForCausalLM(KerasHubForCausalLM, IsHybrid, HasInnerState):
    """A KerasHub preset with Gated DeltaNet layers, served by vLLM.

    Args:
        vllm_config: The engine's `VllmConfig`.
        prefix: Module prefix vLLM gives the model.
    """

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        # Each rank's slots hold its heads (`layers/parallel/parallel_state.py`).
        ranks = vllm_config.parallel_config.tensor_parallel_size
        return _spec(vllm_config).state_shape(ranks)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        from vllm_keras_hub.layers.state.state import state_dtypes

        return state_dtypes(vllm_config.model_config.dtype)

    @classmethod
    def get_mamba_state_copy_func(cls):
        from vllm.model_executor.layers.mamba.mamba_utils import (
            MambaStateCopyFuncCalculator,
        )

        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()
