"""KerasHub text embedders on vLLM's pooling runner, against their own output.

One engine per tiny embedder form (`testing/embedders.py`), each embedding a
batch of texts of different lengths:
- `embedding_gemma`: bidirectional attention (vLLM's encoder-only kernel),
  mean pooling, the backbone's own two projections, Matryoshka dimensions;
- `gemma3_last`: causal, last token; started as plain vLLM on an exported
  folder, with no runner flag, as `vllm serve` would;
- `qwen3_last`: causal, last token (Qwen3's appended `<|im_end|>`), compiled,
  with prefill chunked into 8-token steps;
- `qwen3_mean`: mean pooling, not normalized;
- `bert_mean` and `xlm_roberta_cls`: encoders (vLLM's encoder-only kernel,
  learned positions at vLLM's per-token positions), mean and first-token
  pooling, tokenized by their own KerasHub tokenizers.
The oracle is each preset's own `TextEmbedder` (`keras_hub_embeddings`).
"""

import numpy as np
import pytest
from vllm import PoolingParams
from vllm.exceptions import VLLMValidationError

from vllm_keras_hub import settings
from vllm_keras_hub import tasks
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.export import embedder as embedder_lib
from vllm_keras_hub.testing.embedders import keras_hub_embeddings
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm

# 3 to 30 tokens with the start and end tokens (both vocabularies): within the 32 tokens the
# tiny EmbeddingGemma serves exactly (half its 64-token window).
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Which is the Red Planet? Mars.",
    "Venus is often called Earth's twin",
]
TOLERANCE = 1e-5

ENGINES = {
    "embedding_gemma": dict(max_model_len=32),
    "gemma3_last": dict(),
    "qwen3_last": dict(
        enforce_eager=False, max_num_batched_tokens=8, max_num_seqs=4
    ),
    "qwen3_mean": dict(),
    # Their position tables hold 64 positions.
    "bert_mean": dict(max_model_len=64),
    "xlm_roberta_cls": dict(max_model_len=64),
}
BIDIRECTIONAL = ("embedding_gemma", "bert_mean", "xlm_roberta_cls")


@pytest.fixture(scope="module", params=sorted(ENGINES))
def name(request):
    return request.param


@pytest.fixture(scope="module")
def preset(shared, name):
    return shared.embedder(name)


@pytest.fixture(scope="module")
def oracle(preset):
    return keras_hub_embeddings(preset, TEXTS)


@pytest.fixture(scope="module")
def llm(preset, name, tmp_path_factory):
    if name == "gemma3_last":
        yield from _plain_vllm(preset, tmp_path_factory.mktemp("folder"))
        return
    with in_process_llm(f"keras_hub:{preset}", **ENGINES[name]) as llm:
        yield llm


def _plain_vllm(preset, folder):
    """Plain `vllm.LLM` on an exported folder, flags as `export` prints them."""
    import vllm

    from vllm_keras_hub.export.preset_folder import write_model_folder

    assert write_model_folder(preset, str(folder)) == "auto"
    with in_process_engine_env():
        llm = vllm.LLM(
            str(folder),
            load_format="keras_hub",
            distributed_executor_backend="uni",
            **TEST_ENGINE_KWARGS,
        )
        try:
            yield llm
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm


def _embeddings(outputs):
    return np.array([output.outputs.embedding for output in outputs])


