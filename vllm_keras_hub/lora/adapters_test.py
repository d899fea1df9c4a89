"""KerasHub LoRA adapters chosen per request, through vLLM's own LoRA.

A tiny Llama3 preset and two adapters fine-tuned on it with KerasHub's own
`enable_lora`: one on the default targets (the query and value EinsumDense,
rank 2), one on the query and a Dense layer (`feedforward_gate_dense`, rank
4). The oracle for each row is `generate()` with that row's adapter loaded
by KerasHub's own `load_lora_weights` (its unmerged LoRA forward), or of
the base model.
"""

import json
import math
import os
import re

import keras_hub
import numpy as np
import pytest
import torch
from vllm.lora.request import LoRARequest

from tests.model_test import GREEDY
from tests.model_test import MAX_NEW_TOKENS
from tests.model_test import PROMPTS
from vllm_keras_hub import KerasHubLLM
from vllm_keras_hub.entrypoints.cli_test import ENGINE_STARTED
from vllm_keras_hub.entrypoints.cli_test import run_cli
from vllm_keras_hub.layers.linear import linear
from vllm_keras_hub.layers.linear import lora_linear
from vllm_keras_hub.lora import adapters as lora_adapters
from vllm_keras_hub.lora import merged as lora
from vllm_keras_hub.testing.engines import in_process_llm
from vllm_keras_hub.testing.engines import served_model
from vllm_keras_hub.testing.lora import fine_tune_lora
from vllm_keras_hub.testing.oracle import keras_hub_greedy
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.server import assert_served_greedy
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.server import serve_command

GATE_TARGETS = ["query", "feedforward_gate_dense"]
# The tiny Llama3's query has 4 heads: at rank 4 it is rank 16 in vLLM.
MAX_LORA_RANK = 16
ENGINE = dict(
    enable_lora=True,
    max_loras=2,
    max_lora_rank=MAX_LORA_RANK,
    # Long prompts prefill in chunks beside other rows' decodes.
    max_num_batched_tokens=64,
)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """The base preset and `{name: (adapter file, generate()'s tokens)}`."""
    base = build_tiny_preset("llama3", str(tmp_path_factory.mktemp("base")))
    default, _ = fine_tune_lora(base, str(tmp_path_factory.mktemp("default")))
    gate, _ = fine_tune_lora(
        base,
        str(tmp_path_factory.mktemp("gate")),
        rank=4,
        seed=1,
        target_layer_names=GATE_TARGETS,
    )
    expected = {
        None: keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS),
        "default": keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS, lora_weights=default),
        "gate": keras_hub_greedy(
            base, PROMPTS, MAX_NEW_TOKENS, lora_weights=gate, lora_targets=GATE_TARGETS
        ),
    }
    # Each adapter changes most rows, and the two differ from each other.
    for name in ("default", "gate"):
        changed = sum(a != b for a, b in zip(expected[name], expected[None]))
        assert changed >= len(PROMPTS) - 1, name
    assert expected["default"] != expected["gate"]
    return base, {"default": default, "gate": gate}, expected


@pytest.fixture(scope="module")
def llm(adapters):
    """One in-process engine with LoRA enabled, shared by the offline tests."""
    base = adapters[0]
    with in_process_llm(f"keras_hub:{base}", **ENGINE) as engine:
        yield engine


def _request(adapters, name, ids={"default": 1, "gate": 2}):
    return None if name is None else LoRARequest(name, ids[name], adapters[1][name])


def test_standard_form_is_keras_hubs_delta_for_every_matmul_layout(tmp_path):
    """Dense, head-sharing EinsumDense (Llama's and Gemma's) and attention
    output layouts: `lora_a.T @ lora_b.T` is the kernel's own change, A @ B,
    as the matrix vLLM multiplies by, exactly."""
    seen = set()
    for family in ("llama3", "gemma"):
        preset = build_tiny_preset(family, str(tmp_path / family))
        backbone = keras_hub.models.Backbone.from_preset(preset)
        rng = np.random.default_rng(0)
        for layer in lora.weighted_layers(backbone):
            if lora_linear.servable_plan(layer) is None:
                continue
            variable, permutation, contracted = linear.matmul_weight(layer)
            shape = tuple(variable.shape)
            a = rng.normal(size=shape[:-1] + (3,)).astype("float32")
            b = rng.normal(size=(3, shape[-1])).astype("float32")
            lora_a, lora_b = lora_adapters.standard_lora(layer, 3, a, b)
            delta = torch.as_tensor(a @ b).permute(permutation)
            matrix = delta.reshape(math.prod(delta.shape[:contracted]), -1)
            torch.testing.assert_close(lora_a.t() @ lora_b.t(), matrix, rtol=0, atol=1e-5)
            heads = math.prod(shape) // (math.prod(delta.shape[:contracted]) * shape[-1])
            assert lora_a.shape[0] == 3 * heads
            seen.add((getattr(layer, "equation", "dense"), heads > 1))
    # Query/value share B across heads; the outputs and Dense layers do not.
    assert {"btd,ndh->btnh", "bqm,muh->bquh", "dense"} <= {eq for eq, _ in seen}
    assert {shared for _, shared in seen} == {True, False}


