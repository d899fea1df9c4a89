"""The `keras_hub` load format: weights come from the preset, once.

vLLM's own formats would look for weight files in the model folder (there are
none), and `dummy` would re-initialise every parameter, the KerasHub ones too.
"""

from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from vllm_keras_hub.export.hf_config import LOAD_FORMAT
from vllm_keras_hub.lora.merged import LORA_WEIGHTS_KEY


def backbone_dtype(preset, dtype):
    """The `dtype` to build a preset's backbone in, quantized ones included.

    A backbone saved after `quantize("int8")` carries a `DTypePolicyMap` of
    its quantized layers. `Backbone.from_preset(dtype="float32")` replaces
    that map with the plain policy (keras-hub 0.32), so the layers are built
    unquantized and their int8 weights fail to load. For such a preset this
    returns the saved map with `dtype` as its default and as the quantized
    layers' source dtype, as keras-hub does when a map is kept.
    """
    import copy

    from keras_hub.src.utils.preset_utils import set_dtype_in_config

    from vllm_keras_hub.preset import Preset

    # `set_dtype_in_config` writes into the map it is given.
    config = copy.deepcopy(Preset.of(preset).config)
    saved = config.get("config", {}).get("dtype")
    if isinstance(saved, dict) and "DTypePolicyMap" in saved.get("class_name", ""):
        return set_dtype_in_config(config, dtype)["config"]["dtype"]
    return dtype


def task_final_logit_cap(preset):
    """The soft cap a preset's task, not its backbone, puts on the logits.

    `Gemma4CausalLM(final_logit_cap=...)` caps the logits again after the
    backbone's own `final_logit_soft_cap`; `None` where the preset's
    `task.json` sets none (or it has none).
    """
    from vllm_keras_hub.preset import Preset

    task = Preset.of(preset).task_config
    if task is None:
        return None
    cap = task.get("config", {}).get("final_logit_cap")
    return float(cap) if cap else None


@register_model_loader(LOAD_FORMAT)
class KerasHubModelLoader(BaseModelLoader):
    """Loads a `KerasHubForCausalLM`'s backbone and weights from its preset.

    `model_loader_extra_config` may name a KerasHub LoRA adapter,
    `{"lora_weights": "x.lora.h5"}`, to merge into the kernels at load.
    """

    def __init__(self, load_config):
        super().__init__(load_config)
        extra_config = load_config.model_loader_extra_config
        if not isinstance(extra_config, dict) or set(extra_config) - {LORA_WEIGHTS_KEY}:
            raise ValueError(
                f"load_format='{LOAD_FORMAT}' takes model_loader_extra_config "
                f'{{"{LORA_WEIGHTS_KEY}": "<file>.lora.h5"}} only, got {extra_config!r}.'
            )
        self.lora_weights = extra_config.get(LORA_WEIGHTS_KEY)

    def load_model(self, vllm_config, model_config, prefix=""):
        """Loads a KerasHub model; hands any other (a drafter) to vLLM's loader.

        vLLM 0.32 loads speculative drafters with the target's load config
        (`get_draft_load_config`, and `DraftModelProposer._get_model` passes
        none at all), so an EAGLE-3 head or a Hugging Face draft model of a
        KerasHub target reaches this loader; it loads as vLLM would load it
        for a native target.
        """
        if hasattr(model_config.hf_config, "keras_hub_preset"):
            return super().load_model(vllm_config, model_config, prefix)
        from dataclasses import replace

        from vllm.model_executor.model_loader import get_model_loader

        native = replace(
            self.load_config, load_format="auto", model_loader_extra_config={}
        )
        return get_model_loader(native).load_model(vllm_config, model_config, prefix)

    def create_model(self, vllm_config, model_config, prefix=""):
        """Our drafter class for a drafter preset; else vLLM's choice.

        vLLM names a drafter's class by its architecture (a Gemma4
        assistant's: `Gemma4MTPModel`, `SpeculativeConfig.
        hf_config_override`), which is its own model of Hugging Face
        weights; the family names ours (`Family.drafters`).
        """
        if getattr(model_config.hf_config, "keras_hub_drafter", None) is None:
            return super().create_model(vllm_config, model_config, prefix)
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.import_utils import resolve_obj_by_qualname

        from vllm_keras_hub import families

        model_type = model_config.hf_config.keras_hub_drafter
        (drafter,) = (d for d in families.DRAFTERS.values() if d.model_type == model_type)
        return initialize_model(
            vllm_config,
            prefix=prefix,
            model_class=resolve_obj_by_qualname(drafter.model_class.replace(":", ".")),
            model_config=model_config,
        )

    def download_model(self, model_config):
        """Fetches the preset files into KerasHub's cache ahead of loading."""
        from keras_hub.src.utils.preset_utils import CONFIG_FILE
        from keras_hub.src.utils.preset_utils import get_file

        get_file(model_config.hf_config.keras_hub_preset, CONFIG_FILE)

    def load_weights(self, model, model_config):
        """Builds the backbone from the preset, in vLLM's resolved dtype."""
        if not hasattr(model, "load_preset"):
            raise ValueError(
                f"load_format='{LOAD_FORMAT}' serves KerasHub presets only, "
                f"not {type(model).__name__}."
            )
        model.load_preset(lora_weights=self.lora_weights)
