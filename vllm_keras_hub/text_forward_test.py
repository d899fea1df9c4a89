import keras
import keras_hub
import numpy as np
import pytest
import torch

from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import backbone_kwargs
from vllm_keras_hub.text_forward import text_forward

LENGTH = 12


def _backbone(family, **extra):
    keras.utils.set_random_seed(0)
    backbone_cls = getattr(keras_hub.models, TINY_FAMILIES[family][1])
    return backbone_cls(**{**backbone_kwargs(family, 64), **extra})


def _token_ids():
    return np.random.default_rng(0).integers(1, 64, (2, LENGTH))


def _text_forward(backbone, token_ids):
    positions = np.broadcast_to(np.arange(LENGTH), token_ids.shape)
    with torch.inference_mode():
        return keras.ops.convert_to_numpy(
            text_forward(backbone, token_ids, np.ones_like(token_ids), positions)
        )


def _gemma4_vision_encoder():
    from keras_hub.src.models.gemma4.gemma4_vision_encoder import (
        Gemma4VisionEncoder,
    )

    return Gemma4VisionEncoder(
        image_size=32,
        patch_size=8,
        num_heads=2,
        hidden_dim=32,
        num_layers=1,
        intermediate_dim=64,
        head_dim=16,
        output_dim=128,
        pool_size=2,
    )


def _gemma3n_audio_encoder_config():
    from keras_hub.src.models.gemma3n.gemma3n_audio_encoder import (
        Gemma3nAudioEncoder,
    )

    # Gemma3nBackbone's docstring example, with the encoder's argument names.
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
    ).get_config()


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_text_path_equals_the_backbones_graph(family):
    backbone = _backbone(family)
    token_ids = _token_ids()
    inputs = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    if family == "gemma4":
        inputs["position_ids"] = np.broadcast_to(np.arange(LENGTH), token_ids.shape)
    with torch.inference_mode():
        expected = keras.ops.convert_to_numpy(backbone(inputs, training=False))
    np.testing.assert_allclose(
        _text_forward(backbone, token_ids), expected, atol=1e-5, rtol=1e-5
    )


def test_multimodal_gemma4_serves_text_as_its_causal_lm_decodes_it():
    # Its graph also demands images; `call_with_cache` (what generate() runs
    # on text) does not.
    backbone = _backbone(
        "gemma4", image_size=32, vision_encoder=_gemma4_vision_encoder()
    )
    token_ids = _token_ids()
    with pytest.raises(ValueError, match="Missing data for input"):
        backbone({"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)})
    causal_lm = keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None)
    with torch.inference_mode():
        expected, _ = causal_lm._build_cache(
            token_ids, None, None, np.ones_like(token_ids), None
        )
    np.testing.assert_allclose(
        _text_forward(backbone, token_ids),
        keras.ops.convert_to_numpy(expected),
        atol=1e-5,
        rtol=1e-5,
    )


def test_multimodal_gemma3n_serves_text_as_its_causal_lm_decodes_it():
    backbone = _backbone(
        "gemma3n", audio_encoder_config=_gemma3n_audio_encoder_config()
    )
    token_ids = _token_ids()
    causal_lm = keras_hub.models.Gemma3nCausalLM(backbone=backbone, preprocessor=None)
    with torch.inference_mode():
        expected, _ = causal_lm._build_cache(
            token_ids, *[None] * 7, np.ones_like(token_ids)
        )
    np.testing.assert_allclose(
        _text_forward(backbone, token_ids),
        keras.ops.convert_to_numpy(expected),
        atol=1e-5,
        rtol=1e-5,
    )
