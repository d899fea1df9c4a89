"""The vLLM model class of KerasHub `Seq2SeqLM` presets (BART, T5Gemma), and
what it shares with `AudioToText`'s (`tasks/audio_to_text/model.py`).

The backbone's own functional graph, cut at the encoder's output (as
`models/pipeline.py` cuts stages), gives two models of the preset's own
layers: the encoder, run once per request by `embed_multimodal` on the
request's packed text, and the decoder, run every step on vLLM's batch of
decoder tokens. Each decoder layer's two attention layers hand their heads
to vLLM: self-attention to an `Attention` over the paged KV cache, and
cross-attention to a `CrossAttention`, which keeps the encoder's keys and
values in the cache from the step the encoder ran, so later steps project
none. Positions are vLLM's per-token ones, from keras-hub's serving
context: BART's learned positions read it as keras-hub's own routes do,
and T5Gemma's rotary layers are given it (its family's `seq2seq` part).

The encoder's own self-attention runs as Keras computes it, once per
request over its whole text: vLLM keeps no cache for it.
"""

from vllm_keras_hub.backend import require_torch_backend

# Before anything below imports Keras: a clear error for another backend.
require_torch_backend()

import types

import keras
import torch
from keras import ops
from keras_hub.src.vllm.context import vllm_context_scope
from torch import nn
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention import CrossAttention
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.selector import get_attn_backend

from vllm_keras_hub import families
from vllm_keras_hub.compile.direct_calls import use_direct_calls
from vllm_keras_hub.compile.dynamo_substitutes import substitute_keras_helpers
from vllm_keras_hub.export.hf_config import LOAD_FORMAT
from vllm_keras_hub.loading import heap
from vllm_keras_hub.loading import preset_weights
from vllm_keras_hub.loading.load_format import backbone_dtype
from vllm_keras_hub.models.base import compiled
from vllm_keras_hub.preset import served
from vllm_keras_hub.tasks.seq_2_seq_lm import FIELD
from vllm_keras_hub.tasks.seq_2_seq_lm import processor


def kernel_head_size(head_size, vllm_config):
    """The head size vLLM's attention kernel runs `head_size` heads at.

    `head_size` where the platform's kernel runs it; else the next size it
    runs, the heads zero-padded to it (`attend`), which is exact: zeros add
    nothing to a query's product with a key, and the padded values' outputs
    are cut off. (Moonshine's published heads are 36 and 52 wide; vLLM's CPU
    kernel runs 32, 64, 80, ...)
    """
    backend = get_attn_backend(
        head_size, vllm_config.model_config.dtype, vllm_config.cache_config.cache_dtype
    )
    sizes = backend.get_supported_head_sizes()
    if not sizes or head_size in sizes:
        return head_size
    larger = [size for size in sizes if size > head_size]
    if not larger:
        raise ValueError(
            f"Attention heads of size {head_size} are over every size this "
            f"platform's attention kernel ({backend.get_name()}) runs: {sizes}."
        )
    return min(larger)


class _Kernel:
    """A layer's vLLM attention, held as a plain callable: Keras would track
    a module set on a built layer as new state, and refuse it."""

    def __init__(self, attention):
        self.attention = attention
        self.head_size = attention.head_size

    def __call__(self, query, key, value):
        return self.attention(query, key, value)


def _rows(heads, size):
    """Projected heads `(..., heads, head_size)` as one row of `heads * size`
    a token, zero-padded to `size`."""
    pad = size - ops.shape(heads)[-1]
    if pad:
        heads = ops.pad(heads, [(0, 0)] * (len(ops.shape(heads)) - 1) + [(0, pad)])
    return ops.reshape(heads, (-1, ops.shape(heads)[-2] * size))


