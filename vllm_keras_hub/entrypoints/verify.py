"""vLLM's config hook for our model classes: `settings.verify` on every
`VllmConfig` vLLM builds for a KerasHub model folder.

vLLM looks each model's architecture up in `MODELS_CONFIG_MAP` while it
builds a `VllmConfig` (`try_verify_and_update_config`), in the front end
of every way in: `KerasHubLLM`, `vllm-keras-hub serve` and a plain `vllm`
command alike. `plugin.py` lists our architectures there. This module
imports no Keras: the check imports it only for a KerasHub model.
"""

from vllm.model_executor.models.config import VerifyAndUpdateConfig


class KerasHubConfigCheck(VerifyAndUpdateConfig):
    """Refuses, at config time, engine settings the folder is not served
    with exactly (`settings.verify`)."""

    @staticmethod
    def verify_and_update_config(vllm_config):
        from vllm_keras_hub import settings

        settings.verify(vllm_config)
