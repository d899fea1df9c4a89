"""`Family`: everything vllm-keras-hub knows of one KerasHub family."""

import dataclasses

KERAS_HUB = "keras_hub"  # keras-hub's own serving route
OURS = "vllm_keras_hub"  # ours, from `Family.attention`


class UnsupportedFamilyError(ValueError):
    """A preset whose family vllm-keras-hub cannot serve."""


@dataclasses.dataclass(frozen=True)
class Family:
    """How one KerasHub family is served.

    Args:
        name: Short family key, e.g. `"llama3"`; its module is
            `families/<name>.py`, or its folder `families/<name>/` where it
            has parts beyond this row (`families.part`).
        display_name: What users call it, e.g. `"Gemma / Gemma2"`.
        backbone: The KerasHub backbone class name presets record.
        route: Where attention reaches vLLM: `KERAS_HUB` for the serving
            route keras-hub itself ships, `OURS` for the routes in
            `attention`, `None` for no route.
        stop_tokens: Turn-end tokens the family's `CausalLM.generate()`
            stops on besides the tokenizer's `end_token_id` (and
            `end_token2_id`, read from the tokenizer itself).
        unsupported_reason: Why a family without a route cannot be served.
        tensor_parallel: Whether its layers shard across tensor-parallel
            ranks (`layers/parallel/parallel_linear.py`); set where `parallel_test.py`
            proves it (Llama shares Llama3's layers).
        pipeline_refusal: Why its backbone cannot be cut into pipeline
            stages (`models/pipeline.py`), or `""` where it can.
        hybrid: Whether some layers keep a recurrent state in vLLM's state
            cache instead of a KV cache (`state_layers`).
        embedder_only: An encoder family, served only for a pooling task
            (`tasks/`: a text embedder or classifier), never to generate.
        seq2seq: The KerasHub `Seq2SeqLM` class of an encoder-decoder
            family, served by vLLM's encoder-decoder runner
            (`tasks/seq_2_seq_lm/`), or `""`.
        audio_to_text: The KerasHub `AudioToText` class of a speech-to-text
            family, served on `/v1/audio/transcriptions`
            (`tasks/audio_to_text/`), or `""`.
        decoder_attention: `decoder_attention(backbone)`, each decoder
            layer's `(self-attention, cross-attention)` layers, for an
            encoder-decoder family.
        embedder: The KerasHub `TextEmbedder` class its embedding presets
            are, served on `/v1/embeddings` (`export/embedder.py`), or `""`.
        attention: Attention-layer class name -> its
            `layers.attention.attention_routes.Route`, for `route == OURS`.
        moe: MoE block class name -> its `layers.moe.moe_routing.MoERoute`,
            onto vLLM's fused MoE.
        state_layers: Layer class names that keep a recurrent state
            (`layers/state/state_routes.py`).
        image_architecture: The vLLM model class of its presets served
            with images (`export/architectures.py`); `None`: text only.
        text_forward: `text_forward(backbone, token_ids, padding_mask,
            positions, layers, hidden)`, the final hidden states where the
            backbone's own graph cannot give them (it demands image or
            audio inputs, or a pipeline stage of a loop over its layers);
            `None` from it, or no function, runs the backbone's own graph
            (`models/text_forward.py`).
        text_loop: `text_loop(backbone)`: whether `text_forward` runs the
            backbone's layers as a loop of its own (so a pipeline stage
            runs that loop over its layers, `models/pipeline.py`), not its
            functional graph.
        kernel_readers: Decoder block class name -> `(gate and up
            projections, down projection)`, the MLP layers whose kernels the
            block multiplies by itself (`layers/linear/kernel_readers.py`).
        drafters: Drafter task class name -> its `Drafter`: the KerasHub
            tasks of the family that only propose tokens for a target of it
            (`export/drafter.py`).
        speculative_refusals: Speculative method -> why a target of the
            family is not served with it (`speculative.py`).
        layer_calls: `layer_calls(backbone)`, its transformer layers'
            indices in the order its graph calls them, where it calls some
            more than once (ALBERT's shared groups); `None`: each once, in
            order. Only an encoder's, whose attention keeps no cache.
        parts: The family whose folder holds this one's parts
            (`families.part`), where it shares another's; else its own.
    """

    name: str
    display_name: str
    backbone: str
    route: str | None = KERAS_HUB
    stop_tokens: tuple[str, ...] = ()
    unsupported_reason: str = ""
    tensor_parallel: bool = False
    pipeline_refusal: str = ""
    hybrid: bool = False
    embedder_only: bool = False
    seq2seq: str = ""
    audio_to_text: str = ""
    decoder_attention: object = None
    embedder: str = ""
    attention: dict = dataclasses.field(default_factory=dict, hash=False)
    moe: dict = dataclasses.field(default_factory=dict, hash=False)
    state_layers: tuple[str, ...] = ()
    image_architecture: str | None = None
    text_forward: object = None
    text_loop: object = None
    kernel_readers: dict = dataclasses.field(default_factory=dict, hash=False)
    drafters: dict = dataclasses.field(default_factory=dict, hash=False)
    speculative_refusals: dict = dataclasses.field(default_factory=dict, hash=False)
    layer_calls: object = None
    parts: str = ""

    @property
    def encoder_decoder(self):
        """The task class an encoder-decoder family is served as, or `""`."""
        return self.seq2seq or self.audio_to_text


@dataclasses.dataclass(frozen=True)
class Drafter:
    """A drafter task: vLLM runs it as method `mtp` for a target of its family.

    Args:
        model_type: The Hugging Face model type vLLM picks its proposer by.
        model_class: `"module:Class"`, our vLLM model class that serves it.
    """

    model_type: str
    model_class: str
