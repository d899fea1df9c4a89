"""vLLM plugin: registers the KerasHub pieces in every vLLM process.

vLLM calls the `vllm.general_plugins` entry point once in each process (front
end, engine core, workers), so a plain `vllm serve` finds them too. It runs
for every model vLLM serves, so it imports neither Keras nor KerasHub: the
model class is registered by name and imported only when a KerasHub model is
built (see `backend.py` for why that matters).
"""


def register():
    """Registers our config type, model classes and their config check, load
    format and tokenizer mode.

    Re-entrant: vLLM may call it more than once in a process.
    """
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    from vllm_keras_hub import backend
    from vllm_keras_hub.entrypoints.verify import KerasHubConfigCheck
    from vllm_keras_hub.export import architectures
    from vllm_keras_hub.export import hf_config as config

    # Importing the load format registers it.
    from vllm_keras_hub.loading import load_format  # noqa: F401

    # keras-hub's own entry point may have failed to import Keras just before.
    backend.forget_failed_keras_import()
    config.register_config()
    supported = ModelRegistry.get_supported_archs()
    for architecture, model_class in architectures.CLASSES.items():
        if architecture not in supported:
            ModelRegistry.register_model(architecture, model_class)
    # Former names only where no other plugin (keras-hub's) holds them.
    for former, architecture in architectures.FORMER.items():
        if former not in supported:
            ModelRegistry.register_model(former, architectures.CLASSES[architecture])
    # Each config vLLM builds for our classes is checked as it is built.
    for architecture in (*architectures.CLASSES, *architectures.FORMER):
        module = getattr(ModelRegistry.models.get(architecture), "module_name", "")
        if module.startswith("vllm_keras_hub."):
            MODELS_CONFIG_MAP.setdefault(architecture, KerasHubConfigCheck)
    # For tokenizers that cannot be exported exactly: keras-hub's own adapter,
    # through a module that first makes Keras use torch. The former mode
    # name only where keras-hub's plugin has not registered its own.
    own_modes = [config.KERAS_HUB_TOKENIZER_MODE]
    if config.FORMER_KERAS_HUB_TOKENIZER_MODE not in TokenizerRegistry.tokenizers:
        own_modes.append(config.FORMER_KERAS_HUB_TOKENIZER_MODE)
    for mode in own_modes:
        TokenizerRegistry.register(
            mode, "vllm_keras_hub.export.keras_hub_tokenizers", "KerasHubTokenizer"
        )
        RENDERER_REGISTRY.register(mode, "vllm.renderers.hf", "HfRenderer")
    image_first = config.IMAGE_FIRST_TOKENIZER_MODES
    TokenizerRegistry.register(image_first["auto"], "vllm.tokenizers.hf", "CachedHfTokenizer")
    TokenizerRegistry.register(
        image_first[config.KERAS_HUB_TOKENIZER_MODE],
        "vllm_keras_hub.export.keras_hub_tokenizers",
        "KerasHubTokenizer",
    )
    for mode in image_first.values():
        RENDERER_REGISTRY.register(
            mode, "vllm_keras_hub.entrypoints.image_first_renderer", "ImageFirstRenderer"
        )
    TokenizerRegistry.register(
        config.SEQ2SEQ_TOKENIZER_MODE, "vllm.tokenizers.hf", "CachedHfTokenizer"
    )
    RENDERER_REGISTRY.register(
        config.SEQ2SEQ_TOKENIZER_MODE,
        "vllm_keras_hub.tasks.seq_2_seq_lm.renderer",
        "Seq2SeqRenderer",
    )
    TokenizerRegistry.register(
        config.AUDIO_TO_TEXT_TOKENIZER_MODE, "vllm.tokenizers.hf", "CachedHfTokenizer"
    )
    RENDERER_REGISTRY.register(
        config.AUDIO_TO_TEXT_TOKENIZER_MODE,
        "vllm_keras_hub.tasks.audio_to_text.renderer",
        "AudioToTextRenderer",
    )
    TokenizerRegistry.register(
        config.KERAS_HUB_EMBEDDER_TOKENIZER_MODE,
        "vllm_keras_hub.export.keras_hub_tokenizers",
        "KerasHubEmbedderTokenizer",
    )
    RENDERER_REGISTRY.register(
        config.KERAS_HUB_EMBEDDER_TOKENIZER_MODE, "vllm.renderers.hf", "HfRenderer"
    )
