"""A KerasHub draft must hold the target's token at every id."""

import pytest

from vllm_keras_hub import speculative
from vllm_keras_hub.export.model_folder import ModelFolder
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.tokenizers import permuted_preset


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """The tiny Llama 3 (byte-level BPE) preset, and its model folder."""
    preset = build_tiny_preset("llama3", str(tmp_path_factory.mktemp("target")))
    folder = ModelFolder(preset)
    yield preset, folder
    folder.cleanup()


def _drafting(draft):
    spec = {"model": f"keras_hub:{draft}", "num_speculative_tokens": 2}
    return {"speculative_config": spec}


def test_a_draft_of_the_same_tokens_by_id_is_served(target):
    preset, folder = target
    updates, draft = speculative.settle(folder, _drafting(preset))
    assert updates["speculative_config"]["model"] == draft.path
    draft.cleanup()


def test_a_draft_with_permuted_ids_is_refused_naming_the_first(target, tmp_path):
    """Its `get_vocabulary()` (a `dict_keys`) equals the target's as a set."""
    preset, folder = target
    draft = permuted_preset(preset, str(tmp_path / "draft"), first=300, second=301)
    with pytest.raises(
        speculative.UnsupportedSpeculativeConfigError,
        match=r"another vocabulary .*\(token id 300 is '.+' in the draft and '.+' in the target\)",
    ):
        speculative.settle(folder, _drafting(draft))
