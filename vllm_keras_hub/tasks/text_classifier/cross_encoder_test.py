"""KerasHub cross-encoders: one-output classifiers scoring text pairs.

vLLM scores a pair (`LLM.score`, `/v1/score`, `/v1/rerank`) with a sigmoid
over the classifier's one logit. Tiny random-weight presets
(`testing/classifiers.py`): BERT giving its logit (compiled), whose pairs
are in two segments, and XLM-RoBERTa with its own sigmoid, whose pairs
are one. The oracle is each preset's own `TextClassifier` on the pairs its
preprocessor packs (`keras_hub_predictions(..., seconds=...)`).
"""

import numpy as np
import pytest
from vllm import PoolingParams

from vllm_keras_hub.testing.classifiers import SEQUENCE_LENGTH
from vllm_keras_hub.testing.classifiers import build_tiny_classifier
from vllm_keras_hub.testing.classifiers import keras_hub_predictions
from vllm_keras_hub.testing.classifiers import packed_pairs
from vllm_keras_hub.testing.engines import in_process_llm

# Pairs of 7 to 24 tokens in the BERT vocabulary, their texts 1 to 10 tokens
# long, within `SEQUENCE_LENGTH`.
QUERIES = [
    "Which is the red planet?",
    "Hi",
    "what is red",
    "The quick brown fox jumps over the lazy dog.",
]
DOCUMENTS = ["Mars.", "The quick brown fox jumps over the lazy dog.", "mars is red", "Hi"]
TOLERANCE = 1e-5

ENGINES = {
    "bert_cross_encoder": dict(enforce_eager=False),
    "xlm_roberta_cross_encoder": dict(),
}
LONGEST = dict(max_model_len=SEQUENCE_LENGTH)


@pytest.fixture(scope="module", params=sorted(ENGINES))
def name(request):
    return request.param


@pytest.fixture(scope="module")
def preset(name, tmp_path_factory):
    return build_tiny_classifier(name, str(tmp_path_factory.mktemp(name)))


@pytest.fixture(scope="module")
def llm(preset, name):
    with in_process_llm(f"keras_hub:{preset}", **ENGINES[name], **LONGEST) as llm:
        yield llm


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _scores(preset, queries, documents, name, logits=False):
    """The preset's own scores: vLLM's sigmoid over BERT's logit, XLM-R's own."""
    want = keras_hub_predictions(preset, queries, logits=logits, seconds=documents)[0][:, 0]
    return _sigmoid(want) if name == "bert_cross_encoder" and not logits else want


def test_scores_are_the_presets_own(llm, preset, name):
    outputs = llm.score(QUERIES, DOCUMENTS, use_tqdm=False)
    # Each pair packed as the preset's preprocessor packs it.
    tokens, _ = packed_pairs(preset, QUERIES, DOCUMENTS)
    assert [output.prompt_token_ids for output in outputs] == tokens
    want = _scores(preset, QUERIES, DOCUMENTS, name)
    got = np.array([output.outputs.score for output in outputs])
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    gaps = [abs(a - b) for i, a in enumerate(want) for b in want[i + 1 :]]
    assert min(gaps) > 10 * TOLERANCE


def test_one_query_against_each_document(llm, preset, name):
    outputs = llm.score(QUERIES[0], DOCUMENTS, use_tqdm=False)
    want = _scores(preset, [QUERIES[0]] * len(DOCUMENTS), DOCUMENTS, name)
    np.testing.assert_allclose([o.outputs.score for o in outputs], want, atol=TOLERANCE, rtol=0)


def test_logit_without_the_activation(llm, preset, name):
    outputs = llm.score(
        QUERIES, DOCUMENTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False
    )
    want = _scores(preset, QUERIES, DOCUMENTS, name, logits=True)
    np.testing.assert_allclose([o.outputs.score for o in outputs], want, atol=TOLERANCE, rtol=0)


def test_each_pairs_segments_are_the_preprocessors(llm, preset, name):
    tokenizer = llm.get_tokenizer()
    _, segments = packed_pairs(preset, QUERIES, DOCUMENTS)
    packed = [tokenizer(q, text_pair=d) for q, d in zip(QUERIES, DOCUMENTS)]
    if name == "xlm_roberta_cross_encoder":
        # XLM-RoBERTa takes no segment ids: vLLM is given none.
        assert segments is None
        assert all("token_type_ids" not in encoding for encoding in packed)
        return
    assert [encoding["token_type_ids"] for encoding in packed] == segments
    assert all(0 in ids and 1 in ids for ids in segments)
    # The scores see them: with every token in segment 0 they would differ.
    lost = _sigmoid(
        keras_hub_predictions(preset, QUERIES, seconds=DOCUMENTS, one_segment=True)[0][:, 0]
    )
    assert np.abs(lost - _scores(preset, QUERIES, DOCUMENTS, name)).min() > 10 * TOLERANCE


def test_vllm_serves_it_as_a_cross_encoder(llm, name):
    model_config = llm.llm_engine.vllm_config.model_config
    # What turns on vLLM's scoring of pairs: a classifier of one label.
    assert "classify" in llm.supported_tasks
    assert model_config.score_type == "cross-encoder"
    assert model_config.hf_config.num_labels == 1
    assert model_config.use_sep_token
    # The activation: vLLM's default sigmoid, or the preset's own.
    want = {"bert_cross_encoder": None, "xlm_roberta_cross_encoder": "multi_label_classification"}
    assert getattr(model_config.hf_config, "problem_type", None) == want[name]


