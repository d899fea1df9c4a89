"""Served embeddings against vLLM's own embedders, on the same random weights.

`save_pair` saves a random transformers model with its sentence-transformers
files (what vLLM native serves), and the preset keras-hub's converter loads
from it (what we serve). vLLM native runs EmbeddingGemma as
`Gemma3TextModel`, Qwen3-Embedding as `Qwen3ForCausalLM` converted to an
embedder, and BERT as `BertModel`, each with the pooling, projections and
normalization its folder names. BERT's folder has transformers' own
tokenizer of the same vocabulary, so the token ids are checked too.

Served as a checkpoint (`keras_hub:<folder>`), each is tokenized by the
folder's own `tokenizer.json`, and embeds as the KerasHub model fed those
ids; BERT's also lowercases and strips accents, which keras-hub's converted
tokenizer does not, and its `max_seq_length` limits texts as in vLLM native.
"""

import os

import numpy as np
import pytest
from tokenizers import Tokenizer
from vllm.exceptions import VLLMValidationError

from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.hf_embedders import BERT_MAX_SEQ_LENGTH
from vllm_keras_hub.testing.hf_embedders import PAIRS
from vllm_keras_hub.testing.hf_embedders import save_pair

TEXTS = ["hi", "mars is red", "the quick brown fox jumps over the lazy dog."]
# Which keras-hub's BERT converter tokenizes as `[UNK] [UNK]`, where the
# checkpoint's own tokenizer strips the accents: `cafe cr ##eme`.
NON_ASCII_TEXTS = ["Café crème ² ≤", "日本  😀"]
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


def _embed(llm, texts=TEXTS):
    outputs = llm.embed(texts, use_tqdm=False)
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


def _checkpoint_ids(folder, texts):
    own = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return [encoding.ids for encoding in own.encode_batch(texts)]


def test_a_sentence_transformers_checkpoint_is_served_with_its_own_tokenizer(pair):
    # What `keras_hub:hf://<embedder>` reads, from a local folder: no
    # task.json, so the embedder and its pooling come from `modules.json`,
    # as `TextEmbedder.from_preset` takes them; the ids are its
    # tokenizer.json's, and the oracle the KerasHub model fed them.
    from vllm_keras_hub.testing.embedders import keras_hub_embeddings

    _, folder, _ = pair
    texts = TEXTS + NON_ASCII_TEXTS
    want_ids = _checkpoint_ids(folder, texts)
    want, _ = keras_hub_embeddings(folder, texts, token_ids=want_ids)
    with in_process_llm(f"keras_hub:{folder}", max_model_len=MAX_MODEL_LEN) as llm:
        ids, got = _embed(llm, texts)
    assert ids == want_ids
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _longest_and_refusal(llm, text):
    """The engine's context length, and its refusal of `text`."""
    limit = f"maximum context length is {BERT_MAX_SEQ_LENGTH} tokens"
    with pytest.raises(VLLMValidationError, match=limit) as refusal:
        llm.embed([text], use_tqdm=False)
    return llm.llm_engine.model_config.max_model_len, type(refusal.value), str(refusal.value)


def test_max_seq_length_limits_texts_as_in_vllm_native(tmp_path_factory):
    """`sentence_bert_config.json` says 32 tokens, of 512 positions."""
    import vllm

    folder, _ = save_pair("bert", str(tmp_path_factory.mktemp("bert_length")))
    text = " ".join(["mars is red"] * BERT_MAX_SEQ_LENGTH)
    settings = {**TEST_ENGINE_KWARGS, "max_model_len": None}
    with in_process_engine_env():
        native = vllm.LLM(folder, distributed_executor_backend="uni", **settings)
        try:
            want = _longest_and_refusal(native, text)
        finally:
            native.llm_engine.engine_core.shutdown()
            del native
    with in_process_llm(f"keras_hub:{folder}", max_model_len=None) as llm:
        got = _longest_and_refusal(llm, text)
    assert want[0] == BERT_MAX_SEQ_LENGTH
    assert got == want
