"""Reading a preset's weights variable by variable gives `from_preset`'s."""

import keras
import keras_hub
import numpy as np
import pytest

from vllm_keras_hub.loading.preset_weights import PresetWeights
from vllm_keras_hub.loading.preset_weights import unloaded_backbone
from vllm_keras_hub.testing import hf_models
from vllm_keras_hub.testing.presets import TINY_FAMILIES
from vllm_keras_hub.testing.presets import build_tiny_preset


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("presets")
    built = {}

    def preset(family):
        if family not in built:
            built[family] = build_tiny_preset(family, str(folder / family))
        return built[family]

    return preset


def _loaded(preset, dtype="float32"):
    backbone = unloaded_backbone(preset, dtype)
    weights = PresetWeights(backbone, preset)
    return backbone, weights


def _weights(backbone):
    # Dropout's seed-generator states are random per construction, and
    # not stored: no weights.
    return [v for v in backbone.variables if "seed_generator" not in v.path]


def _assert_same_variables(backbone, expected):
    # Paths of unnamed layers carry a process-wide counter; order is the same.
    pairs = list(zip(_weights(backbone), _weights(expected), strict=True))
    for variable, reference in pairs:
        assert variable.shape == reference.shape, variable.path
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable),
            keras.ops.convert_to_numpy(reference),
            err_msg=variable.path,
        )


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_every_variable_equals_from_presets(presets, family):
    preset = presets(family)
    backbone, weights = _loaded(preset)
    weights.finish()
    _assert_same_variables(
        backbone, keras_hub.models.Backbone.from_preset(preset, dtype="float32")
    )


def test_an_unloaded_backbone_allocates_no_weight(presets):
    backbone = unloaded_backbone(presets("llama3"), "float32")
    assert all(variable._value is None for variable in backbone.variables)
    weights = PresetWeights(backbone, presets("llama3"))
    # A value read before it is loaded would be the random initializer's.
    kernel = backbone.transformer_layers[0]._feedforward_gate_dense._kernel
    with pytest.raises(RuntimeError, match="read before the preset's value"):
        kernel.value
    weights.finish()
    assert kernel.value.shape == tuple(kernel.shape)


def test_released_variables_are_never_read(presets, monkeypatch):
    preset = presets("qwen3_moe")
    backbone, weights = _loaded(preset)
    fetched = []
    get = type(weights._store).get
    monkeypatch.setattr(
        type(weights._store),
        "get",
        lambda store, path: fetched.append(path) or get(store, path),
    )
    released = backbone.transformer_layers[1].variables
    weights.release(released)
    # A vLLM layer reads a weight without Keras keeping it.
    kernel = backbone.transformer_layers[0]._self_attention_layer._query_dense._kernel
    value = weights.read(kernel)
    assert weights.pending(kernel) and tuple(value.shape) == tuple(kernel.shape)
    weights.release([kernel])
    weights.finish()
    assert fetched
    assert not any("transformer_layer_1" in path for path in fetched)
    for variable in released + [kernel]:
        assert variable.value.numel() == 0
    expected = keras_hub.models.Backbone.from_preset(preset, dtype="float32")
    layer = backbone.transformer_layers[0]
    reference = expected.transformer_layers[0]
    for variable, stored in zip(layer.variables, reference.variables):
        if variable is not kernel:
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(variable),
                keras.ops.convert_to_numpy(stored),
            )


def test_sharded_preset(presets, tmp_path):
    preset = presets("llama3")
    sharded = str(tmp_path / "sharded")
    causal_lm = keras_hub.models.CausalLM.from_preset(preset, dtype="float32")
    causal_lm.save_to_preset(sharded, max_shard_size=0.0003)  # about 300 kB
    assert not (tmp_path / "sharded" / "model.weights.h5").exists()
    assert len(list((tmp_path / "sharded").glob("model_*.weights.h5"))) > 1
    backbone, weights = _loaded(sharded)
    weights.finish()
    _assert_same_variables(backbone, causal_lm.backbone)


def test_bfloat16_preset_loads_in_its_dtype(presets, tmp_path):
    causal_lm = keras_hub.models.CausalLM.from_preset(
        presets("gemma2"), dtype="bfloat16"
    )
    causal_lm.save_to_preset(str(tmp_path))
    backbone, weights = _loaded(str(tmp_path), "bfloat16")
    weights.finish()
    assert {v.dtype for v in backbone.variables} == {"bfloat16"}
    _assert_same_variables(backbone, causal_lm.backbone)