def test_a_changed_converter_converts_again(adapters, tmp_path, monkeypatch):
    """Converted folders are kept per adapter, preset and converter code: a
    stale folder never stands in for what a changed converter writes."""
    base, files, _ = adapters
    source = tmp_path / "converter.py"
    source.write_text("# version 1\n")
    monkeypatch.setattr(
        lora_adapters, "converter_sources", lambda: [lora_adapters.__file__, str(source)]
    )
    cache = str(tmp_path / "cache")
    first = lora_adapters.peft_folder(base, files["default"], MAX_LORA_RANK, cache)
    assert lora_adapters.peft_folder(base, files["default"], MAX_LORA_RANK, cache) == first
    source.write_text("# version 2\n")
    second = lora_adapters.peft_folder(base, files["default"], MAX_LORA_RANK, cache)
    assert second != first
    assert sorted(os.listdir(cache)) == sorted(
        os.path.basename(folder) for folder in (first, second)
    )


def test_one_batch_gives_each_row_its_adapter_or_the_base_model(adapters, llm):
    """Two adapters and the base model, interleaved in one `generate()` call.

    This also proves the CPU punica workaround: without it the base rows
    get the last adapter slot (the "gate" adapter) applied.
    """
    names = [None, "default", "gate"]
    rows = [(name, i) for i in range(len(PROMPTS)) for name in names]
    outputs = llm.generate(
        [PROMPTS[i] for _, i in rows],
        GREEDY,
        lora_request=[_request(adapters, name) for name, _ in rows],
        use_tqdm=False,
    )
    expected = adapters[2]
    for output, (name, i) in zip(outputs, rows, strict=True):
        prompt_ids, generated_ids = expected[name][i]
        assert output.prompt_token_ids == prompt_ids, (name, i)
        assert list(output.outputs[0].token_ids) == generated_ids, (name, i)


def test_adapters_run_on_vllms_lora_layers_with_a_zero_slot(llm):
    model = served_model(llm)
    wrapped = dict(model.lora_layers.items())
    # Every Dense/EinsumDense of both transformer layers (q, k, v, o and the
    # three MLP projections) is wrapped by vLLM's LoRA manager.
    assert len(wrapped) == 14
    assert {type(m).__name__ for m in wrapped.values()} == {"ReplicatedLinearWithLoRA"}
    for module in wrapped.values():
        for stacked in module.lora_a_stacked + module.lora_b_stacked:
            assert stacked.shape[0] == ENGINE["max_loras"] + 1
            assert not stacked[-1].any()
    # vLLM's CPU platform turns torch.compile off whenever LoRA is enabled.
    mode = llm.llm_engine.vllm_config.compilation_config.mode
    assert mode.name == "NONE"


@pytest.fixture(scope="module")
def wrong_adapters(adapters, tmp_path_factory):
    """Adapter files the engine must refuse, and the cause each names."""
    root = tmp_path_factory.mktemp("wrong")
    corrupt = root / "corrupt.lora.h5"
    corrupt.write_bytes(b"not an HDF5 file")
    gemma = build_tiny_preset("gemma", str(root / "gemma"))
    backbone = keras_hub.models.Backbone.from_preset(gemma)
    backbone.enable_lora(2)
    other_base = str(root / "gemma.lora.h5")
    backbone.save_lora_weights(other_base)
    big, _ = fine_tune_lora(adapters[0], str(root / "big"), rank=8, steps=1)
    return [
        (str(corrupt), "is not a KerasHub LoRA adapter"),
        (other_base, "was not saved from this base model"),
        (big, "rank 32 as a standard LoRA .* --max-lora-rank 32"),
    ]


def test_a_wrong_adapter_fails_the_call_and_the_engine_serves_on(
    adapters, llm, wrong_adapters
):
    """The call's base row, queued before the wrong one, is aborted."""
    for number, (path, cause) in enumerate(wrong_adapters, start=10):
        with pytest.raises(lora.LoraAdapterError, match=cause):
            llm.generate(
                PROMPTS[:2],
                GREEDY,
                lora_request=[None, LoRARequest(f"wrong{number}", number, path)],
                use_tqdm=False,
            )
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    outputs = llm.generate(
        PROMPTS[:2], GREEDY, lora_request=_request(adapters, "gate"), use_tqdm=False
    )
    for output, (_, generated_ids) in zip(outputs, adapters[2]["gate"]):
        assert list(output.outputs[0].token_ids) == generated_ids


