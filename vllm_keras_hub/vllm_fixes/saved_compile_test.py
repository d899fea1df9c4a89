"""A restarted engine loads the compile vLLM saved, and serves its weights.

Real engines in vLLM's default (compiled, spawned-process) layout, each start
in fresh processes, as a server restart is.
"""

import glob
import os
import shutil

from vllm import SamplingParams

from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.presets import build_tiny_preset

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog."]
MAX_NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


def served_tokens(preset):
    llm = KerasHubLLM(
        f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, "enforce_eager": False}
    )
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.close()
    return [list(output.outputs[0].token_ids) for output in outputs]


def oracle_tokens(preset):
    return [generated for _, generated in keras_hub_greedy(preset, PROMPTS, MAX_NEW_TOKENS)]


def test_a_restart_loads_the_saved_compile_and_serves_the_presets_weights(
    tmp_path, monkeypatch
):
    """The second start loads the first one's compile, not a copy of its weights.

    Between the starts the preset is saved again, same config, new weights.
    The saved compile is keyed by the config only, so the second start loads
    it (the file is not compiled and written again) and must read the weights
    from the model it serves.
    """
    cache_root = tmp_path / "vllm_cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache_root))
    preset = str(tmp_path / "preset")
    build_tiny_preset("llama3", preset, seed=0)
    first = served_tokens(preset)
    assert first == oracle_tokens(preset)
    pattern = str(
        cache_root / "torch_compile_cache" / "torch_aot_compile" / "*" / "rank_*" / "model"
    )
    (saved,) = glob.glob(pattern)
    before = os.stat(saved)

    shutil.rmtree(preset)
    build_tiny_preset("llama3", preset, seed=1)
    second = served_tokens(preset)

    assert glob.glob(pattern) == [saved]
    after = os.stat(saved)
    # vLLM writes the file anew (a new inode) whenever it compiles.
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert second == oracle_tokens(preset)
    assert second != first
