"""The models the benchmark runs, each with the same weights in every system.

- `smollm2`: SmolLM2-135M-Instruct, the KerasHub preset of
  `smollm2.default_preset_dir()` and its Hugging Face export
  (`smollm2.export_hf_llama()`). Prompts are text.
- `qwen3_moe`, `mixtral`: MoE models of realistic shape at a width this
  machine runs, with random weights: a transformers model saved once, loaded
  into a KerasHub preset by keras-hub's own Hugging Face converter, and
  checked to give transformers' logits (`testing/hf_models.py`). Their
  tokenizer is the family's tiny test one, so prompts are token ids, and
  generated ids are not detokenized (the vocabulary is wider).
- `qwen3_5`: the same for Qwen3.5's hybrid Gated DeltaNet layout, bfloat16.

Everything is made once and cached under `~/.cache/vllm-keras-hub/bench`,
keyed by the model's settings.
"""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from vllm_keras_hub.testing import hf_models


@dataclasses.dataclass(frozen=True)
class Model:
    """One benchmarked model.

    Args:
        name: Its `--models` name.
        label: What the tables call it.
        text_prompts: Whether prompts are text (else token ids).
        systems: The systems a full run gives it.
        dtypes: The dtypes a full run gives it.
        hf_config: For a random-weight model: its family in
            `testing/hf_models.py` and its transformers config.
        tensor_parallel_size: vLLM's `tensor_parallel_size` for every
            vLLM system.
        pipeline_parallel_size: vLLM's `pipeline_parallel_size` for every
            vLLM system.
        native_env: Environment of the vLLM-native systems' workers beyond
            the usual (vLLM's native Qwen3.5 needs the torchvision
            stand-in, `hf_models.TORCHVISION_STUB`, on its path).
    """

    name: str
    label: str
    text_prompts: bool
    systems: tuple
    dtypes: tuple
    hf_config: tuple | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    native_env: tuple = ()

    @property
    def ranks(self):
        return self.tensor_parallel_size * self.pipeline_parallel_size


_ALL_SYSTEMS = (
    "keras_hub",
    "keras_hub_eager",
    "native_compiled",
    "native_eager",
    "keras_generate",
    "hf",
)
_MOE_SYSTEMS = ("keras_hub", "native_compiled", "keras_generate")

# Qwen3-30B-A3B's proportions (128 experts, 8 active, expert width 0.375 of
# the hidden size) at hidden 512 with 64 experts, 8 layers.
_QWEN3_MOE = dict(
    hidden_size=512,
    intermediate_size=1536,
    moe_intermediate_size=192,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    num_experts=64,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    vocab_size=32768,
    initializer_range=0.05,
)
# Mixtral-8x7B's proportions (8 experts, 2 active, expert width 3.5x the
# hidden size) at hidden 512, 8 layers.
_MIXTRAL = dict(
    hidden_size=512,
    intermediate_size=1792,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    num_local_experts=8,
    num_experts_per_tok=2,
    vocab_size=32768,
    initializer_range=0.05,
)

# A Llama of SmolLM2-135M's size whose heads split over 2 ranks
# (SmolLM2's 9 do not, in vLLM native either).
_LLAMA_TP = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    vocab_size=32768,
    initializer_range=0.05,
)

# Qwen3.5's layout (3 Gated DeltaNet layers to each full-attention one;
# 128-wide GDN heads, 2 value heads per key head; attention with 4x fewer
# KV heads) at hidden 512, 8 layers. bfloat16: vLLM's CPU GDN kernels, which
# vLLM native needs, take nothing else.
_QWEN3_5 = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    tie_word_embeddings=False,
    vocab_size=32768,
    initializer_range=0.05,
)


MODELS = {
    "smollm2": Model(
        "smollm2", "SmolLM2-135M-Instruct", True, _ALL_SYSTEMS, ("float32", "bfloat16")
    ),
    "qwen3_moe": Model(
        "qwen3_moe",
        "Qwen3-MoE shape (8 layers, 64 experts, 8 active, random weights)",
        False,
        _MOE_SYSTEMS,
        ("float32",),
        ("qwen3_moe", _QWEN3_MOE),
    ),
    "mixtral": Model(
        "mixtral",
        "Mixtral shape (8 layers, 8 experts, 2 active, random weights)",
        False,
        _MOE_SYSTEMS,
        ("float32",),
        ("mixtral", _MIXTRAL),
    ),
    "llama_tp2": Model(
        "llama_tp2",
        "Llama shape (12 layers, hidden 768, random weights), tensor parallel 2",
        False,
        ("keras_hub", "native_compiled"),
        ("float32",),
        ("llama", _LLAMA_TP),
        tensor_parallel_size=2,
    ),
    "qwen3_5": Model(
        "qwen3_5",
        "Qwen3.5 shape (8 layers, 6 Gated DeltaNet, random weights)",
        False,
        ("keras_hub", "native_compiled"),
        ("bfloat16",),
        ("qwen3_5", _QWEN3_5),
        native_env=(("PYTHONPATH", hf_models.TORCHVISION_STUB),),
    ),
    # SmolLM2's 30 layers, 15 a stage.
    "smollm2_pp2": Model(
        "smollm2_pp2",
        "SmolLM2-135M-Instruct, pipeline parallel 2",
        True,
        ("keras_hub", "native_compiled"),
        ("float32",),
        pipeline_parallel_size=2,
    ),
}