def test_hugging_face_checkpoint_through_keras_hubs_converter(tmp_path):
    """A transformers folder is converted by keras-hub; released parts are not kept."""
    folder = hf_models.save_hf_model("llama", str(tmp_path), vocabulary_size=256)
    backbone, weights = _loaded(folder)
    released = backbone.transformer_layers[0].variables
    weights.release(released)
    weights.finish()
    expected = keras_hub.models.Backbone.from_preset(folder, dtype="float32")
    for variable, reference in zip(_weights(backbone), _weights(expected), strict=True):
        if any(variable is r for r in released):
            assert variable.value.numel() == 0
            continue
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable),
            keras.ops.convert_to_numpy(reference),
            err_msg=variable.path,
        )


def test_a_stored_shape_unlike_the_backbones_is_refused(presets, tmp_path):
    """As Keras's `assign` refuses it: here a config edited after saving."""
    import json
    import shutil

    preset = str(tmp_path / "edited")
    shutil.copytree(presets("llama3"), preset)
    with open(f"{preset}/config.json") as f:
        config = json.load(f)
    config["config"]["intermediate_dim"] //= 2
    with open(f"{preset}/config.json", "w") as f:
        json.dump(config, f)
    backbone, weights = _loaded(preset)
    with pytest.raises(ValueError, match="feedforward_gate_dense/kernel with shape"):
        weights.finish()
    weights.close()


def test_a_released_variable_cannot_be_read(presets):
    backbone, weights = _loaded(presets("llama3"))
    kernel = backbone.transformer_layers[0]._feedforward_gate_dense._kernel
    weights.release([kernel])
    with pytest.raises(ValueError, match="was released"):
        weights.read(kernel)
    weights.close()


def test_a_hugging_face_weight_read_before_it_is_converted_raises(tmp_path):
    folder = hf_models.save_hf_model("llama", str(tmp_path), vocabulary_size=256)
    backbone, weights = _loaded(folder)
    kernel = backbone.transformer_layers[0]._feedforward_gate_dense._kernel
    with pytest.raises(RuntimeError, match="read before the preset's value"):
        kernel.value
    assert tuple(weights.read(kernel).shape) == tuple(kernel.shape)
    weights.finish()
    assert kernel.value.shape == tuple(kernel.shape)


@pytest.mark.parametrize("layout", ["one file", "bfloat16", "sharded"])
def test_a_slice_is_read_alone_from_a_one_file_preset(presets, tmp_path, layout, monkeypatch):
    """A vocabulary-parallel rank's rows (of the input table) and columns (of
    an untied output projection, stored `(hidden, vocab)`) equal the stored
    ones; from one `.weights.h5` file they are read without Keras's reader,
    which reads a whole dataset, and from a sharded preset through it."""
    from keras.src.saving.saving_lib import H5IOStore

    preset, dtype = presets("llama3"), "float32"
    if layout != "one file":
        dtype = "bfloat16" if layout == "bfloat16" else dtype
        causal_lm = keras_hub.models.CausalLM.from_preset(preset, dtype=dtype)
        shards = {"max_shard_size": 0.0003} if layout == "sharded" else {}
        causal_lm.save_to_preset(str(tmp_path), **shards)
        preset = str(tmp_path)
    expected = keras_hub.models.Backbone.from_preset(preset, dtype=dtype).token_embedding
    backbone, weights = _loaded(preset, dtype)
    whole_reads = []
    read = H5IOStore.__getitem__
    monkeypatch.setattr(
        H5IOStore, "__getitem__", lambda store, key: whole_reads.append(key) or read(store, key)
    )
    embedding = backbone.token_embedding
    assert not embedding.tie_weights
    pairs = (
        (embedding.embeddings, expected.embeddings, 0),
        (embedding.reverse_embeddings, expected.reverse_embeddings, 1),
    )
    for variable, reference, axis in pairs:
        got = weights.read_slice(variable, 3, 11, axis)
        assert str(got.dtype) == f"torch.{dtype}"
        whole = keras.ops.convert_to_numpy(keras.ops.cast(reference, "float32"))
        np.testing.assert_array_equal(
            got.float().numpy(), whole[3:11] if axis == 0 else whole[:, 3:11]
        )
    assert bool(whole_reads) == (layout == "sharded")
