import keras
import keras_hub
import numpy as np
import pytest
import torch

from vllm_keras_hub.models.text_forward import text_forward
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import backbone_kwargs

LENGTH = 12


def _backbone(family, multimodal=False):
    keras.utils.set_random_seed(0)
    backbone_cls = getattr(keras_hub.models, TINY_FAMILIES[family][1])
    return backbone_cls(**backbone_kwargs(family, 64, multimodal))


def _token_ids():
    return np.random.default_rng(0).integers(1, 64, (2, LENGTH))


def _text_forward(backbone, token_ids):
    positions = np.broadcast_to(np.arange(LENGTH), token_ids.shape)
    with torch.inference_mode():
        return keras.ops.convert_to_numpy(
            text_forward(backbone, token_ids, np.ones_like(token_ids), positions)
        )


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
    backbone = _backbone("gemma4", multimodal=True)
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
    backbone = _backbone("gemma3n", multimodal=True)
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
