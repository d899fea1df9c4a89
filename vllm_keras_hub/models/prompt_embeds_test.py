"""Prompt embeddings (`--enable-prompt-embeds`) for text presets.

A prompt sent as embeddings is what a user computes with the preset's own
token embedding: for Gemma scaled by sqrt(hidden), as its backbone (and
transformers' and vLLM's Gemma) scales it. The oracle is the preset's own
`generate()` on the same prompt's token ids, and vLLM's native Llama on
the same weights for embeddings that are no token's.
"""

import base64
import io
import math

import keras
import keras_hub
import numpy as np
import pytest
import torch
from vllm import SamplingParams

from vllm_keras_hub import smollm2
from vllm_keras_hub.settings import PromptEmbedsError
from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
from vllm_keras_hub.testing.engines import in_process_engine_env
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.oracle import keras_hub_greedy

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village, there lived",
    "1, 2, 3,",
    "Water boils at a temperature of",
]
MAX_NEW_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
# A budget of 8 tokens a step: the longer prompts are prefilled in chunks,
# embeddings and token ids in the same steps.
CHUNKED = dict(enable_prompt_embeds=True, max_num_batched_tokens=8, enable_chunked_prefill=True)


def embeddings(preset, ids, scale=False):
    """`ids`' rows of the preset's own token embedding, as a user takes them."""
    backbone = keras_hub.models.Backbone.from_preset(preset)
    rows = keras.ops.convert_to_numpy(backbone.token_embedding(np.array([ids], "int32")))[0]
    if scale:
        rows = rows * np.float32(math.sqrt(backbone.hidden_dim))
    return torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))


def _tokens(outputs):
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def smollm2_preset():
    return smollm2.default_preset_dir()


@pytest.fixture(scope="module")
def smollm2_oracle(smollm2_preset):
    return keras_hub_greedy(smollm2_preset, PROMPTS, MAX_NEW_TOKENS)


def test_embeddings_and_token_ids_in_one_chunked_batch(smollm2_preset, smollm2_oracle):
    """SmolLM2: half the prompts as embeddings, half as token ids, one batch."""
    prompts = [
        {"prompt_embeds": embeddings(smollm2_preset, ids)}
        if index % 2 == 0
        else {"prompt_token_ids": ids}
        for index, (ids, _) in enumerate(smollm2_oracle)
    ]
    with in_process_llm(f"keras_hub:{smollm2_preset}", **CHUNKED) as llm:
        got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
        alone = _tokens(llm.generate(prompts[:1], GREEDY, use_tqdm=False))
    assert got == [generated for _, generated in smollm2_oracle]
    assert alone == got[:1]
    # The prompts are chunked: the longest is over the step budget.
    assert max(len(ids) for ids, _ in smollm2_oracle) > CHUNKED["max_num_batched_tokens"]


def test_gemma3_takes_its_scaled_embeddings_compiled(tmp_path):
    """Gemma3 scales its token embedding before its first layer: the scaled
    rows are what it takes, as transformers' and vLLM's Gemma3 take them."""
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset("gemma3", str(tmp_path / "gemma3"))
    oracle = keras_hub_greedy(preset, PROMPTS, MAX_NEW_TOKENS)
    prompts = [{"prompt_embeds": embeddings(preset, ids, scale=True)} for ids, _ in oracle]
    with in_process_llm(f"keras_hub:{preset}", enforce_eager=False, **CHUNKED) as llm:
        got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
        unscaled = _tokens(
            llm.generate(
                [{"prompt_embeds": embeddings(preset, ids)} for ids, _ in oracle],
                GREEDY,
                use_tqdm=False,
            )
        )
    want = [generated for _, generated in oracle]
    assert got == want
    # The test sees the scale: unscaled rows give other tokens.
    assert unscaled != want


def test_other_embeddings_equal_vllm_natives_llama(smollm2_preset, smollm2_oracle, tmp_path):
    """Embeddings that are no token's: the same tokens as vLLM's own Llama."""
    import vllm

    generator = torch.Generator().manual_seed(0)
    prompts = []
    for ids, _ in smollm2_oracle:
        rows = embeddings(smollm2_preset, ids)
        noise = torch.randn(rows.shape, generator=generator) * rows.std()
        prompts.append({"prompt_embeds": rows + 0.5 * noise})
    folder = str(tmp_path / "hf")
    smollm2.export_hf_llama(smollm2_preset, folder)
    settings = {**TEST_ENGINE_KWARGS, **CHUNKED}
    with in_process_engine_env():
        native = vllm.LLM(folder, distributed_executor_backend="uni", **settings)
        try:
            want = _tokens(native.generate(prompts, GREEDY, use_tqdm=False))
        finally:
            native.llm_engine.engine_core.shutdown()
            del native
    with in_process_llm(f"keras_hub:{smollm2_preset}", **CHUNKED) as llm:
        got = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert got == want
    # The noise changed what is generated: the prompts are no token's.
    assert got != [generated for _, generated in smollm2_oracle]


