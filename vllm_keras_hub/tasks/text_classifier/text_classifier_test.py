"""KerasHub text classifiers served by vLLM's pooling runner.

Tiny random-weight presets (`testing/classifiers.py`): BERT, RoBERTa and
DistilBERT giving logits, XLM-RoBERTa with its own softmax (compiled), BERT
with a sigmoid over independent labels. The oracle is each preset's own `TextClassifier`
(`keras_hub_predictions`): what vLLM returns as `probs` is `predict()`'s
output with the preset's activation, or vLLM's softmax where it has none;
its logits are what `use_activation=False` returns.
"""

import numpy as np
import pytest
from vllm import PoolingParams

from vllm_keras_hub import settings
from vllm_keras_hub import tasks
from vllm_keras_hub.entrypoints.llm import KerasHubLLM
from vllm_keras_hub.tasks.text_classifier.spec import ClassifierError
from vllm_keras_hub.testing.classifiers import SEQUENCE_LENGTH
from vllm_keras_hub.testing.classifiers import TINY_CLASSIFIERS
from vllm_keras_hub.testing.classifiers import build_tiny_classifier
from vllm_keras_hub.testing.classifiers import keras_hub_predictions
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_llm

# 3 to 12 tokens with the start and end tokens in the BERT vocabulary, 5 to 22
# in the XLM-RoBERTa one (measured), all within `SEQUENCE_LENGTH`.
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Which is the red planet? Mars.",
    "mars is red",
]
TOLERANCE = 1e-5

# Served up to the length their preprocessors pack (`SEQUENCE_LENGTH`).
ENGINES = {
    "bert": dict(),
    "xlm_roberta_softmax": dict(enforce_eager=False),
    "bert_sigmoid": dict(),
    "roberta": dict(),
    "distil_bert": dict(),
    "albert": dict(),
    "roformer_v2": dict(),
    "esm": dict(),
}
LONGEST = dict(max_model_len=SEQUENCE_LENGTH)


@pytest.fixture(scope="module", params=sorted(ENGINES))
def name(request):
    return request.param


@pytest.fixture(scope="module")
def preset(name, tmp_path_factory):
    return build_tiny_classifier(name, str(tmp_path_factory.mktemp(name)))


@pytest.fixture(scope="module")
def oracle(preset):
    return keras_hub_predictions(preset, TEXTS)


@pytest.fixture(scope="module")
def logits(preset):
    return keras_hub_predictions(preset, TEXTS, logits=True)[0]


@pytest.fixture(scope="module")
def llm(preset, name):
    with in_process_llm(f"keras_hub:{preset}", **ENGINES[name], **LONGEST) as llm:
        yield llm


def _probs(outputs):
    return np.array([output.outputs.probs for output in outputs])


