"""The vLLM model classes vllm-keras-hub registers, and the choice of one.

vLLM picks a model class by the `architectures` a folder's `config.json`
names. `choose` is the one place that decides it for a generating preset
(a pooling task's spec names its own, `tasks/`); `CLASSES` is what the
plugin registers, by module path, so registering imports no
Keras (see `plugin.py`).

The names are our own (`KerasHubTorch...`, as the config's `model_type` is
`keras_hub_torch`): keras-hub registers `KerasHubForCausalLM` for its own
serving class from its own plugin, and whichever plugin registered a shared
name first would serve the other's folders. `FORMER` keeps the names older
folders carry readable, wherever nothing else holds them.
"""

from vllm_keras_hub import tasks
from vllm_keras_hub.tasks import audio_to_text
from vllm_keras_hub.tasks import seq_2_seq_lm

CAUSAL = "KerasHubTorchForCausalLM"
# Presets that mix attention with recurrent-state layers.
HYBRID = "KerasHubTorchHybridForCausalLM"
# Presets served with images: one class per family, as vLLM names a
# multimodal model class per family, since each has its own placeholder.
GEMMA3_VISION = "KerasHubTorchGemma3VisionForCausalLM"
GEMMA3N_VISION = "KerasHubTorchGemma3nVisionForCausalLM"
GEMMA4_VISION = "KerasHubTorchGemma4VisionForCausalLM"
# Prompts are prefixes, image first (`families/pali_gemma/media.py`).
PREFIX_LM = "KerasHubTorchPaliGemmaForCausalLM"
# Images placed by M-RoPE positions (`families/qwen3_5/media.py`).
MROPE = "KerasHubTorchQwen3_5VisionForCausalLM"

_MODELS = "vllm_keras_hub.models"
_FAMILIES = "vllm_keras_hub.families"
CLASSES = {
    CAUSAL: f"{_MODELS}.causal:KerasHubForCausalLM",
    HYBRID: f"{_MODELS}.hybrid:KerasHubHybridForCausalLM",
    # A family's own class, in its folder (`families/<name>/media.py`).
    GEMMA3_VISION: f"{_FAMILIES}.gemma3.media:KerasHubGemma3VisionForCausalLM",
    GEMMA3N_VISION: f"{_FAMILIES}.gemma3n.media:KerasHubGemma3nVisionForCausalLM",
    GEMMA4_VISION: f"{_FAMILIES}.gemma4.media:KerasHubGemma4VisionForCausalLM",
    PREFIX_LM: f"{_FAMILIES}.pali_gemma.media:KerasHubPaliGemmaForCausalLM",
    MROPE: f"{_FAMILIES}.qwen3_5.media:KerasHubQwen3_5VisionForCausalLM",
    # Each pooling task's class (`tasks/`).
    **tasks.CLASSES,
    # Encoder-decoder presets (`tasks/seq_2_seq_lm/`, `tasks/audio_to_text/`).
    seq_2_seq_lm.ARCHITECTURE: seq_2_seq_lm.MODEL_CLASS,
    audio_to_text.ARCHITECTURE: audio_to_text.MODEL_CLASS,
}

# The names folders written before these carry -> ours.
FORMER = {
    "KerasHubForCausalLM": CAUSAL,
    "KerasHubHybridForCausalLM": HYBRID,
    "KerasHubVisionForCausalLM": GEMMA3_VISION,
    "KerasHubGemma3nVisionForCausalLM": GEMMA3N_VISION,
    "KerasHubGemma4VisionForCausalLM": GEMMA4_VISION,
    "KerasHubPaliGemmaForCausalLM": PREFIX_LM,
    "KerasHubQwen3_5VisionForCausalLM": MROPE,
    **tasks.FORMER,
}


def current(architecture):
    """Our name for `architecture`, a former name or ours."""
    return FORMER.get(architecture, architecture)


def choose(family, images=False, hybrid=False):
    """The model class a generating preset of `family` is served by.

    A pooling task's spec names its own (`tasks/`).

    Args:
        family: Its `families.Family`.
        images: Whether it is served with images (its folder has
            `keras_hub_image`); its family's image class then serves it,
            hybrid or not.
        hybrid: Whether some of its layers keep a recurrent state.
    """
    if images:
        return family.image_architecture
    return HYBRID if hybrid else CAUSAL
