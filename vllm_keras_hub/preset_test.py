"""`Preset`: writing a model folder, and serving it, read each of the
preset's files once."""

import builtins
import collections
import os
import pickle

import pytest

from vllm_keras_hub import preset as preset_lib
from vllm_keras_hub.export.preset_folder import write_model_folder
from vllm_keras_hub.preset import Preset
from vllm_keras_hub.preset import served
from vllm_keras_hub.testing.engines import in_process_llm


def _count_opens(monkeypatch, preset):
    """Counts, by file, what Python opens under the preset's folder."""
    root = os.path.realpath(preset)
    opened = collections.Counter()
    real_open = builtins.open

    def counting(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)):
            path = os.path.realpath(file)
            if path.startswith(root + os.sep):
                opened[os.path.relpath(path, root)] += 1
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return opened


@pytest.mark.parametrize("kind", ["llama3", "gemma4 images, audio and video"])
def test_writing_a_folder_reads_each_file_once(shared, tmp_path, monkeypatch, kind):
    if kind == "llama3":  # Saved with its preprocessor and task, as published.
        preset = shared.preset("llama3")
    else:
        preset = shared.vision_preset("gemma4")
    opened = _count_opens(monkeypatch, preset)
    write_model_folder(preset, str(tmp_path))
    assert {"config.json", "task.json", "tokenizer.json"} <= set(opened), opened
    if kind != "llama3":
        media = {"image_converter.json", "audio_converter.json", "video_converter.json"}
        assert media <= set(opened), opened
    assert max(opened.values()) == 1, opened


def test_a_start_reads_each_file_once_to_export_and_once_to_serve(shared, monkeypatch):
    """The folder is written in this process, and with an in-process engine
    the model is loaded here too: two readers, each reading a file once."""
    preset = shared.preset("llama3")
    preset_lib._served.cache_clear()
    opened = _count_opens(monkeypatch, preset)
    with in_process_llm(f"keras_hub:{preset}") as llm:
        assert llm.generate("The")[0].outputs[0].token_ids
    assert opened["config.json"] == 2, opened  # The export's and the model's.
    assert opened["task.json"] == 2, opened  # The export's and the logit cap's.
    assert max(opened.values()) <= 2, opened
    assert served(preset) is served(Preset(preset))


def test_the_media_processors_share_the_models_preset(shared, monkeypatch):
    from vllm_keras_hub.models import audio
    from vllm_keras_hub.models import multimodal
    from vllm_keras_hub.models import video

    preset = shared.vision_preset("gemma4")
    preset_lib._served.cache_clear()
    opened = _count_opens(monkeypatch, preset)
    readers = (multimodal.image_converter, audio.audio_converter, video.video_converter)
    converters = [reader(preset) for reader in readers]
    assert None not in converters
    assert [reader(Preset(preset)) for reader in readers] == converters  # The same ones.
    media = ["image_converter.json", "audio_converter.json", "video_converter.json"]
    assert [opened[name] for name in media] == [1, 1, 1], opened
    # A folder saved over: its converters are read afresh with it.
    config = os.path.join(preset, "config.json")
    os.utime(config, ns=(os.stat(config).st_atime_ns, os.stat(config).st_mtime_ns + 10**9))
    assert all(reader(preset) is not old for reader, old in zip(readers, converters))


def test_a_preset_is_its_reference(shared):
    preset = Preset(shared.preset("llama3"))
    assert preset == shared.preset("llama3") and f"{preset}" == preset.reference
    assert preset.config["class_name"] == "Llama3Backbone"
    copy = pickle.loads(pickle.dumps(preset))
    assert copy == preset and copy.__dict__.get("loader") is None


def test_a_folder_saved_over_is_served_afresh(shared, tmp_path):
    import shutil

    preset = str(tmp_path / "preset")
    shutil.copytree(shared.preset("llama3"), preset)
    first = served(preset)
    assert served(Preset(preset)) is first
    config = os.path.join(preset, "config.json")
    stat = os.stat(config)
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert served(preset) is not first