def test_embeddings_equal_the_presets_own(llm, oracle):
    want, counts = oracle
    outputs = llm.embed(TEXTS, use_tqdm=False)
    # The same tokens as the preset's preprocessor packs, so pooling sees them.
    assert [len(output.prompt_token_ids) for output in outputs] == counts
    got = _embeddings(outputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


def test_each_text_alone_equals_it_in_the_batch(llm, oracle):
    want, _ = oracle
    got = _embeddings(llm.embed([TEXTS[2]], use_tqdm=False))
    np.testing.assert_allclose(got[0], want[2], atol=TOLERANCE, rtol=0)


def test_matryoshka_dimensions_truncate_then_normalize(llm, oracle, name):
    want, _ = oracle
    if name in ("gemma3_last", "bert_mean", "xlm_roberta_cls"):
        # No Matryoshka training: Gemma3TextEmbedder on a causal backbone, encoders.
        with pytest.raises(VLLMValidationError, match="does not support Matryoshka"):
            llm.embed(TEXTS[:1], pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
        return
    size = 128 if name == "embedding_gemma" else 32
    outputs = llm.embed(TEXTS, pooling_params=PoolingParams(dimensions=size), use_tqdm=False)
    truncated = want[:, :size]
    if name != "qwen3_mean":  # The one that does not normalize.
        truncated = truncated / np.linalg.norm(truncated, axis=1, keepdims=True)
    np.testing.assert_allclose(_embeddings(outputs), truncated, atol=TOLERANCE, rtol=0)


def test_vllm_schedules_as_the_pooling_allows(llm, name):
    config = llm.llm_engine.vllm_config
    bidirectional = name in BIDIRECTIONAL
    assert (config.model_config.attn_type == "encoder_only") == bidirectional
    # Mean pooling and bidirectional attention need each text whole; the
    # last token's state does not (qwen3_last's 8-token steps).
    assert config.scheduler_config.enable_chunked_prefill == name.endswith("_last")


# Start-up refusals: each raises before any engine starts.


def test_a_text_longer_than_the_exact_bidirectional_window_is_refused(shared):
    preset = shared.embedder("embedding_gemma")
    with pytest.raises(tasks.PoolingTaskError, match="at most 32 tokens"):
        KerasHubLLM(f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, "max_model_len": 64})


def test_tensor_parallelism_is_refused(shared):
    preset = shared.embedder("qwen3_last")
    with pytest.raises(settings.UnsupportedPoolingSettingError, match="tensor"):
        KerasHubLLM(f"keras_hub:{preset}", tensor_parallel_size=2, **TEST_ENGINE_KWARGS)


# Setting -> (value, what the refusal names). Each is proven on one worker,
# without adapters or drafts, only.
UNPROVEN = {
    "pipeline": ("pipeline_parallel_size", 2, "pipeline parallelism"),
    "lora": ("enable_lora", True, "LoRA adapters per request"),
    "draft": (
        "speculative_config",
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
        "speculative decoding",
    ),
}


@pytest.mark.parametrize("case", sorted(UNPROVEN))
def test_an_unproven_engine_setting_is_refused(shared, case):
    name, value, what = UNPROVEN[case]
    preset = shared.embedder("qwen3_last")
    with pytest.raises(
        settings.UnsupportedPoolingSettingError, match=f"served without {what} \\({name}="
    ):
        KerasHubLLM(f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, name: value})


def test_an_encoder_preset_that_is_no_embedder_is_refused(shared, tmp_path):
    import keras_hub

    embedder = shared.embedder("bert_mean")
    keras_hub.models.Backbone.from_preset(embedder).save_to_preset(str(tmp_path / "bert"))
    keras_hub.tokenizers.Tokenizer.from_preset(embedder).save_to_preset(str(tmp_path / "bert"))
    with pytest.raises(tasks.PoolingTaskError, match="served only as one of these: "):
        KerasHubLLM(f"keras_hub:{tmp_path / 'bert'}", **TEST_ENGINE_KWARGS)


def test_max_pooling_is_refused_with_its_reason(shared, tmp_path):
    import json
    import shutil

    preset = shutil.copytree(shared.embedder("bert_mean"), tmp_path / "bert")
    task = json.loads((preset / "task.json").read_text())
    task["config"]["pooling_mode"] = "max"
    (preset / "task.json").write_text(json.dumps(task))
    with pytest.raises(embedder_lib.EmbedderError, match="pooling_mode='max' has no vLLM"):
        KerasHubLLM(f"keras_hub:{preset}", **TEST_ENGINE_KWARGS)


def test_a_pooler_config_with_another_pooling_is_refused(shared):
    from vllm.config import PoolerConfig

    preset = shared.embedder("qwen3_last")
    # The preset pools its last token; vLLM would schedule as for MEAN.
    with pytest.raises(Exception, match="pools with LAST as its Qwen3TextEmbedder"):
        with in_process_llm(
            f"keras_hub:{preset}", pooler_config=PoolerConfig(seq_pooling_type="MEAN")
        ):
            pass
