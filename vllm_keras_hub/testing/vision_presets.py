"""Tiny presets with a served vision encoder and its image converter."""

from vllm_keras_hub.testing.presets import DEFAULT_LAYER_KERNEL_SCALE
from vllm_keras_hub.testing.presets import DEFAULT_LOGIT_SCALE
from vllm_keras_hub.testing.presets import build_tiny_preset


def _image_converter(family, size):
    from keras_hub.src.models.gemma3.gemma3_image_converter import (
        Gemma3ImageConverter,
    )
    from keras_hub.src.models.gemma3n.gemma3n_image_converter import (
        Gemma3nImageConverter,
    )
    from keras_hub.src.models.gemma4.gemma4_image_converter import (
        Gemma4ImageConverter,
    )

    # Pixels to [-1, 1].
    rescale = dict(scale=1 / 127.5, offset=-1.0)
    if family == "qwen3_5":
        from keras_hub.src.models.qwen3_5.qwen3_5_image_converter import (
            Qwen3_5ImageConverter,
        )

        # Patches of 8 pixels merged 2x2, so one soft token per 16x16
        # pixels; up to 96x96 pixels (36 soft tokens), as published up to
        # 4096x4096.
        return Qwen3_5ImageConverter(
            patch_size=8, min_pixels=256, max_pixels=96 * 96, **rescale
        )
    if family == "gemma4":
        return Gemma4ImageConverter(patch_size=8, **rescale)
    converter = {"gemma3": Gemma3ImageConverter, "gemma3n": Gemma3nImageConverter}
    return converter[family](image_size=(size, size), **rescale)


# The tiny Gemma4 video converter's frames per video (published: 32).
GEMMA4_VIDEO_FRAMES = 4


def build_tiny_vision_preset(
    directory,
    family="gemma3",
    seed=0,
    image_weight=30.0,
    bidirectional=False,
    audio=False,
    video=False,
    backbone_overrides=None,
):
    """A tiny preset with a vision encoder and an image converter.

    Args:
        directory: Where to save; created if missing.
        family: `"gemma3"`, `"gemma3n"`, `"gemma4"` or `"qwen3_5"`.
        seed: Weight initialisation seed.
        image_weight: Gemma3 only: factor on the encoder's output
            projection. Gemma3 scales text embeddings by sqrt(hidden) and
            image embeddings not; random image embeddings would be too faint
            to change the output, and a test could not tell images (or how
            they attend) apart. Gemma3n's and Gemma4's encoders end in a
            norm, and their images are strong enough as they are.
        bidirectional: Gemma4 only: `use_vision_bidirectional_attention`,
            as the published 26B and 31B presets have it.
        audio: Gemma3n and Gemma4: with a tiny audio encoder, the audio
            tokens and the preset's audio converter too, as the published
            Gemma3n and Gemma4 E2B and E4B presets have them.
        video: Gemma4 and Qwen3.5: with the preset's video converter too,
            as every published preset has it (Gemma4: `GEMMA4_VIDEO_FRAMES`
            frames per video, each of at most 70 soft tokens; Qwen3.5: all
            the frames given, up to 32 soft tokens in all).
        backbone_overrides: Backbone arguments over the family's.

    Returns:
        `directory`.
    """
    import keras_hub

    images = None
    if family != "gemma3":  # Gemma3's `MULTIMODAL` encoder takes images.
        images = dict(bidirectional=bidirectional) if family == "gemma4" else {}
        if audio:
            images["audio"] = True
    build_tiny_preset(
        family,
        directory,
        seed=seed,
        multimodal=family == "gemma3",
        images=images,
        backbone_overrides=backbone_overrides,
    )
    size = None
    if family == "gemma3":
        causal_lm = keras_hub.models.Gemma3CausalLM.from_preset(
            directory, preprocessor=None
        )
        encoder = causal_lm.backbone.vision_encoder
        projection = encoder.get_layer("vision_output_encoder").vision_input_projection
        projection.kernel.assign(projection.kernel * image_weight)
        causal_lm.save_to_preset(directory)
        size = encoder.image_size
    elif family == "gemma3n":
        size = 64
    converter = _image_converter(family, size)
    converter.save_to_preset(directory)
    if family == "qwen3_5":
        # As published: the preprocessor holds the converters too.
        causal_lm = keras_hub.models.Qwen3_5CausalLM.from_preset(directory)
        causal_lm.preprocessor.image_converter = converter
        if video:
            causal_lm.preprocessor.video_converter = _qwen3_5_video_converter()
            causal_lm.preprocessor.video_converter.save_to_preset(directory)
        causal_lm.save_to_preset(directory)
    if audio:
        _audio_converter(family).save_to_preset(directory)
    if video and family == "gemma4":
        from keras_hub.src.models.gemma4.gemma4_video_converter import (
            Gemma4VideoConverter,
        )

        Gemma4VideoConverter(
            patch_size=8, num_frames=GEMMA4_VIDEO_FRAMES, scale=1 / 127.5, offset=-1.0
        ).save_to_preset(directory)
    return directory


