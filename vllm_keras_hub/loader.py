"""The `keras_hub` load format: weights come from the preset, once.

vLLM's own formats would look for weight files in the model folder (there are
none), and `dummy` would re-initialise every parameter, the KerasHub ones too.
"""

from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from vllm_keras_hub.config import LOAD_FORMAT


@register_model_loader(LOAD_FORMAT)
class KerasHubModelLoader(BaseModelLoader):
    """Loads a `KerasHubForCausalLM` with `Backbone.from_preset`."""

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
        model.load_preset()