def test_scores_equal_vllm_natives_bert(tmp_path):
    """vLLM's own `BertForSequenceClassification` of one label, on the same
    random weights: its pairs' token and token type ids are transformers'."""
    import vllm

    from vllm_keras_hub.testing.classifiers import save_bert_pair
    from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
    from vllm_keras_hub.testing.engines import in_process_engine_env

    # Lowercase ASCII: transformers' tokenizer and KerasHub's give the same ids.
    queries = [text.lower() for text in QUERIES]
    documents = [text.lower() for text in DOCUMENTS]
    folder, preset = save_bert_pair(str(tmp_path), num_classes=1)
    with in_process_engine_env():
        native = vllm.LLM(folder, distributed_executor_backend="uni", **{**TEST_ENGINE_KWARGS, **LONGEST})
        try:
            want = native.score(queries, documents, use_tqdm=False)
            segments = [native.get_tokenizer()(q, d)["token_type_ids"] for q, d in zip(queries, documents)]
        finally:
            native.llm_engine.engine_core.shutdown()
            del native
    with in_process_llm(f"keras_hub:{preset}", **LONGEST) as llm:
        got = llm.score(queries, documents, use_tqdm=False)
        tokenizer = llm.get_tokenizer()
        assert [tokenizer(q, text_pair=d)["token_type_ids"] for q, d in zip(queries, documents)] == segments
    assert [o.prompt_token_ids for o in got] == [o.prompt_token_ids for o in want]
    got = np.array([o.outputs.score for o in got])
    np.testing.assert_allclose(got, [o.outputs.score for o in want], atol=TOLERANCE, rtol=0)
    # And both are the preset's own.
    np.testing.assert_allclose(got, _scores(preset, queries, documents, "bert_cross_encoder"), atol=TOLERANCE, rtol=0)


def test_score_and_rerank_through_the_server(tmp_path):
    """`vllm-keras-hub serve` of the BERT cross-encoder, `/v1/score` and `/v1/rerank`."""
    import httpx

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    name = "bert_cross_encoder"
    preset = build_tiny_classifier(name, str(tmp_path))
    want = _scores(preset, [QUERIES[0]] * len(DOCUMENTS), DOCUMENTS, name)
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    with running_server(command, port, model_name="tiny") as (base_url, _):

        def post(path, **body):
            return httpx.post(f"{base_url}{path}", json={"model": "tiny", **body}, timeout=60)

        scored = post("/v1/score", queries=QUERIES[0], documents=DOCUMENTS)
        assert scored.status_code == 200, scored.text
        got = [item["score"] for item in sorted(scored.json()["data"], key=lambda i: i["index"])]
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)

        ranked = post("/v1/rerank", query=QUERIES[0], documents=DOCUMENTS, top_n=2)
        assert ranked.status_code == 200, ranked.text
        results = ranked.json()["results"]
        assert [r["index"] for r in results] == list(np.argsort(-want)[:2])
        np.testing.assert_allclose(
            [r["relevance_score"] for r in results], np.sort(want)[::-1][:2], atol=TOLERANCE, rtol=0
        )

        # Cut to 12 tokens on request: as the preprocessor cuts a pair to its
        # length, a token of each text in turn.
        cut = post("/v1/score", queries=QUERIES[3], documents=DOCUMENTS[1], truncate_prompt_tokens=12)
        assert cut.status_code == 200, cut.text
        assert cut.json()["usage"]["prompt_tokens"] == 12
        want_cut = _cut_score(preset, QUERIES[3], DOCUMENTS[1], 12)
        np.testing.assert_allclose(cut.json()["data"][0]["score"], want_cut, atol=TOLERANCE, rtol=0)

        # A pair over the longest the preprocessor packs: a 400 naming the
        # limit, and the server keeps serving.
        refused = post("/v1/score", queries="mars " * SEQUENCE_LENGTH, documents="Hi")
        assert refused.status_code == 400
        assert f"maximum context length is {SEQUENCE_LENGTH} tokens" in refused.text
        # vLLM cuts a document by character offsets, which KerasHub
        # tokenizers do not give: a 400 naming them.
        offsets = post("/v1/score", queries=QUERIES[0], documents=DOCUMENTS[1], max_tokens_per_doc=3)
        assert offsets.status_code == 400
        assert "return_offsets_mapping" in offsets.text
        again = post("/v1/score", queries=QUERIES[0], documents=DOCUMENTS[0])
        np.testing.assert_allclose(again.json()["data"][0]["score"], want[0], atol=TOLERANCE, rtol=0)


def _cut_score(preset, query, document, length):
    import keras
    import keras_hub

    classifier = keras_hub.models.TextClassifier.from_preset(preset)
    classifier.preprocessor.sequence_length = length
    inputs = classifier.preprocessor(x=([query], [document]))
    return float(_sigmoid(keras.ops.convert_to_numpy(classifier(inputs, training=False))[0, 0]))
