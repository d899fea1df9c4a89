"""Plain vLLM, with vllm-keras-hub installed, in a user's fresh shell.

Our `vllm.general_plugins` entry point runs in every vLLM process, for every
model. keras-hub 0.32 ships one too, which vLLM may load first: with
`KERAS_BACKEND` unset it imports Keras on TensorFlow (not installed) and
fails half-way. These run vLLM in a subprocess with a user's minimal
environment (no `KERAS_BACKEND`, nothing the test process set), so neither
plugin can break other models, and KerasHub models still serve.
"""

import subprocess
import sys
import textwrap

import pytest
from keras_hub.src.utils.transformers.export.hf_exporter import export_to_safetensors

from vllm_keras_hub.export.sampling import causal_lm_class
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.user_env import user_env


def run_python(code, **variables):
    """Runs `code` with this interpreter in a user's environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=user_env(**variables),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_loading_the_plugins_imports_no_keras_and_keras_hub_then_serves_on_torch():
    result = run_python(
        """
        import sys
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        # Whatever keras-hub's own entry point left behind is gone: a model
        # that is not KerasHub's runs with no Keras at all.
        assert not [m for m in sys.modules if m.split(".")[0] in ("keras", "keras_hub")]
        import vllm_keras_hub.models.causal  # what serving a KerasHub model imports
        import keras
        print("backend", keras.config.backend())
        """
    )
    assert result.returncode == 0, result.stderr
    assert "backend torch" in result.stdout


def test_our_plugin_leaves_keras_alone_whichever_plugin_loads_first():
    """vLLM imports every plugin module before calling any, in the order the
    file system lists them. Ours, imported and called first, must not set
    `KERAS_BACKEND` nor import Keras: keras-hub's would then import Keras on
    torch in every vLLM process, for every model."""
    result = run_python(
        """
        import os, sys
        from vllm_keras_hub.plugin import register

        register()
        assert "KERAS_BACKEND" not in os.environ, os.environ["KERAS_BACKEND"]
        assert not [m for m in sys.modules if m.split(".")[0] in ("keras", "keras_hub")]
        print("untouched")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "untouched" in result.stdout


def test_another_keras_backend_is_refused_only_for_keras_hub_models():
    result = run_python(
        """
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        for name in ("models.causal", "families.gemma4.media"):
            try:
                __import__(f"vllm_keras_hub.{name}")
            except RuntimeError as e:
                print("refused:", e)
        """,
        KERAS_BACKEND="jax",
    )
    assert result.returncode == 0, result.stderr
    refusal = "refused: vllm-keras-hub serves KerasHub models on Keras's torch"
    assert result.stdout.count(refusal) == 2, result.stdout
    assert "KERAS_BACKEND='jax'" in result.stdout


@pytest.fixture(scope="module")
def hugging_face_folder(tmp_path_factory):
    """A tiny Llama in Hugging Face's format, which vLLM serves natively."""
    root = tmp_path_factory.mktemp("hf")
    preset = build_tiny_preset("llama3", str(root / "preset"))
    folder = str(root / "hf")
    export_to_safetensors(causal_lm_class(preset).from_preset(preset), folder)
    return folder


NATIVE_GREEDY = """
    import sys
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if __name__ == "__main__":
        llm = LLM(sys.argv[1], enforce_eager=True, max_model_len=128,
                  kv_cache_memory_bytes=1 << 30, dtype="float32")
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        out = llm.generate(TokensPrompt(prompt_token_ids=[1, 5, 9, 14]), params)
        print("tokens", list(out[0].outputs[0].token_ids))
"""