@pytest.fixture(scope="module")
def converted_default(adapters):
    """`vllm-keras-hub convert-lora` of the default-target adapter."""
    base, files, _ = adapters
    result = run_cli("convert-lora", f"keras_hub:{base}", files["default"])
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_convert_lora_prints_the_peft_folder_plain_vllm_takes(converted_default):
    folder = converted_default.stdout.strip().splitlines()[-1]
    with open(os.path.join(folder, "adapter_config.json")) as f:
        config = json.load(f)
    # Query: 4 heads x rank 2; value: 2 KV heads x rank 2.
    assert sorted(config["rank_pattern"].values()) == [4, 4, 8, 8]
    assert config["r"] == config["lora_alpha"] == 8
    assert config["alpha_pattern"] == config["rank_pattern"]
    assert os.path.isfile(os.path.join(folder, "adapter_model.safetensors"))
    assert "--max-lora-rank 8" in converted_default.stderr


def test_serve_picks_the_adapter_by_the_openai_model_field(adapters, converted_default):
    """One adapter as its `.lora.h5` file, one as its converted folder."""
    base, files, expected = adapters
    default_folder = converted_default.stdout.strip().splitlines()[-1]
    port = free_port()
    model = f"keras_hub:{base}"
    command = serve_command(
        model,
        "--enable-lora",
        "--lora-modules", f"default={default_folder}", f"gate={files['gate']}",
        "--max-lora-rank", str(MAX_LORA_RANK),
        "--max-loras", "2",
        "--port", str(port),
        "--max-model-len", "256",
        "--dtype", "float32",
    )  # fmt: skip
    with running_server(command, port, model_name="gate") as (base_url, _):
        import openai

        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        assert {m.id for m in client.models.list()} == {model, "default", "gate"}
        for name in ("gate", None, "default"):
            assert_served_greedy(
                base_url, name or model, PROMPTS[:3], expected[name][:3], MAX_NEW_TOKENS
            )
        with pytest.raises(openai.NotFoundError, match="absent"):
            client.completions.create(model="absent", prompt="Hi", max_tokens=2)
        # The server serves on after the 404.
        prompt_ids, generated_ids = expected["gate"][0]
        assert_served_greedy(
            base_url, "gate", PROMPTS[:1], [(prompt_ids, generated_ids[:4])], 4
        )


