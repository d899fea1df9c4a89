"""Tiny media encoders for the test presets of multimodal families.

Published Gemma3 (`gemma3_4b` and up), Gemma3n, Gemma4 and Qwen3.5 presets
carry image or audio encoders; their backbones' graphs then take media
inputs. These tiny ones make test presets of the same shape.
"""

# The tiny presets' text width (`presets._COMMON`), which encoders project to.
TEXT_WIDTH = 128


def _gemma3_vision_encoder(vocabulary_size):
    from keras_hub.src.models.gemma3.gemma3_vision_encoder import (
        Gemma3VisionEncoder,
    )

    # As `gemma3_4b` and up: a SigLIP encoder pooled to the text width; 16
    # soft tokens per image. A window of 128 lets test prompts hold images
    # both within it and past it (`layers/attention/image_attention.py`).
    return dict(
        image_size=64,
        sliding_window_size=128,
        vision_encoder=Gemma3VisionEncoder(
            image_size=64,
            patch_size=8,
            num_heads=2,
            hidden_dim=32,
            num_layers=1,
            intermediate_dim=64,
            output_dim=TEXT_WIDTH,
            pool_size=2,
        ),
    )


def tiny_gemma4_encoder(pool_size=3):
    """A tiny Gemma4 ViT.

    Pooled by 3 as every published Gemma4 encoder (and as its image
    converter assumes): the converter's 2520 patches of 8x8 pixels pool to
    280 soft tokens.
    """
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import (
        Gemma4VisionEncoder,
    )

    return Gemma4VisionEncoder(
        image_size=384,
        patch_size=8,
        num_heads=2,
        hidden_dim=32,
        num_layers=1,
        intermediate_dim=64,
        head_dim=16,
        output_dim=TEXT_WIDTH,
        pool_size=pool_size,
    )


def _gemma4_vision_encoder(vocabulary_size):
    return dict(image_size=384, vision_encoder=tiny_gemma4_encoder())


def _qwen3_5_vision_encoder(vocabulary_size):
    from keras_hub.src.models.qwen3_5.qwen3_5_vision_encoder import (
        Qwen3_5VisionEncoder,
    )

    # As every published Qwen3.5 preset: a ViT merged to the text width.
    return dict(
        vision_encoder=Qwen3_5VisionEncoder(
            depth=1,
            hidden_size=32,
            num_heads=2,
            intermediate_size=64,
            patch_size=8,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=TEXT_WIDTH,
            num_position_embeddings=16,
        )
    )


def tiny_gemma3n_audio_encoder():
    """Gemma3nBackbone's docstring example, with the encoder's argument
    names: 32 mel bins, 4x fewer frames out than in."""
    from keras_hub.src.models.gemma3n.gemma3n_audio_encoder import (
        Gemma3nAudioEncoder,
    )

    return Gemma3nAudioEncoder(
        hidden_size=8,
        input_feat_size=32,
        sscp_conv_channel_size=[4, 8],
        sscp_conv_kernel_size=[(3, 3), (3, 3)],
        sscp_conv_stride_size=[(2, 2), (2, 2)],
        sscp_conv_group_norm_eps=1e-5,
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        gradient_clipping=1.0,
        residual_weight=0.5,
        num_attention_heads=1,
        attention_chunk_size=4,
        num_attention_context_right=5,
        num_attention_context_left=5,
        attention_logit_cap=50.0,
        conv_kernel_size=5,
        reduction_factor=1,
    )


def _gemma3n_audio_encoder(vocabulary_size):
    encoder = tiny_gemma3n_audio_encoder()
    # As in the published presets, the audio soft tokens are the vocabulary's
    # last ids (the embedding processor embeds them with the audio embedder).
    return dict(
        audio_encoder_config=encoder.get_config(),
        audio_vocab_offset=vocabulary_size - 64,
        audio_vocab_size=64,
    )


# Families whose published presets carry media encoders -> the backbone
# arguments adding a tiny one (Gemma3, Gemma4: images; Gemma3n: audio).
MULTIMODAL = {
    "gemma3": _gemma3_vision_encoder,
    "gemma4": _gemma4_vision_encoder,
    "gemma3n": _gemma3n_audio_encoder,
    "qwen3_5": _qwen3_5_vision_encoder,
}