def attend(layer, kernel, query, key, value):
    """`layer`'s attention on its vLLM kernel, through its output projection.

    Args:
        layer: The Keras attention layer whose `call` this serves.
        kernel: Its `_Kernel`.
        query, key, value: Projected heads, `(..., heads, head_size)`; no
            key and value on a cross-attention step whose encoder did not run.
    """
    shape = ops.shape(query)
    size = kernel.head_size
    output = kernel(*(None if x is None else _rows(x, size) for x in (query, key, value)))
    output = ops.reshape(output, (*shape[:-1], size))
    if size != shape[-1]:
        output = output[..., : shape[-1]]
    return projection(layer, "output")(output)


def projection(layer, name):
    """`layer`'s `query`, `key`, `value` or `output` dense layer: Keras's
    attention names them privately (`_query_dense`), Gemma's publicly."""
    return getattr(layer, f"_{name}_dense", None) or getattr(layer, f"{name}_dense")


def cross_attend(layer, query, key, value):
    """Cross-attention on `layer`'s vLLM kernel. Only on the step a request's
    encoder ran are its keys and values projected; vLLM's cache holds them
    for every later step."""
    query = projection(layer, "query")(query)
    if ops.shape(value)[1] == 0:
        return attend(layer, layer._vllm_attention, query, None, None)
    key, value = projection(layer, "key")(key), projection(layer, "value")(value)
    return attend(layer, layer._vllm_attention, query, key, value)