def test_serve_refuses_a_wrong_lora_module_before_the_engine_starts(
    adapters, wrong_adapters
):
    """The rank case: the error says which --max-lora-rank it needs."""
    path, cause = wrong_adapters[2]
    result = run_cli(
        "serve", f"keras_hub:{adapters[0]}", "--enable-lora",
        "--lora-modules", f"wrong={path}", "--max-lora-rank", str(MAX_LORA_RANK),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert re.search(cause, result.stderr), result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def test_serve_names_a_bad_model_before_reading_its_adapters(adapters):
    """The adapter is checked against the preset's layers, so the preset
    comes first: a missing one exits 2 with its own cause."""
    result = run_cli(
        "serve", "keras_hub:/no/such/preset", "--enable-lora",
        "--lora-modules", f"support={adapters[1]['default']}",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Cannot open KerasHub preset '/no/such/preset'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not result.engine_started


def test_fully_sharded_adapters_and_gpt_oss_adapters_are_refused(adapters, tmp_path):
    # Adapters at 2 ranks are served (`parallel_test.py`), but not vLLM's
    # fully sharded ones: a replicated KV projection has no shards.
    with pytest.raises(lora_adapters.UnsupportedLoraError, match="--fully-sharded-loras"):
        KerasHubLLM(
            f"keras_hub:{adapters[0]}",
            enable_lora=True,
            tensor_parallel_size=2,
            fully_sharded_loras=True,
        )
    # KerasHub 0.32's GPT-OSS backbone does not build on the meta device,
    # so none of its adapters could be converted: refused when it loads.
    gpt_oss = build_tiny_preset("gpt_oss", str(tmp_path / "gpt_oss"))
    with pytest.raises(Exception, match="does not build on torch's meta device"):
        with in_process_llm(f"keras_hub:{gpt_oss}", enable_lora=True):
            pass


# Last: an engine of its own, whose shutdown would end the module's.
def test_an_moe_family_gives_each_row_its_adapter(adapters, tmp_path):
    """Qwen3-MoE: two adapters (query and value, rank 2; query, rank 4) and
    the base model in one batch, each row its own model's `generate()`
    tokens. Adapters wrap the attention's matmuls; the experts stay vLLM's
    fused MoE on its CPU kernel, unwrapped."""
    base = build_tiny_preset("qwen3_moe", str(tmp_path / "base"))
    files = {
        "default": fine_tune_lora(base, str(tmp_path / "default"))[0],
        "query": fine_tune_lora(
            base, str(tmp_path / "query"), rank=4, seed=1, target_layer_names=["query"]
        )[0],
    }
    expected = {None: keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS)}
    expected["default"] = keras_hub_greedy(
        base, PROMPTS, MAX_NEW_TOKENS, lora_weights=files["default"]
    )
    expected["query"] = keras_hub_greedy(
        base, PROMPTS, MAX_NEW_TOKENS, lora_weights=files["query"], lora_targets=["query"]
    )
    # Each adapter changes most rows, and the two differ from each other.
    for name in ("default", "query"):
        assert sum(a != b for a, b in zip(expected[name], expected[None])) > len(PROMPTS) // 2
    assert expected["default"] != expected["query"]
    ids = {"default": 1, "query": 2}
    rows = [(name, i) for i in range(len(PROMPTS)) for name in (None, "default", "query")]
    with in_process_llm(f"keras_hub:{base}", **ENGINE) as llm:
        outputs = llm.generate(
            [PROMPTS[i] for _, i in rows],
            GREEDY,
            lora_request=[
                None if name is None else LoRARequest(name, ids[name], files[name])
                for name, _ in rows
            ],
            use_tqdm=False,
        )
        model = served_model(llm)
        wrapped = [
            name for name, module in model.named_modules() if "LoRA" in type(module).__name__
        ]
        experts = [module for module in model.modules() if type(module).__name__ == "MoERunner"]
    for output, (name, i) in zip(outputs, rows, strict=True):
        prompt_ids, generated_ids = expected[name][i]
        assert output.prompt_token_ids == prompt_ids, (name, i)
        assert list(output.outputs[0].token_ids) == generated_ids, (name, i)
    assert wrapped and all(name.startswith("lora_layers.") for name in wrapped)
    assert experts and not any(e.moe_config.is_lora_enabled for e in experts)


# Last: an engine of its own, whose shutdown would end the module's.
def test_gemma4_serves_attention_adapters_and_refuses_its_mlps(tmp_path):
    """Gemma4's decoder block multiplies by its MLP kernels itself, so those
    layers stay Keras's: adapters on its attention give each row its own
    model's `generate()` tokens (before, `--enable-lora` failed at start-up
    on the block's read of a kernel moved to vLLM), and an adapter on an
    MLP layer fails its call with the reason, the engine serving on."""
    from vllm_keras_hub.testing.lora import random_lora

    base = build_tiny_preset("gemma4", str(tmp_path / "base"))
    targets = {"default": None, "attention": ["key", "attention_output"]}
    files = {
        name: random_lora(
            base, str(tmp_path / f"{name}.lora.h5"), seed=seed, target_layer_names=layers
        )
        for seed, (name, layers) in enumerate(targets.items())
    }
    mlp = random_lora(base, str(tmp_path / "mlp.lora.h5"), target_layer_names=["ffw_gating"])
    expected = {None: keras_hub_greedy(base, PROMPTS, MAX_NEW_TOKENS)}
    for name, layers in targets.items():
        expected[name] = keras_hub_greedy(
            base, PROMPTS, MAX_NEW_TOKENS, lora_weights=files[name], lora_targets=layers
        )
        assert sum(a != b for a, b in zip(expected[name], expected[None])) > len(PROMPTS) // 2
    ids = {"default": 1, "attention": 2}
    rows = [(name, i) for i in range(len(PROMPTS)) for name in (None, *targets)]
    with in_process_llm(f"keras_hub:{base}", **ENGINE) as llm:
        outputs = llm.generate(
            [PROMPTS[i] for _, i in rows],
            GREEDY,
            lora_request=[
                None if name is None else LoRARequest(name, ids[name], files[name])
                for name, _ in rows
            ],
            use_tqdm=False,
        )
        with pytest.raises(lora.LoraAdapterError, match="reads the layer's kernel"):
            llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("mlp", 3, mlp))
        again = llm.generate(
            PROMPTS[:1], GREEDY, lora_request=LoRARequest("default", 1, files["default"])
        )
    for output, (name, i) in zip(outputs, rows, strict=True):
        prompt_ids, generated_ids = expected[name][i]
        assert output.prompt_token_ids == prompt_ids, (name, i)
        assert list(output.outputs[0].token_ids) == generated_ids, (name, i)
    assert list(again[0].outputs[0].token_ids) == expected["default"][0][1]
