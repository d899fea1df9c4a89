"""vLLM plugin: registers the KerasHub pieces in every vLLM process.

vLLM calls the `vllm.general_plugins` entry point once in each process (front
end, engine core, workers), so a plain `vllm serve` finds them too.
"""

ARCHITECTURE_CLASS = "vllm_keras_hub.model:KerasHubForCausalLM"


def register():
    """Registers our config type, model class, load format and tokenizer mode.

    Re-entrant: vLLM may call it more than once in a process.
    """
    import vllm_keras_hub  # noqa: F401 - defaults KERAS_BACKEND to torch.
    from vllm import ModelRegistry
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    from vllm_keras_hub import config
    from vllm_keras_hub import loader  # noqa: F401 - registers the format.

    config.register_config()
    if config.ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(config.ARCHITECTURE, ARCHITECTURE_CLASS)
    # For tokenizers that cannot be exported exactly: keras-hub's own adapter.
    TokenizerRegistry.register(
        config.KERAS_HUB_TOKENIZER_MODE, "keras_hub.src.vllm.tokenizer", "KerasHubTokenizer"
    )
    RENDERER_REGISTRY.register(
        config.KERAS_HUB_TOKENIZER_MODE, "vllm.renderers.hf", "HfRenderer"
    )
