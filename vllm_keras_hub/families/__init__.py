"""Every KerasHub family vllm-keras-hub knows, one place each, in one table.

A family's module (`families/<name>.py`, or its folder `families/<name>/`)
holds what is particular to it:
its `Family` row (stop tokens, parallel layouts, refusal, its TextEmbedder,
drafters and image model class's name), the routes that hand its attention, MoE and
recurrent-state layers to vLLM's kernels, and its text-forward loop. A
family served with images, audio, video or a drafter keeps those parts in
its folder too, as modules `part` imports on use (they import the model
machinery, which imports this table). The shared machinery stays in
`layers/` and `models/`. The table checks its own rows when
it is imported (`_check`), so a row that could not be served fails at import,
not at a request. Keyed by the backbone class a preset's `config.json` names;
a family without a route is refused at start-up with its reason, never
served by a slower or wrong fallback.
"""

import importlib
import importlib.util

# First: the family modules import Keras, on torch.
from vllm_keras_hub import keras_on_torch  # noqa: F401
from vllm_keras_hub.families import albert
from vllm_keras_hub.families import bart
from vllm_keras_hub.families import bert
from vllm_keras_hub.families import blip2
from vllm_keras_hub.families import bloom
from vllm_keras_hub.families import deberta_v3
from vllm_keras_hub.families import distil_bert
from vllm_keras_hub.families import esm
from vllm_keras_hub.families import falcon
from vllm_keras_hub.families import f_net
from vllm_keras_hub.families import gemma
from vllm_keras_hub.families import gemma3
from vllm_keras_hub.families import gemma3n
from vllm_keras_hub.families import gemma4
from vllm_keras_hub.families import gpt2
from vllm_keras_hub.families import gpt_neox
from vllm_keras_hub.families import gpt_oss
from vllm_keras_hub.families import llama
from vllm_keras_hub.families import llama3
from vllm_keras_hub.families import mistral
from vllm_keras_hub.families import mixtral
from vllm_keras_hub.families import moonshine
from vllm_keras_hub.families import opt
from vllm_keras_hub.families import pali_gemma
from vllm_keras_hub.families import phi3
from vllm_keras_hub.families import qwen
from vllm_keras_hub.families import qwen3
from vllm_keras_hub.families import qwen3_5
from vllm_keras_hub.families import qwen3_5_moe
from vllm_keras_hub.families import qwen3_moe
from vllm_keras_hub.families import qwen_moe
from vllm_keras_hub.families import roberta
from vllm_keras_hub.families import roformer_v2
from vllm_keras_hub.families import rwkv7
from vllm_keras_hub.families import smollm3
from vllm_keras_hub.families import t5
from vllm_keras_hub.families import t5gemma
from vllm_keras_hub.families import t5gemma2
from vllm_keras_hub.families import xlm_roberta
from vllm_keras_hub.families.family import KERAS_HUB
from vllm_keras_hub.families.family import OURS
from vllm_keras_hub.families.family import Drafter  # noqa: F401
from vllm_keras_hub.families.family import Family  # noqa: F401
from vllm_keras_hub.families.family import UnsupportedFamilyError

# Table order: what `supported_families()` lists.
FAMILIES = tuple(
    module.FAMILY
    for module in (
        gpt2, opt, llama, llama3, mistral, qwen, qwen3, gemma, gemma3, mixtral,
        qwen_moe, qwen3_moe, smollm3, phi3, gpt_neox, bloom, falcon, gpt_oss,
        gemma3n, gemma4, qwen3_5, qwen3_5_moe, pali_gemma, bert, xlm_roberta,
        roberta, distil_bert, albert, roformer_v2, esm, deberta_v3, f_net, bart, rwkv7, t5, t5gemma, t5gemma2, blip2, moonshine,
    )
)  # fmt: skip


def _merged(kind):
    # One class name, one route: two families may name a class only for the
    # very same route (the encoders' Keras `MultiHeadAttention`).
    merged = {}
    for family in FAMILIES:
        for class_name, route in getattr(family, kind).items():
            if merged.setdefault(class_name, route) is not route:
                raise ValueError(f"Two families route {class_name} differently.")
    return merged