def _qwen3_5_video_converter():
    from keras_hub.src.models.qwen3_5.qwen3_5_video_converter import (
        Qwen3_5VideoConverter,
    )

    # Patches of 8 pixels, 2 frames, merged 2x2 (one soft token per 16x16
    # pixels of 2 frames); up to 32 soft tokens a video (its frames' pixels
    # in all within 16,384), as published up to 4096x4096's worth.
    return Qwen3_5VideoConverter(
        patch_size=8, min_pixels=256, max_pixels=16384, scale=1 / 127.5, offset=-1.0
    )


def _audio_converter(family="gemma3n"):
    if family == "gemma4":
        from keras_hub.src.models.gemma4.gemma4_audio_converter import (
            Gemma4AudioConverter,
        )

        from vllm_keras_hub.testing.media_encoders import GEMMA4_MEL_BINS

        # The published settings (its defaults), with the tiny encoder's
        # mel bins.
        return Gemma4AudioConverter(num_mels=GEMMA4_MEL_BINS)
    from keras_hub.src.models.gemma3n.gemma3n_audio_converter import (
        Gemma3nAudioConverter,
    )

    # The published presets' settings, with the tiny encoder's 32 mel bins.
    return Gemma3nAudioConverter(
        feature_size=32,
        sampling_rate=16000,
        padding_value=0.0,
        return_attention_mask=True,
        frame_length_ms=32.0,
        hop_length_ms=10.0,
        min_frequency=125.0,
        max_frequency=7600.0,
        preemphasis=0.97,
        preemphasis_htk_flavor=True,
        fft_overdrive=True,
        dither=0.0,
        input_scale_factor=1.0,
        mel_floor=1e-5,
        per_bin_mean=None,
        per_bin_stddev=None,
        padding_side="right",
    )


# PaliGemma 2's decoder is Gemma 2's: post-norms, soft caps, and a sliding
# window on every other layer (32 tokens here, so prefixes pass it).
PALI_GEMMA_2 = dict(
    query_head_dim_normalize=False,
    use_post_ffw_norm=True,
    use_post_attention_norm=True,
    attention_logit_soft_cap=50.0,
    final_logit_soft_cap=30.0,
    use_sliding_window_attention=True,
    sliding_window_size=32,
)

# (embedding, layer kernel) factors, by version.
PALI_GEMMA_SCALES = {1: (DEFAULT_LOGIT_SCALE, DEFAULT_LAYER_KERNEL_SCALE), 2: (1.0, 2.0)}


def build_tiny_pali_gemma_preset(directory, seed=0, preprocessor=True, version=1):
    """A tiny PaliGemma preset: a ViT of 16 patches and a 2-layer decoder.

    Args:
        directory: Where to save; created if missing.
        seed: Weight initialisation seed.
        preprocessor: Whether to save its `PaliGemmaCausalLMPreprocessor`
            (the published layout); else its tokenizer and image converter
            alone.
        version: 2 for PaliGemma 2's decoder (`PALI_GEMMA_2`).

    Returns:
        `directory`.
    """
    import keras
    import keras_hub

    from vllm_keras_hub.testing.tokenizers import tiny_sentencepiece_proto

    proto = tiny_sentencepiece_proto(layout="gemma", user_defined_symbols=("<image>",))
    tokenizer = keras_hub.tokenizers.PaliGemmaTokenizer(proto=proto)
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.PaliGemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        image_size=56,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=128,
        intermediate_dim=256,
        head_dim=64,
        vit_patch_size=14,
        vit_num_heads=2,
        vit_hidden_dim=32,
        vit_num_layers=2,
        vit_intermediate_dim=64,
        **(PALI_GEMMA_2 if version == 2 else {}),
    )
    # As the tiny Gemma and Gemma2 presets: so the context, not the last
    # token, decides (Gemma 2's post-norms bound each layer's update, so
    # its embeddings stay as initialised).
    scales = PALI_GEMMA_SCALES[version]
    for variable in backbone.token_embedding.weights:
        variable.assign(variable * scales[0])
    for layer in backbone.transformer_layers:
        for variable in layer.weights:
            if len(variable.shape) >= 2:
                variable.assign(variable * scales[1])
    converter = keras_hub.layers.PaliGemmaImageConverter(
        image_size=(56, 56), scale=1 / 127.5, offset=-1.0
    )
    causal_lm = keras_hub.models.PaliGemmaCausalLM(
        backbone=backbone,
        preprocessor=keras_hub.models.PaliGemmaCausalLMPreprocessor(
            tokenizer=tokenizer, image_converter=converter
        ),
    )
    if preprocessor:
        causal_lm.save_to_preset(directory)
        return directory
    backbone.save_to_preset(directory)
    tokenizer.save_to_preset(directory)
    converter.save_to_preset(directory)
    return directory
