"""Security defaults: presets carry no code, and none is ever trusted."""

import json
import pathlib

import keras
import pytest

from vllm_keras_hub import preset_folder
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.presets import build_tiny_preset


def lambda_config():
    """A serialized Lambda layer: it carries Python bytecode."""
    return keras.saving.serialize_keras_object(keras.layers.Lambda(lambda x: x + 1))


def test_a_preset_naming_a_code_carrying_layer_is_refused(tmp_path):
    config = dict(lambda_config(), registered_name="Lambda")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(preset_folder.PresetError, match="Lambda"):
        preset_folder.ModelFolder(str(tmp_path))


def test_keras_deserializes_in_safe_mode_and_we_never_turn_it_off():
    # KerasHub's preset loader deserializes with Keras's defaults.
    with pytest.raises(ValueError, match="safe_mode"):
        keras.saving.deserialize_keras_object(lambda_config())
    package = pathlib.Path(__file__).parent
    sources = [p for p in package.rglob("*.py") if not p.name.endswith("_test.py")]
    for source in sources:
        text = source.read_text()
        assert "enable_unsafe_deserialization" not in text, source
        assert "safe_mode=False" not in text, source


def test_no_remote_code_is_ever_trusted(tmp_path):
    preset = build_tiny_preset("gpt2", str(tmp_path))
    with in_process_llm(f"keras_hub:{preset}") as llm:
        assert llm.llm_engine.model_config.trust_remote_code is False
