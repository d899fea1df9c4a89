"""What some KerasHub model classes take beside the base: adapters, EAGLE-3 taps.

Plain classes, listed before `KerasHubBase` in a model class's bases so
their steps replace the base's; vLLM's interfaces (`SupportsLoRA`,
`SupportsEagle3`) are listed on the model class itself, after `nn.Module`,
as vLLM's own models list them.
"""

from torch import nn
from vllm.logger import init_logger

from vllm_keras_hub.layers import eagle3
from vllm_keras_hub.layers.linear import lora_linear
from vllm_keras_hub.lora import adapters as lora_adapters
from vllm_keras_hub.vllm_fixes.punica_zero_slot import keep_a_zero_slot

logger = init_logger(__name__)


class LoRAMixin:
    """LoRA per request (`SupportsLoRA`).

    With `--enable-lora` the model's LoRA-capable matmuls run on vLLM
    linears (`layers/linear/lora_linear.py`), which vLLM's LoRA manager wraps;
    adapters are converted by `lora/adapters.py`.
    """

    def _build_adapters(self, backbone, stage):
        """With `--enable-lora`, vLLM linears under the LoRA-capable matmuls."""
        if self.vllm_config.lora_config is not None:
            self.lora_layers = self._lora_layers(backbone)
            if stage.size > 1:
                self.lora_skip_prefixes = lora_linear.other_stages_prefixes(
                    backbone, stage.layers
                )

    def _lora_layers(self, backbone):
        lora_adapters.check_convertible(self.preset)
        layers = lora_linear.build(backbone, self.prefix)
        # A sharded matmul now has its adapter name: one name per module, as
        # vLLM's LoRA manager reads its expected modules off the names.
        adopted = {id(module) for module in layers.values()}
        self.parallel_linears = nn.ModuleList(
            module for module in self.parallel_linears if id(module) not in adopted
        )
        logger.info("%d KerasHub matmul layers can take LoRA adapters", len(layers))
        # vLLM's LoRA manager, made after loading, would wrap every FusedMoE
        # and the vocabulary-parallel head too; KerasHub adapters target
        # neither, so it may wrap these layers only.
        lora_linear.restrict_lora_manager(self.vllm_config.lora_config, layers)
        return layers

    @property
    def lora_manager(self):
        """vLLM's `LoRAModelManager` of this model.

        vLLM sets it once it has wrapped the LoRA layers, which is when
        they get their zero slot (`keep_a_zero_slot`).
        """
        return self.__dict__.get("_lora_manager")

    @lora_manager.setter
    def lora_manager(self, manager):
        keep_a_zero_slot(manager)
        self.__dict__["_lora_manager"] = manager


class Eagle3TargetMixin:
    """A target EAGLE-3 drafters read (`SupportsEagle3`).

    `model` is what vLLM's proposers read of a target: the token embedding
    and, per step, the aux hidden states of the layers they ask for
    (`layers/eagle3.py`).
    """

    def set_aux_hidden_state_layers(self, layers):
        """Taps the transformer layers an EAGLE-3 drafter reads (vLLM's indices)."""
        self.model._set_aux_hidden_state_layers(layers)

    def get_eagle3_default_aux_hidden_state_layers(self):
        return eagle3.default_aux_layers(len(self.model.layers))