# Images served by their own tests (`vision_test.py`): tiny encoders of the
# published presets' kind, and the backbone arguments that give the image
# tokens their ids. Each takes the preset's tokenizer.
def _gemma3n_images(tokenizer, audio=False):
    from keras_hub.src.models.mobilenetv5.mobilenetv5_builder import (
        convert_arch_def_to_stackwise,
    )

    # MobileNetV5 as `mobilenetv5_300m_enc` (edge-residual, inverted-
    # bottleneck and multi-query attention blocks, the multi-scale fusion
    # adapter), 64x64 images to 4x4 = 16 soft tokens of 32 features.
    encoder = convert_arch_def_to_stackwise(
        [
            ["er_r1_k3_s2_e4_c16"],
            ["uir_r1_a3_k5_s2_e4_c32", "mqa_r1_k3_h2_v2_s1_d16_c32"],
            ["uir_r1_a3_k5_s2_e4_c32"],
        ]
    )
    encoder.update(
        stem_size=16,
        num_features=32,
        norm_layer="rms_norm",
        act_layer="gelu",
        use_msfa=True,
        msfa_output_resolution=4,
        layer_scale_init_value=1e-5,
        image_shape=(64, 64, 3),
    )
    # The vision vocabulary starts at `<end_of_image>`, as in the published
    # vocabulary: it and the image soft token embed with the vision
    # embedder. As published, the per-layer vocabulary ends where it starts
    # (here, with it, most of the text's too): ids from there on get the
    # per-layer embedding of id 0.
    offset = tokenizer.token_to_id("<end_of_image>")
    media = dict(_gemma3n_audio(tokenizer)) if audio else {}
    return dict(
        media,
        vocab_size_per_layer_input=offset,
        vision_encoder_config=encoder,
        vision_hidden_size=32,
        vision_vocab_offset=offset,
        vision_vocab_size=2,
        vision_soft_tokens_per_image=16,
        image_token_id=tokenizer.image_placeholder_id,
    )


def _gemma3n_audio(tokenizer):
    # As published, the audio vocabulary starts at `<end_of_audio>`, right
    # after the vision vocabulary, and runs to the end of the vocabulary:
    # here, through the text pieces too, which it then embeds (in KerasHub
    # and here alike). 16 soft tokens per clip: a 0.4 s clip's 10
    # embeddings are padded to them, a 1 s clip's 24 cut.
    offset = tokenizer.token_to_id("<end_of_audio>")
    return dict(
        audio_encoder_config=tiny_gemma3n_audio_encoder().get_config(),
        audio_hidden_size=8,
        audio_vocab_offset=offset,
        audio_vocab_size=tokenizer.vocabulary_size() - offset,
        audio_soft_tokens_per_image=16,
        audio_token_id=tokenizer.audio_placeholder_id,
    )


# Gemma4's image tokens per image (its image converter's default, which
# its saved config keeps) and a sliding window that holds one image's
# tokens and some text, so test prompts reach past it.
GEMMA4_IMAGE_WINDOW = 384


# The mel bins of the tiny Gemma4 audio encoder and its converter.
GEMMA4_MEL_BINS = 32


def tiny_gemma4_audio_encoder():
    """A tiny Gemma4 conformer (`Gemma4AudioEncoder`): one block, the
    published chunking and context, 4x fewer frames out than in, projected
    to the text width."""
    from keras_hub.src.models.gemma4.gemma4_audio_encoder import (
        Gemma4AudioEncoder,
    )

    return Gemma4AudioEncoder(
        input_feat_size=GEMMA4_MEL_BINS,
        hidden_size=16,
        num_heads=2,
        num_layers=1,
        sscp_conv_channels=(8, 4),
        output_proj_dims=16,
        output_dim=TEXT_WIDTH,
    )


def _gemma4_images(tokenizer, bidirectional=False, audio=False):
    media = {}
    if audio:
        # As the published E2B and E4B presets: up to 750 soft tokens per
        # clip, 30 s of frames subsampled 4x.
        media = dict(audio_encoder=tiny_gemma4_audio_encoder(), num_audio_tokens_per_clip=750)
    return dict(
        _gemma4_vision_encoder(tokenizer.vocabulary_size()),
        **media,
        sliding_window_size=GEMMA4_IMAGE_WINDOW,
        use_vision_bidirectional_attention=bidirectional,
    )


def _qwen3_5_images(tokenizer):
    # As published: M-RoPE over the rotary half of each attention head in
    # interleaved sections (published [11, 11, 10] of 64 features; here
    # [3, 3, 2] of 16), so an image token's height and width rotate
    # features of their own.
    return dict(
        _qwen3_5_vision_encoder(tokenizer.vocabulary_size()),
        partial_rotary_factor=0.5,
        mrope_section=[3, 3, 2],
    )


IMAGES = {"gemma3n": _gemma3n_images, "gemma4": _gemma4_images, "qwen3_5": _qwen3_5_images}
