"""What the routed layers of one served step share: the step context.

vLLM calls the model once per step. Each routed KerasHub layer holds its
own vLLM kernel, bound when the model is built (`paged_attention.py`,
`moe.py`, `state_routes.py`); what changes from step to step, its layers
find here, as nano-vllm's layers find their step's context. The model sets
the fields for the span of its step (`scope`); outside one, a routed layer
has nothing to run on and says so.
"""

import contextlib
import dataclasses


@dataclasses.dataclass
class Routed:
    """What one step handed to vLLM, in call order: the start-up probe's
    routes are checked against it (`probe.check_step`).

    Attributes:
        attention: The index of each attending layer whose kernel ran.
        moe: The index of each MoE block whose experts ran.
        states: The index of each state layer that stepped.
    """

    attention: list = dataclasses.field(default_factory=list)
    moe: list = dataclasses.field(default_factory=list)
    states: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Step:
    """The context of the step being served.

    Attributes:
        rotary_rows: The step's gathered rotary cos/sin by table and layout
            (`rotary_tables.py`), shared by its layers, or `None`.
        is_image: `(num_tokens,)` bool on the CPU, True at image soft
            tokens; set by the model's `embed_input_ids` before the step
            (`image_attention.py`), `None` for a text-only step.
        image_metadata: vLLM's attention metadata of the step the image
            mask is for, bound at its first layer.
        image_spans: id(a layer's attention metadata) -> its image spans.
        spans_end_prompts: Whether an image span may end its prompt
            (PaliGemma's prefixes).
        aux_hidden: The step's EAGLE-3 aux hidden states, appended by the
            tapped transformer layers in layer order (`eagle3.py`), or `None`.
        mrope_positions: `(3, num_tokens)` M-RoPE positions (temporal,
            height, width) of a model that takes them (`families/qwen3_5/media.py`),
            or `None`.
        routed: The step's `Routed`, or `None` outside a step (or the
            start-up probe's).
        segment_ids: `(num_tokens,)` segment id of each token, from vLLM's
            `token_type_ids` (a cross-encoder's pairs, `tasks/
            text_classifier/model.py`), or `None`: all in segment 0.
    """

    rotary_rows: dict = None
    is_image: object = None
    image_metadata: object = None
    image_spans: dict = dataclasses.field(default_factory=dict)
    spans_end_prompts: bool = False
    aux_hidden: list = None
    mrope_positions: object = None
    routed: Routed = None
    segment_ids: object = None


_STEP = Step()


def current():
    """The context of the step being served (one per process)."""
    return _STEP


@contextlib.contextmanager
def scope(**fields):
    """Sets `fields` of the step context inside the block, then restores them.

    Args:
        **fields: `Step` attributes, e.g. `routed=Routed()`.
    """
    previous = {name: getattr(_STEP, name) for name in fields}
    for name, value in fields.items():
        setattr(_STEP, name, value)
    try:
        yield _STEP
    finally:
        for name, value in previous.items():
            setattr(_STEP, name, value)