def _check(family):
    problems = []
    if family.route not in (KERAS_HUB, OURS, None):
        problems.append(f"route {family.route!r} is none of keras_hub, ours or None")
    if family.route == OURS and not family.attention and not family.encoder_decoder:
        problems.append("its route is ours, but it names no attention route")
    if family.encoder_decoder and family.attention:
        problems.append("an encoder-decoder's attention is routed by its task's model")
    if family.seq2seq and family.audio_to_text:
        problems.append("it is served as one encoder-decoder task, not two")
    if bool(family.encoder_decoder) != (family.decoder_attention is not None):
        problems.append("encoder-decoder families, and only they, name their decoder attention")
    if family.route != OURS and family.attention:
        problems.append("it names attention routes its route does not use")
    if family.route is None and not family.unsupported_reason:
        problems.append("it has no route and no reason why")
    if family.hybrid != bool(family.state_layers):
        problems.append("hybrid families, and only they, name state layers")
    if family.embedder_only and family.tensor_parallel:
        problems.append("an embedder is served on one rank")
    if problems:
        raise ValueError(f"Family {family.name!r}: " + "; ".join(problems) + ".")


for _family in FAMILIES:
    _check(_family)
_BY_BACKBONE = {family.backbone: family for family in FAMILIES}
_BY_NAME = {family.name: family for family in FAMILIES}
if len(_BY_BACKBONE) != len(FAMILIES) or len(_BY_NAME) != len(FAMILIES):
    raise ValueError("Two families share a name or a backbone.")

# Layer class name -> its route, across families.
ATTENTION_ROUTES = _merged("attention")
MOE_ROUTES = _merged("moe")
STATE_LAYERS = tuple(sorted({name for f in FAMILIES for name in f.state_layers}))
KERNEL_READERS = _merged("kernel_readers")
DRAFTERS = _merged("drafters")


def part(family, name):
    """The module `families/<family>/<name>.py`, or `None` where the family
    has no such part.

    Args:
        family: A `Family`.
        name: The part: `"formats"` (the media formats a model folder's
            `config.json` records, read from the preset), `"media"` (its
            model class served with images, audio and video), `"inputs"`
            (what its converters give beyond pixels, and how a clip's
            features are masked), `"video"` (its video layout), or any other
            module of its folder.
    """
    module = f"{__name__}.{family.parts or family.name}.{name}"
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a family module, not a folder
        return None
    return None if found is None else importlib.import_module(module)


def supported_families():
    """Display names of the causal-LM families with a route, in table order."""
    return [
        family.display_name
        for family in FAMILIES
        if family.route and not family.embedder_only and not family.encoder_decoder
    ]


def tensor_parallel_families():
    """Display names of the families served with tensor parallelism."""
    return [family.display_name for family in FAMILIES if family.tensor_parallel]


def family_by_name(name):
    """Returns the `Family` with key `name`."""
    return _BY_NAME[name]


def family_for_backbone(backbone_class_name, preset=None):
    """Returns the servable `Family` of a backbone class name.

    Args:
        backbone_class_name: The class name a preset's `config.json` records
            under `class_name`.
        preset: The preset, only for the error message.

    Raises:
        UnsupportedFamilyError: naming the family, why it cannot be served,
            and the families that can.
    """
    family = _BY_BACKBONE.get(backbone_class_name)
    if family is not None and family.route is not None:
        return family
    # Served steps look their family up too: the message only on failure.
    where = f"Preset '{preset}'" if preset else "This preset"
    supported = ", ".join(supported_families())
    if family is None:
        raise UnsupportedFamilyError(
            f"{where} uses {backbone_class_name}, which is not a KerasHub "
            f"causal-LM family vllm-keras-hub knows. Supported families: "
            f"{supported}."
        )
    raise UnsupportedFamilyError(
        f"{where} is a {family.display_name} model ({backbone_class_name}), "
        f"which vllm-keras-hub cannot serve yet: {family.unsupported_reason}. "
        f"Supported families: {supported}."
    )
