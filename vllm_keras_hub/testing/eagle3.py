"""EAGLE-3 heads for tiny targets, in the Hugging Face layout vLLM loads.

No trained EAGLE-3 head fits a tiny random-weight target, and one with
random weights would draft almost nothing, so acceptance would show nothing
about the hidden states it reads. `save_echo_head` builds a head whose
draft is known: its decoder layer adds nothing (zero output projections),
its `fc` passes one aux hidden state through (by default the last), and its
norm and output head are the target's own. Fed the target's last layer
output (aux layer = the number of layers), it drafts the token the target
just chose, so a draft is accepted exactly where the target repeats a
token; fed anything else, it drafts other tokens. Passing an intermediate
layer's hidden state through, it drafts what the output head reads off
that layer, which only that layer's hidden state gives.
"""

import json
import os

import keras
import numpy as np

from vllm_keras_hub.layers.attention.attention import token_embedding


def _output_head(backbone):
    embedding = token_embedding(backbone)
    if getattr(embedding, "tie_weights", True):
        return np.asarray(embedding.embeddings.numpy())
    return np.asarray(embedding.reverse_embeddings.numpy()).T


def _norm_weight(backbone):
    # The final RMS norm's per-channel factor as vLLM's `RMSNorm` applies it
    # (`x / rms(x) * w`): Llama's is its scale, Gemma's `1 + scale`. Read
    # from the norm itself at a vector whose rms is 1.
    hidden = int(backbone.hidden_dim)
    ones = np.ones((1, 1, hidden), dtype="float32")
    normed = keras.ops.convert_to_numpy(backbone.layer_norm(ones))[0, 0]
    return normed * np.sqrt(1.0 + float(backbone.layer_norm_epsilon))


def save_echo_head(preset, folder, aux_layers, seed=0, slot=-1):
    """Saves an EAGLE-3 head for `preset` into `folder`.

    Args:
        preset: A KerasHub preset folder whose backbone ends in an RMS norm
            (`layer_norm`) and has no logit soft cap: Llama, Gemma3.
        folder: Where to write `config.json` and `model.safetensors`.
        aux_layers: vLLM's aux layer indices the head reads.
        seed: For the attention weights, which do not change the draft.
        slot: Which of the aux hidden states the head passes through, by
            its place in vLLM's concatenation (`aux_layers` sorted):
            `-1`, the last; `0` for the lowest layer.

    Returns:
        `folder`.
    """
    import keras_hub
    import torch
    from safetensors.torch import save_file

    backbone = keras_hub.models.Backbone.from_preset(preset)
    hidden = int(backbone.hidden_dim)
    heads = int(backbone.num_query_heads)
    kv_heads = int(backbone.num_key_value_heads)
    head_dim = hidden // heads  # The head's own attention adds nothing.
    intermediate = int(backbone.intermediate_dim)
    head = _output_head(backbone)
    vocabulary = head.shape[0]
    rng = np.random.default_rng(seed)

    def random(*shape):
        return torch.tensor(rng.normal(0, 0.02, shape), dtype=torch.float32)

    def zeros(*shape):
        return torch.zeros(shape, dtype=torch.float32)

    def ones(size):
        return torch.ones(size, dtype=torch.float32)

    fc = zeros(hidden, hidden * len(aux_layers))
    slot = range(len(aux_layers))[slot]
    fc[:, slot * hidden : (slot + 1) * hidden] = torch.eye(hidden)
    weights = {
        "midlayer.input_layernorm.weight": ones(hidden),
        "midlayer.hidden_norm.weight": ones(hidden),
        "midlayer.post_attention_layernorm.weight": ones(hidden),
        "midlayer.self_attn.q_proj.weight": random(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": random(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": random(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": zeros(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": random(intermediate, hidden),
        "midlayer.mlp.up_proj.weight": random(intermediate, hidden),
        "midlayer.mlp.down_proj.weight": zeros(hidden, intermediate),
        "fc.weight": fc,
        "norm.weight": torch.tensor(_norm_weight(backbone), dtype=torch.float32),
        "lm_head.weight": torch.tensor(head, dtype=torch.float32).contiguous(),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocabulary,
        "draft_vocab_size": vocabulary,
        "rms_norm_eps": float(backbone.layer_norm_epsilon),
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers)},
    }
    os.makedirs(folder, exist_ok=True)
    save_file(weights, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return folder
