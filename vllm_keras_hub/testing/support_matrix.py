"""The supported-family matrix, filled in by the parity tests as they run.

`model_test.py` records each tiny preset's parity results and the attention
features its served model used (`parallel_test.py` the parallel columns,
`vision*_test.py` the images, audio and video columns); `conftest.py` writes the table to
`build/test-reports/support_matrix.md` when the session ends, and
`scripts/update-reports` copies it into docs/supported-families.md.
"""

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.models import families
from vllm_keras_hub.settings import PIPELINE_REFUSALS
from vllm_keras_hub.settings import TENSOR_REFUSALS

RESULTS = {}
COLUMNS = (
    "batched", "chunked", "prefix_cache", "compiled", "tp2", "pp2", "window", "soft_cap",
    "sinks", "moe", "images", "audio", "video",
)


def record(preset_name, backbone, **values):
    """Records results for one tiny preset, e.g. `batched="pass"`."""
    RESULTS.setdefault(preset_name, {"backbone": backbone}).update(values)


def _mark(value):
    if value is True:
        return "yes"
    if value in (False, None):
        return ""
    return str(value)


def _chat_cell(family_name):
    """The chat format column: none, or the format and the vLLM parsers of
    its tool calls and thinking (those of the family's latest version)."""
    chat_format = chat_templates.chat_format(family_name)
    if chat_format is None:
        return "none (400)"
    latest = chat_templates.chat_format(family_name, chat_templates.VERSION_MARKERS)
    parts = ["yes"]
    if latest.tool_parser:
        # Only Llama 3 gains tools in a later version (3.1, `VERSION_MARKERS`).
        version = "" if chat_format.tool_parser else " (3.1+)"
        parts.append(f"tools{version}: `{latest.tool_parser}`")
    if latest.reasoning_parser:
        parts.append(f"thinking: `{latest.reasoning_parser}`")
    return "; ".join(parts)


def render():
    """The matrix as Markdown: tested presets, then families without a route."""
    lines = [
        "| family | test preset | route | greedy parity, batched | greedy parity, "
        "chunked prefill | greedy parity, prefix-cache hit | greedy parity, compiled | "
        "greedy parity, 2 ranks (tensor parallel) | greedy parity, 2 stages (pipeline "
        "parallel) | sliding window | soft cap | sinks | MoE | images, greedy parity | "
        "audio, greedy parity | video, greedy parity | chat format |",
        "| --- " * 17 + "|",
    ]
    tested = set()
    for name, result in sorted(RESULTS.items()):
        family = families.family_for_backbone(result["backbone"])
        tested.add(family.name)
        route = {"keras_hub": "keras-hub's", "vllm_keras_hub": "ours"}[family.route]
        chat = _chat_cell(family.name)
        cells = [family.display_name, name, route]
        cells += [_mark(result.get(column)) for column in COLUMNS]
        if not family.tensor_parallel:
            cells[3 + COLUMNS.index("tp2")] = "refused"
        if family.backbone in PIPELINE_REFUSALS:
            cells[3 + COLUMNS.index("pp2")] = "refused"
        lines.append("| " + " | ".join(cells + [chat]) + " |")
    for family in families.FAMILIES:
        if family.route is None:
            lines.append(
                f"| {family.display_name} | | refused: {family.unsupported_reason} "
                + "| " * 13 + "|"
            )
        elif family.name not in tested and not family.embedder_only:
            lines.append(
                f"| {family.display_name} | | not tested in this run "
                + "| " * 13 + "|"
            )
    return "\n".join(lines + _refusals()) + "\n"


def _refusals():
    """Each "refused" parallel cell's reason, in the refusal's own words."""
    lines = ["", "Refused, as the start-up error says:", ""]
    for family in families.FAMILIES:
        if family.route is None or family.embedder_only:
            continue
        if not family.tensor_parallel:
            reason = TENSOR_REFUSALS.get(family.backbone, "not mapped")
            lines.append(f"- {family.display_name}, 2 ranks: {reason}.")
        if family.backbone in PIPELINE_REFUSALS:
            lines.append(
                f"- {family.display_name}, 2 stages: "
                f"{PIPELINE_REFUSALS[family.backbone]}."
            )
    return lines