def test_prompt_embeds_through_the_server(smollm2_preset, smollm2_oracle):
    """`vllm-keras-hub serve --enable-prompt-embeds`, the `openai` client."""
    import openai

    from vllm_keras_hub.testing.server import free_port
    from vllm_keras_hub.testing.server import running_server
    from vllm_keras_hub.testing.server import serve_command

    def encoded(tensor):
        buffer = io.BytesIO()
        torch.save(tensor, buffer)
        return base64.b64encode(buffer.getvalue()).decode()

    port = free_port()
    command = serve_command(
        smollm2_preset, "--port", str(port), "--served-model-name", "smol",
        "--dtype", "float32", "--enforce-eager", "--enable-prompt-embeds",
        "--max-model-len", "256",
    )  # fmt: skip
    ids, want = smollm2_oracle[0]
    with running_server(command, port, model_name="smol") as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0)

        def complete(prompt_embeds):
            return client.completions.create(
                model="smol", prompt=None, max_tokens=MAX_NEW_TOKENS, temperature=0,
                extra_body={"prompt_embeds": prompt_embeds, "ignore_eos": True,
                            "return_token_ids": True},
            )  # fmt: skip

        completion = complete(encoded(embeddings(smollm2_preset, ids)))
        assert completion.choices[0].token_ids == want
        # Rows of the wrong width: a 400 naming the hidden size, and the
        # server keeps serving.
        with pytest.raises(openai.BadRequestError, match="hidden_size"):
            complete(encoded(torch.zeros(3, 7)))
        assert complete(encoded(embeddings(smollm2_preset, ids))).choices[0].token_ids == want


# The families whose graphs cut at their first layer's input.
TAKING = (
    "llama", "llama3", "mistral", "mixtral", "qwen", "qwen3", "qwen_moe", "qwen3_moe",
    "smollm3", "phi3", "gemma", "gemma2", "gemma3", "falcon", "gpt_neox", "gpt_oss",
    "qwen3_5",
)  # fmt: skip


@pytest.mark.parametrize("family", TAKING)
def test_the_two_halves_are_the_backbones_graph(family, tmp_path):
    """Each family's tiny backbone, in Keras alone: its embedding half, then
    the rest on those embeddings, equal its whole forward on the token ids."""
    from vllm_keras_hub.models import pipeline
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset(family, str(tmp_path / family))
    backbone = keras_hub.models.Backbone.from_preset(preset)
    token_ids = keras.ops.convert_to_tensor(np.array([[5, 9, 2, 7, 11, 3]], "int32"))
    padding_mask = keras.ops.ones_like(token_ids)
    whole = backbone({"token_ids": token_ids, "padding_mask": padding_mask}, training=False)
    halves = pipeline.stage(backbone, prompt_embeddings=True)
    rest = halves.model([halves.embedding(token_ids), padding_mask], training=False)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(rest), keras.ops.convert_to_numpy(whole))


@pytest.mark.parametrize(
    "family, reason",
    [
        ("gpt2", r"between its token embedding and its first transformer layer"),
        ("bloom", r"runs \['embedding_layernorm'\]"),
        ("gemma4", r"text path is a loop over its layers"),
    ],
)
def test_backbones_that_cannot_take_embeddings_are_refused(family, reason, tmp_path):
    """GPT-2 adds learned positions before its first layer; Gemma4 makes
    per-layer inputs from the token ids."""
    from vllm_keras_hub.entrypoints.llm import KerasHubLLM
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset(family, str(tmp_path / family))
    with in_process_engine_env(), pytest.raises(PromptEmbedsError, match=reason):
        KerasHubLLM(
            f"keras_hub:{preset}",
            distributed_executor_backend="uni",
            enable_prompt_embeds=True,
            **TEST_ENGINE_KWARGS,
        )


def test_settings_it_is_not_proven_with_are_refused_before_the_engine(smollm2_preset):
    from vllm_keras_hub.entrypoints.llm import KerasHubLLM

    with pytest.raises(PromptEmbedsError, match="not with tensor parallelism or LoRA adapters"):
        KerasHubLLM(
            f"keras_hub:{smollm2_preset}",
            enable_prompt_embeds=True,
            tensor_parallel_size=2,
            enable_lora=True,
            **TEST_ENGINE_KWARGS,
        )


def test_pooling_tasks_refuse_prompt_embeddings(tmp_path):
    from vllm_keras_hub import settings
    from vllm_keras_hub.entrypoints.llm import KerasHubLLM
    from vllm_keras_hub.testing.classifiers import SEQUENCE_LENGTH
    from vllm_keras_hub.testing.classifiers import build_tiny_classifier

    preset = build_tiny_classifier("bert", str(tmp_path))
    with pytest.raises(settings.UnsupportedPoolingSettingError, match="prompt embeddings"):
        KerasHubLLM(
            f"keras_hub:{preset}",
            enable_prompt_embeds=True,
            **{**TEST_ENGINE_KWARGS, "max_model_len": SEQUENCE_LENGTH},
        )
