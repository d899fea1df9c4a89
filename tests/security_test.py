"""Security defaults: presets carry no code, and none is ever trusted."""

import json
import pathlib

import keras
import pytest

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.export import preset_folder
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.presets import build_tiny_preset


def test_a_preset_carrying_code_is_refused_and_the_code_never_runs(tmp_path):
    """A preset whose `config.json` is a Lambda layer: Python bytecode that,
    run, would write a file. Refused before anything (the start-up probe
    included) could call it."""
    marker = tmp_path / "ran"
    code = eval(f"lambda x: open({str(marker)!r}, 'w') and x")  # no closure
    config = keras.saving.serialize_keras_object(keras.layers.Lambda(code))
    preset = tmp_path / "preset"
    preset.mkdir()
    (preset / "config.json").write_text(json.dumps(dict(config, registered_name="Lambda")))
    with pytest.raises(preset_folder.PresetError, match="Lambda"):
        KerasHubLLM(f"keras_hub:{preset}")
    assert not marker.exists()


def test_a_preset_naming_a_module_outside_keras_is_refused_unimported(
    tmp_path, monkeypatch
):
    """A preset whose config names a class in any other module: the module,
    though importable, is never imported, and nothing is served."""
    marker = tmp_path / "imported"
    (tmp_path / "planted.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Backbone: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    preset = build_tiny_preset("gpt2", str(tmp_path / "preset"))
    config_path = pathlib.Path(preset) / "config.json"
    config = json.loads(config_path.read_text())
    config.update(module="planted", class_name="Backbone", registered_name="planted>Backbone")
    config_path.write_text(json.dumps(config))
    with pytest.raises(preset_folder.PresetError, match="planted"):
        KerasHubLLM(f"keras_hub:{preset}")
    assert not marker.exists()


def test_keras_deserializes_in_safe_mode_and_we_never_turn_it_off():
    # KerasHub's preset loader deserializes with Keras's defaults, in which
    # a Lambda's bytecode is refused; nothing of ours may turn that off.
    code = keras.layers.Lambda(lambda x: x + 1)
    with pytest.raises(ValueError, match="safe_mode"):
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(code))
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