@pytest.mark.parametrize("keras_backend", [None, "jax"])
def test_plain_vllm_serves_a_hugging_face_model(
    hugging_face_folder, keras_backend, tmp_path
):
    """`vllm.LLM` on a native model, spawned engine processes included."""
    script = tmp_path / "native.py"
    script.write_text(textwrap.dedent(NATIVE_GREEDY))
    variables = {} if keras_backend is None else {"KERAS_BACKEND": keras_backend}
    result = subprocess.run(
        [sys.executable, str(script), hugging_face_folder],
        env=user_env(**variables),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    tokens = [line for line in result.stdout.splitlines() if line.startswith("tokens")]
    assert len(tokens) == 1 and len(eval(tokens[0][len("tokens") :])) == 6


# keras-hub's own plugin registers these for its own serving class and
# tokenizer where tpu-inference is installed (keras-hub-nightly 0.33 too),
# and its open GPU PR would register them everywhere. Here they are
# registered first by hand, as that plugin would.
KERAS_HUB_FIRST = """
    import sys
    from vllm import LLM, ModelRegistry, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.tokenizers.registry import TokenizerRegistry

    if __name__ == "__main__":
        if sys.argv[2] == "keras-hub-first":
            ModelRegistry.register_model(
                "KerasHubForCausalLM",
                "keras_hub.src.vllm.keras_hub_vllm_wrapper:KerasHubVllmModel",
            )
            TokenizerRegistry.register(
                "keras_hub", "keras_hub.src.vllm.tokenizer", "KerasHubTokenizer"
            )
        llm = LLM(sys.argv[1], load_format="keras_hub", enforce_eager=True,
                  max_model_len=128, kv_cache_memory_bytes=1 << 30, dtype="float32")
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
        print("served by", type(runner.worker.model_runner.model).__module__)
        print("former name", ModelRegistry.models["KerasHubForCausalLM"].module_name)
        print("former mode", TokenizerRegistry.tokenizers["keras_hub"][0])
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        out = llm.generate(TokensPrompt(prompt_token_ids=[1, 5, 9, 14]), params)
        print("tokens", list(out[0].outputs[0].token_ids))
"""


def _lines(result):
    """`{"served by": ..., "former name": ..., "former mode": ..., "tokens": ...}`."""
    assert result.returncode == 0, result.stderr[-3000:]
    keys = ("served by", "former name", "former mode", "tokens")
    return {
        key: line[len(key) + 1 :]
        for line in result.stdout.splitlines()
        for key in keys
        if line.startswith(key + " ")
    }


def test_our_names_coexist_with_keras_hubs_own_plugin(tmp_path):
    """Our folders name our own model class and tokenizer mode, so keras-hub's
    registrations, made first, neither take our folders nor are overwritten;
    a folder written under the former names still serves where nothing else
    holds them."""
    import json

    from vllm_keras_hub.export.preset_folder import write_model_folder

    preset = build_tiny_preset("llama3", str(tmp_path / "preset"))
    folder = tmp_path / "folder"
    folder.mkdir()
    write_model_folder(preset, str(folder))
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(KERAS_HUB_FIRST))

    def serve(model_folder, order):
        return _lines(
            subprocess.run(
                [sys.executable, str(script), str(model_folder), order],
                env=user_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"),
                capture_output=True,
                text=True,
                timeout=600,
            )
        )

    first = serve(folder, "keras-hub-first")
    assert first["served by"] == "vllm_keras_hub.models.causal"
    assert first["former name"] == "keras_hub.src.vllm.keras_hub_vllm_wrapper"
    assert first["former mode"] == "keras_hub.src.vllm.tokenizer"

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["KerasHubTorchForCausalLM"]
    config["architectures"] = ["KerasHubForCausalLM"]
    former = tmp_path / "former"
    former.mkdir()
    for path in folder.iterdir():
        (former / path.name).write_bytes(path.read_bytes())
    (former / "config.json").write_text(json.dumps(config))
    alone = serve(former, "ours-alone")
    assert alone["served by"] == "vllm_keras_hub.models.causal"
    assert alone["former name"] == "vllm_keras_hub.models.causal"
    assert alone["former mode"] == "vllm_keras_hub.export.keras_hub_tokenizers"
    assert alone["tokens"] == first["tokens"]
