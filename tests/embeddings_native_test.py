"""Served embeddings against vLLM's own embedders, on the same random weights.

`save_pair` saves a random transformers model with its sentence-transformers
files (what vLLM native serves), and the preset keras-hub's converter loads
from it (what we serve). vLLM native runs EmbeddingGemma as
`Gemma3TextModel`, Qwen3-Embedding as `Qwen3ForCausalLM` converted to an
embedder, and BERT as `BertModel`, each with the pooling, projections and
normalization its folder names. BERT's folder has transformers' own
tokenizer of the same vocabulary, so the token ids are checked too.
"""

import numpy as np
import pytest

from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.hf_embedders import PAIRS
from vllm_keras_hub.testing.hf_embedders import save_pair

TEXTS = ["hi", "mars is red", "the quick brown fox jumps over the lazy dog."]
# EmbeddingGemma and BERT agree within 1e-5 (EmbeddingGemma: 5e-7 measured). KerasHub's own Qwen3 differs from
# transformers' by 2.5e-5 on these weights (measured; vLLM native gives
# transformers' values), and ours equals KerasHub's (`embeddings_test.py`).
TOLERANCE = {"embedding_gemma": 1e-5, "qwen3": 1e-4, "bert": 1e-5}
# Within the 32 tokens the EmbeddingGemma form serves exactly.
MAX_MODEL_LEN = 32


@pytest.fixture(scope="module", params=sorted(PAIRS))
def pair(request, tmp_path_factory):
    folder, preset = save_pair(request.param, str(tmp_path_factory.mktemp(request.param)))
    return request.param, folder, preset


def _embed(llm):
    outputs = llm.embed(TEXTS, use_tqdm=False)
    return [output.prompt_token_ids for output in outputs], np.array(
        [output.outputs.embedding for output in outputs]
    )


def _native(folder):
    import vllm

    with in_process_engine_env():
        llm = vllm.LLM(
            folder,
            distributed_executor_backend="uni",
            **{**TEST_ENGINE_KWARGS, "max_model_len": MAX_MODEL_LEN},
        )
        try:
            return _embed(llm)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm


def test_served_embeddings_equal_vllm_natives(pair):
    name, folder, preset = pair
    native_ids, native = _native(folder)
    with in_process_llm(f"keras_hub:{preset}", max_model_len=MAX_MODEL_LEN) as llm:
        ours_ids, ours = _embed(llm)
    assert ours_ids == native_ids
    np.testing.assert_allclose(ours, native, atol=TOLERANCE[name], rtol=0)


def test_a_sentence_transformers_checkpoint_is_served_as_keras_hub_loads_it(pair):
    # What `keras_hub:hf://<embedder>` reads, from a local folder: no
    # task.json, so the embedder and its pooling come from `modules.json`,
    # as `TextEmbedder.from_preset` takes them.
    from vllm_keras_hub.testing.embedders import keras_hub_embeddings

    _, folder, _ = pair
    want, counts = keras_hub_embeddings(folder, TEXTS)
    with in_process_llm(f"keras_hub:{folder}", max_model_len=MAX_MODEL_LEN) as llm:
        ids, got = _embed(llm)
    assert [len(i) for i in ids] == counts
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