def _cache_dir():
    from vllm_keras_hub.cache import default_cache_dir

    return os.path.join(default_cache_dir(), "bench")


def prepare(model, env):
    """The model's KerasHub preset and Hugging Face folder, made once.

    Args:
        model: A `Model`.
        env: The environment of the subprocess that makes them.

    Returns:
        `(preset, hf_folder, source)`: `source` says what they were made
        from (for random models, the largest logit difference against
        transformers).
    """
    if model.hf_config is None:
        return _prepare_smollm2(env)
    return _prepare_random(model, env)


def _prepare_smollm2(env):
    from vllm_keras_hub import smollm2

    # Converting the GGUF imports Keras: in a worker's environment (torch),
    # not this process's.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from vllm_keras_hub import smollm2; smollm2.default_preset_dir()",
        ],
        check=True,
        env=env,
    )
    preset = smollm2.default_preset_dir()
    hf_folder = os.path.join(smollm2.default_cache_dir(), "smollm2-135m-instruct-hf")
    stamp = os.path.join(hf_folder, "bench_source.json")
    source = {"preset": preset, "preset_stamp": smollm2._read_stamp(preset)}
    if _read_json(stamp) == source:
        return preset, hf_folder, source
    tmp = tempfile.mkdtemp(dir=os.path.dirname(hf_folder), prefix=".hf-export-")
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vllm_keras_hub import smollm2; "
            "smollm2.export_hf_llama(sys.argv[1], sys.argv[2])",
            preset,
            tmp,
        ],
        check=True,
        env=env,
    )
    _write_json(os.path.join(tmp, "bench_source.json"), source)
    _replace(tmp, hf_folder)
    return preset, hf_folder, source


# Run in a subprocess: keras-hub's converter, then the logit check.
_MAKE_RANDOM = """
import json, shutil, sys
from vllm_keras_hub.testing import hf_models
from vllm_keras_hub.testing.tokenizers import make_tokenizer

family, config, root = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tokenizer = make_tokenizer(hf_models.TINY_CONFIGS[family][1])
vocabulary_size = config.pop("vocab_size")
hf = hf_models.save_hf_model(family, root + "/hf", vocabulary_size, **config)
preset = hf_models.keras_hub_preset(family, hf, root + "/preset", tokenizer)
difference = hf_models.max_logit_difference(hf, preset, list(range(4, 68)))
# vLLM native loads a tokenizer from the folder; prompts are token ids.
from vllm_keras_hub.export.preset_folder import write_model_folder
write_model_folder(preset, root + "/exported")
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(root + "/exported/" + name, hf)
shutil.rmtree(root + "/exported")
json.dump({"max_logit_difference": difference}, open(root + "/check.json", "w"))
"""


def _prepare_random(model, env):
    family, config = model.hf_config
    key = hashlib.sha256(json.dumps([family, config], sort_keys=True).encode())
    folder = os.path.join(_cache_dir(), f"{model.name}-{key.hexdigest()[:12]}")
    check = _read_json(os.path.join(folder, "check.json"))
    if check is None:
        os.makedirs(_cache_dir(), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=_cache_dir(), prefix=f".{model.name}-")
        subprocess.run(
            [sys.executable, "-c", _MAKE_RANDOM, family, json.dumps(config), tmp],
            check=True,
            env=env,
        )
        _replace(tmp, folder)
        check = _read_json(os.path.join(folder, "check.json"))
    source = {"family": family, "config": config, **check}
    if check["max_logit_difference"] > 1e-3:
        raise RuntimeError(
            f"{model.name}: KerasHub's logits differ from transformers' by "
            f"{check['max_logit_difference']}; the systems would not share weights."
        )
    return os.path.join(folder, "preset"), os.path.join(folder, "hf"), source


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


def _replace(tmp, folder):
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.rename(tmp, folder)