def _without_activation(name):
    # `predict()` gives logits: vLLM's probs are its softmax over them.
    return "activation" not in TINY_CLASSIFIERS[name][2]


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_classes_are_the_presets_own(llm, oracle, name):
    want, counts = oracle
    outputs = llm.classify(TEXTS, use_tqdm=False)
    # The same tokens as the preset's preprocessor packs, so pooling sees them.
    assert [len(output.prompt_token_ids) for output in outputs] == counts
    if _without_activation(name):  # vLLM's softmax, as for its own classifiers.
        want = _softmax(want)
    got = _probs(outputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    # Every two texts' outputs differ far beyond the tolerance.
    gaps = [np.abs(a - b).max() for i, a in enumerate(want) for b in want[i + 1 :]]
    assert min(gaps) > 10 * TOLERANCE


def test_logits_without_the_activation(llm, logits):
    outputs = llm.classify(
        TEXTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False
    )
    np.testing.assert_allclose(_probs(outputs), logits, atol=TOLERANCE, rtol=0)


def test_each_text_alone_equals_it_in_the_batch(llm, oracle, name):
    want, _ = oracle
    got = _probs(llm.classify([TEXTS[1]], use_tqdm=False))[0]
    if _without_activation(name):
        want = _softmax(want)
    np.testing.assert_allclose(got, want[1], atol=TOLERANCE, rtol=0)


def test_vllm_serves_it_as_a_classifier(llm, oracle):
    config = llm.llm_engine.vllm_config
    assert config.model_config.runner_type == "pooling"
    assert config.model_config.attn_type == "encoder_only"
    assert config.model_config.pooler_config.seq_pooling_type == "CLS"
    # Each text is attended to whole: vLLM schedules it in one step, uncached.
    assert not config.scheduler_config.enable_chunked_prefill
    assert not config.cache_config.enable_prefix_caching
    assert config.model_config.max_model_len == SEQUENCE_LENGTH
    assert "classify" in llm.supported_tasks
    # One label per class of the preset's own output.
    classes = oracle[0].shape[1]
    assert config.model_config.hf_config.id2label == {i: f"LABEL_{i}" for i in range(classes)}


# Start-up refusals: each raises before any engine starts.


def _edited(tmp_path, name, **options):
    import json
    import shutil

    preset = shutil.copytree(
        build_tiny_classifier(name, str(tmp_path / "made")), tmp_path / "edited"
    )
    task = json.loads((preset / "task.json").read_text())
    task["config"].update(options)
    (preset / "task.json").write_text(json.dumps(task))
    return f"keras_hub:{preset}"


def test_an_activation_vllm_cannot_apply_is_refused(tmp_path):
    with pytest.raises(ClassifierError, match="its last activation is 'relu'"):
        KerasHubLLM(_edited(tmp_path, "bert", activation="relu"), **{**TEST_ENGINE_KWARGS, **LONGEST})


def test_texts_longer_than_the_preprocessor_packs_are_refused(tmp_path):
    preset = build_tiny_classifier("bert", str(tmp_path))
    with pytest.raises(tasks.PoolingTaskError, match=f"packs at most {SEQUENCE_LENGTH} tokens"):
        KerasHubLLM(f"keras_hub:{preset}", **{**TEST_ENGINE_KWARGS, "max_model_len": 64})


def test_tensor_parallelism_is_refused(tmp_path):
    preset = build_tiny_classifier("bert", str(tmp_path))
    with pytest.raises(settings.UnsupportedPoolingSettingError, match="BertTextClassifier"):
        KerasHubLLM(
            f"keras_hub:{preset}", tensor_parallel_size=2, **{**TEST_ENGINE_KWARGS, **LONGEST}
        )


@pytest.mark.parametrize(
    "backbone, reason",
    [("DebertaV3Backbone", "disentangled attention"), ("FNetBackbone", "Fourier transform")],
)
def test_classifier_families_not_served_are_refused_with_their_reason(tmp_path, backbone, reason):
    import keras_hub

    from vllm_keras_hub import families
    from vllm_keras_hub.export import model_folder

    shape = dict(vocabulary_size=64, num_layers=1, hidden_dim=32, intermediate_dim=64)
    if backbone == "DebertaV3Backbone":
        shape["num_heads"] = 2
    getattr(keras_hub.models, backbone)(**shape).save_to_preset(str(tmp_path))
    with pytest.raises(families.UnsupportedFamilyError, match=reason):
        model_folder.ModelFolder(str(tmp_path))


def test_an_esm_preset_with_absolute_positions_is_refused_at_start_up(tmp_path):
    """keras-hub's serving positions skip the pad id its absolute positions
    start from; every published ESM-2 preset is rotary."""
    import keras_hub

    from vllm_keras_hub.testing.embedders import encoder_tokenizer

    tokenizer = encoder_tokenizer("esm")
    backbone = keras_hub.models.ESMBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
        hidden_dim=64, intermediate_dim=64, pad_token_id=1,
        position_embedding_type="absolute",
    )  # fmt: skip
    keras_hub.models.ESMProteinClassifier(
        backbone=backbone,
        preprocessor=keras_hub.models.ESMProteinClassifierPreprocessor(
            tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH
        ),
        num_classes=2,
    ).save_to_preset(str(tmp_path))
    with pytest.raises(Exception, match="absolute positions"):
        with in_process_llm(f"keras_hub:{tmp_path}", **LONGEST):
            pass


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_served_classes_equal_vllm_natives(family, tmp_path):
    """vLLM's own `BertForSequenceClassification` and
    `RobertaForSequenceClassification`, on the same random weights."""
    import vllm

    from vllm_keras_hub.testing.classifiers import save_hf_pair
    from vllm_keras_hub.testing.engines import in_process_engine_env

    # Lowercase ASCII: transformers' tokenizers and KerasHub's give the same ids.
    texts = [text.lower() for text in TEXTS]
    folder, preset = save_hf_pair(family, str(tmp_path))
    kwargs = {**TEST_ENGINE_KWARGS, **LONGEST}
    with in_process_engine_env():
        native = vllm.LLM(folder, distributed_executor_backend="uni", **kwargs)
        try:
            want = native.classify(texts, use_tqdm=False)
        finally:
            native.llm_engine.engine_core.shutdown()
            del native
    with in_process_llm(f"keras_hub:{preset}", **LONGEST) as llm:
        got = llm.classify(texts, use_tqdm=False)
    assert [o.prompt_token_ids for o in got] == [o.prompt_token_ids for o in want]
    np.testing.assert_allclose(_probs(got), _probs(want), atol=TOLERANCE, rtol=0)
    # And both are the preset's own: vLLM's softmax over its logits.
    np.testing.assert_allclose(
        _probs(got), _softmax(keras_hub_predictions(preset, texts)[0]), atol=TOLERANCE, rtol=0
    )
    # The transformers folder itself, as `keras_hub:hf://...` reads one:
    # keras-hub's converter would drop its classifier layer.
    with pytest.raises(ClassifierError, match="not its classification head"):
        KerasHubLLM(f"keras_hub:{folder}", **kwargs)


def test_classify_through_the_server(tmp_path):
    """`vllm-keras-hub serve` as a user runs it, `/classify` over HTTP."""
    import httpx

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    preset = build_tiny_classifier("xlm_roberta_softmax", str(tmp_path))
    want, _ = keras_hub_predictions(preset, TEXTS)
    port = free_port()
    command = serve_command(
        preset, "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager",
    )  # fmt: skip
    with running_server(command, port, model_name="tiny") as (base_url, _):

        def classify(texts):
            return httpx.post(
                f"{base_url}/classify", json={"model": "tiny", "input": texts}, timeout=60
            )

        response = classify(TEXTS)
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        np.testing.assert_allclose(
            np.array([item["probs"] for item in data]), want, atol=TOLERANCE, rtol=0
        )
        assert [item["label"] for item in data] == [f"LABEL_{i}" for i in want.argmax(axis=1)]
        # A text over the longest the preprocessor packs: a 400 naming the
        # limit, and the server keeps serving.
        refused = classify(["mars " * SEQUENCE_LENGTH])
        assert refused.status_code == 400
        assert f"maximum context length is {SEQUENCE_LENGTH} tokens" in refused.text
        again = classify(TEXTS[:1])
        np.testing.assert_allclose(again.json()["data"][0]["probs"], want[0], atol=TOLERANCE, rtol=0)
