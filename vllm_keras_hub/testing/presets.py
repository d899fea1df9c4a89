"""Tiny random-weight presets of every routed family, for tests.

Each preset is a real KerasHub `CausalLM` (backbone, preprocessor, tokenizer)
saved with `save_to_preset`: 2 layers, grouped-query attention where the family
has it, head size 32 (the smallest vLLM's CPU kernel takes), and sliding
windows and soft caps, where the family has them, small enough that test
prompts exceed them.
"""

import os

import keras
import keras_hub
import numpy as np

from vllm_keras_hub.layers.attention import attention
from vllm_keras_hub.layers.moe import moe_routes
from vllm_keras_hub.layers.state import state_routes
from vllm_keras_hub.testing.media_encoders import IMAGES
from vllm_keras_hub.testing.media_encoders import MULTIMODAL
from vllm_keras_hub.testing.tokenizers import make_tokenizer

WINDOW = 8
_COMMON = dict(num_layers=2, hidden_dim=128, intermediate_dim=256)
_GQA = dict(num_query_heads=4, num_key_value_heads=2)

# family -> (CausalLM class, Backbone class, backbone kwargs beyond the vocab)
TINY_FAMILIES = {
    "gpt2": ("GPT2CausalLM", "GPT2Backbone", dict(num_heads=4, max_sequence_length=256)),
    "opt": ("OPTCausalLM", "OPTBackbone", dict(num_heads=4, max_sequence_length=256)),
    "llama": ("LlamaCausalLM", "LlamaBackbone", dict(**_GQA, layer_norm_epsilon=1e-5)),
    "llama3": (
        "Llama3CausalLM",
        "Llama3Backbone",
        dict(
            **_GQA,
            rope_max_wavelength=500000,
            rope_position_scaling_factor=8.0,
            rope_frequency_adjustment_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_pretraining_sequence_length=64,
        ),
    ),
    "mistral": ("MistralCausalLM", "MistralBackbone", dict(**_GQA, sliding_window=WINDOW)),
    "mixtral": (
        "MixtralCausalLM",
        "MixtralBackbone",
        dict(**_GQA, num_experts=4, top_k=2, sliding_window=WINDOW),
    ),
    "qwen": (
        "QwenCausalLM",
        "QwenBackbone",
        dict(**_GQA, use_sliding_window_attention=True, sliding_window_size=WINDOW),
    ),
    "qwen3": (
        "Qwen3CausalLM",
        "Qwen3Backbone",
        dict(**_GQA, head_dim=32, sliding_window_size=WINDOW),
    ),
    "qwen_moe": (
        "QwenMoeCausalLM",
        "QwenMoeBackbone",
        dict(
            **_GQA,
            moe_intermediate_dim=64,
            shared_expert_intermediate_dim=128,
            num_experts=4,
            top_k=2,
            use_sliding_window_attention=True,
            sliding_window_size=WINDOW,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeCausalLM",
        "Qwen3MoeBackbone",
        dict(
            **_GQA,
            head_dim=32,
            moe_intermediate_dim=64,
            num_experts=4,
            top_k=2,
            sliding_window_size=WINDOW,
        ),
    ),
    "smollm3": (
        "SmolLM3CausalLM",
        "SmolLM3Backbone",
        dict(
            num_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=False,
            attention_dropout=0.0,
            # SmolLM3's NoPE layers: every 4th one.
            rope_layer_enabled_list=[True, True, True, False],
            layer_types=["full_attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=256,
            rope_theta=5000.0,
            partial_rotary_factor=1.0,
        ),
    ),
    "phi3": ("Phi3CausalLM", "Phi3Backbone", dict(**_GQA, max_sequence_length=256)),
    # LongRoPE ("su"): uneven short factors, and a context longer than the
    # pretraining one so cos/sin are scaled; test prompts stay within the
    # pretraining length, where generate() always uses the short factors.
    "phi3_su": (
        "Phi3CausalLM",
        "Phi3Backbone",
        dict(
            **_GQA,
            max_sequence_length=1024,
            pretraining_sequence_length=128,
            rope_scaling_type="su",
            rope_scaling_short_factor=[1.0 + i / 4 for i in range(16)],
            rope_scaling_long_factor=[2.0 + i for i in range(16)],
        ),
    ),
    "gemma": (
        "GemmaCausalLM",
        "GemmaBackbone",
        dict(num_query_heads=4, num_key_value_heads=1, head_dim=32),
    ),
    "gemma2": (
        "GemmaCausalLM",
        "GemmaBackbone",
        dict(
            **_GQA,
            head_dim=32,
            query_head_dim_normalize=False,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=50.0,
            final_logit_soft_cap=30.0,
            use_sliding_window_attention=True,
            sliding_window_size=WINDOW,
        ),
    ),
    "gemma3": (
        "Gemma3CausalLM",
        "Gemma3Backbone",
        dict(
            **_GQA,
            head_dim=32,
            image_size=None,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            use_sliding_window_attention=True,
            sliding_window_size=WINDOW,
            global_rope_scaling_factor=8.0,
        ),
    ),
    # ALiBi; 6 heads, not a power of 2, so the slopes interleave two
    # geometric sequences.
    "bloom": (
        "BloomCausalLM",
        "BloomBackbone",
        dict(num_heads=6, hidden_dim=192, max_sequence_length=256),
    ),
    # RW-1B style: ALiBi built in the decoder, added before the scale.
    "falcon": (
        "FalconCausalLM",
        "FalconBackbone",
        dict(num_attention_heads=6, hidden_dim=192),
    ),
    # Partial RoPE: 25% of each 32-wide head (8 features) rotated.
    "gpt_neox": (
        "GPTNeoXCausalLM",
        "GPTNeoXBackbone",
        dict(num_heads=4, rotary_percentage=0.25, max_sequence_length=256),
    ),
    # Learned sinks, YaRN RoPE, a window on odd layers, MoE.
    "gpt_oss": (
        "GptOssCausalLM",
        "GptOssBackbone",
        dict(
            **_GQA,
            head_dim=32,
            num_experts=4,
            top_k=2,
            rope_scaling_factor=4.0,
            sliding_window=WINDOW,
        ),
    ),
    # KV sharing: the last 2 of 4 layers reuse the K/V of the last earlier
    # layer of their type (sliding 0, full 1). V-norm, q/k norms, AltUp,
    # Laurel and per-layer inputs, a window on the sliding layers.
    "gemma3n": (
        "Gemma3nCausalLM",
        "Gemma3nBackbone",
        dict(
            text_hidden_size=128,
            num_hidden_layers=4,
            pad_token_id=0,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=[256] * 4,
            hidden_activation="gelu_approximate",
            layer_types=["sliding_attention", "full_attention"] * 2,
            sliding_window=WINDOW,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            max_position_embeddings=256,
            hidden_size_per_layer_input=16,
            altup_num_inputs=2,
            laurel_rank=8,
            num_kv_shared_layers=2,
            activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
            final_logit_soft_cap=30.0,
        ),
    ),
    # KV sharing as Gemma3n (layer 2 reads layer 0, layer 3 layer 1); global
    # layers (odd) with their own head size (128), one K=V head and partial
    # RoPE, so their KV pages are twice the local layers'; per-layer inputs,
    # attention and final soft caps.
    "gemma4": (
        "Gemma4CausalLM",
        "Gemma4Backbone",
        dict(
            num_layers=4,
            num_query_heads=4,
            num_key_value_heads=2,
            hidden_dim=128,
            intermediate_dim=256,
            head_dim=32,
            image_size=None,
            sliding_window_size=WINDOW,
            sliding_window_pattern=2,
            global_head_dim=128,
            num_global_key_value_heads=1,
            global_rope_partial_rotary_factor=0.25,
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=16,
            attention_logit_soft_cap=50.0,
            final_logit_soft_cap=30.0,
        ),
    ),
    # Hybrid: layers 0-2 Gated DeltaNet (2 key heads, 4 value heads of 64:
    # the sizes vLLM's CPU GDN kernels take), layer 3 full attention with
    # its output gate, q/k norms and RoPE on a quarter of each head.
    "qwen3_5": (
        "Qwen3_5CausalLM",
        "Qwen3_5Backbone",
        dict(
            **_GQA,
            num_layers=4,
            head_dim=32,
            sliding_window_size=WINDOW,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_conv_kernel_dim=4,
        ),
    ),
}
# Qwen3.5-MoE: the same hybrid layers, each with a routed MoE block and a
# sigmoid-gated shared expert.
TINY_FAMILIES["qwen3_5_moe"] = (
    "Qwen3_5MoeCausalLM",
    "Qwen3_5MoeBackbone",
    dict(
        TINY_FAMILIES["qwen3_5"][2],
        hidden_dim=128,
        moe_intermediate_dim=64,
        shared_expert_intermediate_size=128,
        num_experts=4,
        top_k=2,
    ),
)
# Gemma4 26B-A4B style: every layer runs a dense MLP beside a routed MoE
# block; KV-sharing layers get a double-wide MLP (E2B style).
TINY_FAMILIES["gemma4_moe"] = (
    "Gemma4CausalLM",
    "Gemma4Backbone",
    dict(
        TINY_FAMILIES["gemma4"][2],
        enable_moe_block=True,
        num_experts=4,
        expert_intermediate_dim=64,
        num_experts_per_token=2,
        use_double_wide_mlp=True,
    ),
)

# Backbone arguments that take the tokenizer's vocabulary size.
_VOCABULARY_ARGS = {"gemma3n": ("text_vocab_size", "vocab_size_per_layer_input")}
# Backbones whose kwargs above name all their dims (not `_COMMON`'s names).
_OWN_DIMS = ("gemma3n", "gemma4", "gemma4_moe", "qwen3_5_moe")

# With small-init layers and the embeddings scaled by `logit_scale`, the
# residual stream mostly echoes the input token: prompts ending in the same
# token continue alike, which tests little of attention. Transformer kernels
# (weights of rank 2 and up) are scaled by this factor, so the context
# decides the tokens (`model_test` checks that it does).
_LAYER_KERNEL_SCALE = {"gpt_neox": 8.0, "opt": 8.0}
DEFAULT_LAYER_KERNEL_SCALE = 4.0
# Gemma2/3's post-norms bound each layer's update, so wide embeddings (Gemma
# also multiplies them by sqrt(hidden_dim)) drown the context: keep them as
# initialised.
_LOGIT_SCALE = {
    "gemma2": 1.0,
    "gemma3": 1.0,
    "gemma3n": 1.0,
    "gemma4": 1.0,
    "gemma4_moe": 1.0,
}
DEFAULT_LOGIT_SCALE = 20.0

_TOKENIZER_FAMILY = {"gemma2": "gemma", "phi3_su": "phi3", "gemma4_moe": "gemma4"}
# Gemma3's, Gemma3n's and Gemma4's CausalLMPreprocessor assert TensorFlow is
# installed (for their image path) even for text; these presets carry their
# tokenizer alone.
NEEDS_TENSORFLOW = ("gemma3", "gemma3n", "gemma4", "gemma4_moe")


def backbone_kwargs(family, vocabulary_size, multimodal=False, images=None, tokenizer=None):
    """The keyword arguments of `family`'s tiny backbone.

    Args:
        family: A key of `TINY_FAMILIES`.
        vocabulary_size: The tokenizer's vocabulary size.
        multimodal: With a tiny media encoder, for a key of `MULTIMODAL`.
        images: With a tiny image encoder whose images are served, for a
            key of `IMAGES`: its options (`{}` for none).
        tokenizer: The preset's tokenizer, with `images`.
    """
    _, _, kwargs = TINY_FAMILIES[family]
    vocabulary = {
        name: vocabulary_size
        for name in _VOCABULARY_ARGS.get(family, ("vocabulary_size",))
    }
    common = {} if family in _OWN_DIMS else _COMMON
    media = MULTIMODAL[family](vocabulary_size) if multimodal else {}
    if images is not None:
        media = IMAGES[family](tokenizer, **images)
    return {**vocabulary, **common, **kwargs, **media}


def randomize_constant_weights(backbone, seed):
    """Random values for MoE and GDN weights that KerasHub initialises constant.

    Gemma4's experts start as zeros and its scales as ones, GPT-OSS's
    expert and router biases as zeros, Qwen3.5's GDN decay `A_log` as zeros
    and `dt_bias` as ones: as initialised they would contribute nothing
    (or nothing per expert or head) a test could check. `A_log` is drawn as
    the Qwen3.5 reference initialises it, `log(uniform(1, 16))`.
    """
    rng = np.random.default_rng(seed)
    owners = [
        layer
        for layer in backbone._flatten_layers(include_self=False)
        if type(layer).__name__ in moe_routes.ROUTES
        or type(layer).__name__ in state_routes.STATE_LAYERS
        or type(layer).__name__.endswith("Router")
    ]
    for variable in {id(v): v for layer in owners for v in layer.weights}.values():
        value = keras.ops.convert_to_numpy(variable)
        if value.size < 2 or value.min() != value.max():
            continue
        if variable.path.endswith("A_log"):
            random = np.log(rng.uniform(1.0, 16.0, value.shape))
        elif value.max() == 1.0:
            random = rng.uniform(0.5, 1.5, value.shape)
        else:
            random = rng.normal(0.0, 0.1, value.shape)
        variable.assign(random.astype(value.dtype))


def build_tiny_preset(
    family,
    directory,
    seed=0,
    logit_scale=None,
    multimodal=False,
    images=None,
    chat=False,
    backbone_overrides=None,
):
    """Saves a tiny random-weight preset of `family` into `directory`.

    Args:
        family: A key of `TINY_FAMILIES`.
        directory: Where to save; created if missing.
        seed: Weight initialisation seed.
        logit_scale: Factor on the token embeddings. Random weights give
            near-flat logits; the family default (20 for most) widens them so
            greedy argmax ties (which kernels may break differently) are
            vanishingly rare. 1.0 keeps them flat, for sampling tests.
        multimodal: With a tiny media encoder, for a key of `MULTIMODAL`.
        images: With a tiny image encoder whose images are served (and the
            tokenizer's image tokens), for a key of `IMAGES`: its options
            (`{}` for none).
        chat: With the tokenizer's tool-calling and thinking tokens
            (`tokenizers.CHAT_TOKENS`).
        backbone_overrides: Backbone arguments over the family's, e.g.
            more layers.

    Returns:
        `directory`.
    """
    causal_lm_name, backbone_name, _ = TINY_FAMILIES[family]
    keras.utils.set_random_seed(seed)
    tokenizer = make_tokenizer(
        _TOKENIZER_FAMILY.get(family, family),
        images=images is not None,
        chat=chat,
        audio=bool(images and images.get("audio")),
    )
    kwargs = backbone_kwargs(
        family, tokenizer.vocabulary_size(), multimodal, images, tokenizer
    )
    backbone = getattr(keras_hub.models, backbone_name)(
        **{**kwargs, **(backbone_overrides or {})}
    )
    if logit_scale is None:
        logit_scale = _LOGIT_SCALE.get(family, DEFAULT_LOGIT_SCALE)
    embedding = backbone.token_embedding or backbone.language_model.embed_tokens
    for variable in embedding.weights:
        variable.assign(variable * logit_scale)
    randomize_constant_weights(backbone, seed)
    kernel_scale = _LAYER_KERNEL_SCALE.get(family, DEFAULT_LAYER_KERNEL_SCALE)
    for layer in attention.transformer_layers(backbone):
        for variable in layer.weights:
            if len(variable.shape) >= 2:
                variable.assign(variable * kernel_scale)
    causal_lm_cls = getattr(keras_hub.models, causal_lm_name)
    preprocessor = None
    if family not in NEEDS_TENSORFLOW:
        preprocessor = causal_lm_cls.preprocessor_cls(tokenizer=tokenizer)
    causal_lm = causal_lm_cls(backbone=backbone, preprocessor=preprocessor)
    os.makedirs(directory, exist_ok=True)
    causal_lm.save_to_preset(directory)
    if preprocessor is None:
        tokenizer.save_to_preset(directory)
    return directory