class EncoderDecoderModel(nn.Module, SupportsMultiModal):
    """A KerasHub encoder-decoder preset served by vLLM's encoder-decoder
    runner: what its tasks' model classes share.

    Args:
        vllm_config: The engine's `VllmConfig`; `model_config.hf_config`
            carries the task's fields under `field`.
        prefix: Module prefix vLLM gives the model.
    """

    # The `config.json` key of the task's fields, and each decoder layer's
    # attention calls (a subclass's, or its family's).
    field = FIELD
    self_attention_call = None
    cross_attention_call = None

    @classmethod
    def get_placeholder_str(cls, modality, i):
        return None

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()
        load_format = vllm_config.load_config.load_format
        if load_format != LOAD_FORMAT:
            raise ValueError(
                f"A KerasHub model loads its weights from its preset with "
                f"load_format='{LOAD_FORMAT}', got load_format='{load_format}'."
            )
        self.vllm_config = vllm_config
        self.config = vllm_config.model_config.hf_config
        self.seq2seq = getattr(self.config, self.field)
        self.family = families.family_by_name(self.config.keras_hub_family)
        self.preset = served(self.config.keras_hub_preset)
        self.backbone = None
        fields = self.seq2seq
        heads, head_size = fields["num_heads"], fields["head_size"]
        options = dict(
            num_kv_heads=fields.get("num_kv_heads") or heads,
            cache_config=vllm_config.cache_config,
            logits_soft_cap=fields.get("soft_cap"),
        )
        size = kernel_head_size(head_size, vllm_config)
        scale = fields.get("scale") or head_size**-0.5
        windows = fields.get("sliding_windows") or [None] * fields["num_layers"]
        self.self_attention = nn.ModuleList()
        self.cross_attention = nn.ModuleList()
        for index in range(fields["num_layers"]):
            self.self_attention.append(
                Attention(heads, size, scale, per_layer_sliding_window=windows[index],
                          prefix=f"{prefix}decoder.{index}.self_attention", **options)
            )  # fmt: skip
            self.cross_attention.append(
                CrossAttention(heads, size, scale, attn_type=AttentionType.ENCODER_DECODER,
                               prefix=f"{prefix}decoder.{index}.cross_attention", **options)
            )  # fmt: skip

    def load_preset(self, lora_weights=None):
        """Loads the backbone from the preset and routes its decoder's attention."""
        if lora_weights is not None:
            raise ValueError("An encoder-decoder preset takes no merged LoRA adapter.")
        dtype = str(self.vllm_config.model_config.dtype).removeprefix("torch.")
        backbone = preset_weights.unloaded_backbone(self.preset, backbone_dtype(self.preset, dtype))
        weights = preset_weights.PresetWeights(backbone, self.preset)
        try:
            weights.finish()
        finally:
            weights.close()
        heap.release_free_memory()
        self.backbone = backbone
        self.encoder, self.decoder = self.cut(backbone)
        self.route(backbone)
        # After the cut, which calls the layers symbolically: vLLM compiles
        # the decoder's steps without Keras's per-call machinery.
        use_direct_calls(self.encoder)
        use_direct_calls(self.decoder)
        substitute_keras_helpers()

    def cut(self, backbone):
        """The backbone's graph as its encoder and its decoder models."""
        inputs = backbone.input
        encoder_output = backbone.output["encoder_sequence_output"]
        encoder = keras.Model(
            {"encoder_token_ids": inputs["encoder_token_ids"],
             "encoder_padding_mask": inputs["encoder_padding_mask"]},
            encoder_output,
            name="encoder",
        )  # fmt: skip
        decoder = keras.Model(
            [inputs["decoder_token_ids"], inputs["decoder_padding_mask"],
             encoder_output, inputs["encoder_padding_mask"]],
            backbone.output["decoder_sequence_output"],
            name="decoder",
        )  # fmt: skip
        return encoder, decoder

    def route(self, backbone):
        """Hands each decoder layer's attention to its vLLM kernels."""
        pairs = self.family.decoder_attention(backbone)
        for (own, cross), kernel, cross_kernel in zip(
            pairs, self.self_attention, self.cross_attention, strict=True
        ):
            own._vllm_attention = _Kernel(kernel)
            own.call = types.MethodType(self.self_attention_call, own)
            cross._vllm_attention = _Kernel(cross_kernel)
            cross.call = types.MethodType(self.cross_attention_call, cross)

    def embed_multimodal(self, encoder_token_ids=None, **kwargs):
        """Each request's encoder output, `(tokens, hidden)`: the preset's own
        encoder on its packed text alone."""
        outputs = []
        for ids in encoder_token_ids:
            ids = ops.reshape(ids, (1, -1))
            hidden = self.encoder(
                {"encoder_token_ids": ids, "encoder_padding_mask": ops.ones_like(ids)},
                training=False,
            )
            outputs.append(hidden[0])
        return outputs

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        return self.backbone.token_embedding(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None,
                encoder_outputs=None, **kwargs):  # fmt: skip
        hidden_dim = self.seq2seq["hidden_dim"]
        if encoder_outputs:
            encoder = torch.cat(list(encoder_outputs), dim=0)[None]
        else:
            # No request's encoder ran this step: no keys or values to add.
            encoder = torch.zeros(
                (1, 0, hidden_dim), dtype=self.vllm_config.model_config.dtype,
                device=input_ids.device,
            )  # fmt: skip
        # keras-hub's serving layout: one row per token, as its learned
        # positions take vLLM's per-token positions.
        token_ids = ops.reshape(input_ids, (-1, 1))
        with vllm_context_scope(positions=positions):
            hidden = self.decoder(
                [token_ids, ops.ones_like(token_ids),
                 encoder, ops.ones(ops.shape(encoder)[:2], dtype="int32")],
                training=False,
            )  # fmt: skip
        return ops.reshape(hidden, (-1, hidden_dim))

    def compute_logits(self, hidden_states):
        return self.backbone.token_embedding(hidden_states, reverse=True)


@compiled
@MULTIMODAL_REGISTRY.register_processor(
    processor.Seq2SeqProcessor,
    info=processor.Seq2SeqProcessingInfo,
    dummy_inputs=processor.Seq2SeqDummyInputsBuilder,
)
class KerasHubForConditionalGeneration(EncoderDecoderModel):
    """A KerasHub `Seq2SeqLM` preset (BART, T5Gemma): a text in, a text out.

    Its family's `seq2seq` part (`families/<family>/seq2seq.py`) gives the
    decoder's attention calls, embedding and logits.
    """

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.parts = families.part(self.family, "seq2seq")
        self.self_attention_call = self.parts.self_attention_call
        self.cross_attention_call = self.parts.cross_attention_call

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        return self.parts.decoder_embedding(self.backbone)(input_ids)

    def compute_logits(self, hidden_states):
        return self.parts.logits(self.backbone, hidden_states)
