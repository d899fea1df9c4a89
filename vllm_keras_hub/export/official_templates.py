"""The official chat templates shipped in `templates/`, and where each came from.

The Hugging Face Hub is not reachable where these were copied, so each file
was copied from a public copy of the checkpoint's template. `OFFICIAL_SOURCES`
records that copy (repository, path, revision where known) and pins the
shipped bytes by SHA-256, so that an edit to a file fails
`official_templates_test.py` instead of passing unnoticed: the tool and
thinking tests compare our serving with these files, so they cannot catch a
change to the files themselves.
"""

import dataclasses
import functools
import importlib.resources


@dataclasses.dataclass(frozen=True)
class OfficialSource:
    """Where a shipped official template was copied from.

    Args:
        checkpoint: The model whose template it is.
        repo: The GitHub repository holding the copy it was taken from.
        path: The copy's path in `repo`.
        revision: The commit the copy was taken at, where it was recorded.
        sha256: SHA-256 of the shipped file.
        verbatim: Whether the shipped file is the upstream file byte for
            byte, so that `sha256` is the upstream file's too.
        note: What differs, where the file is not a verbatim copy.
    """

    checkpoint: str
    repo: str
    path: str
    revision: str | None
    sha256: str
    verbatim: bool = True
    note: str = ""


# The hashes were taken of the files as committed (55d9cd1, c556972); they
# are the upstream files' hashes where `verbatim`. Nothing here re-downloads
# upstream: to move a template to a newer upstream copy, replace the file
# and update its row.
OFFICIAL_SOURCES = {
    "qwen2_5": OfficialSource(
        checkpoint="Qwen/Qwen2.5-7B-Instruct",
        repo="ggml-org/llama.cpp",
        path="models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
        revision=None,
        sha256="cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    ),
    "qwen3": OfficialSource(
        checkpoint="Qwen/Qwen3-0.6B (the updated template)",
        repo="vllm-project/vllm",
        path="rust/src/chat/tests/templates/qwen3.jinja",
        revision=None,
        sha256="e132ae041e1217b5e1114eb9dc292484a7f478df945d72fa49ba01b88d8ec01a",
    ),
    "qwen3_5": OfficialSource(
        checkpoint="Qwen/Qwen3.5-4B",
        repo="ggml-org/llama.cpp",
        path="models/templates/Qwen3.5-4B.jinja",
        revision=None,
        sha256="a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    ),
    "llama3_1": OfficialSource(
        checkpoint="meta-llama/Llama-3.1-8B-Instruct",
        repo="ggml-org/llama.cpp",
        path="models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
        revision=None,
        sha256="e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    ),
    "gemma4": OfficialSource(
        checkpoint="google/gemma-4-*-it (vLLM's copy, synced from the Hub)",
        repo="vllm-project/vllm",
        path="examples/tool_chat_template_gemma4.jinja",
        revision="c408fdd",
        sha256="94899c0f917d93f6fe81c95744d1e8ddab2d21d39228d2e4aec1fb2a25bff413",
    ),
    "smollm3": OfficialSource(
        checkpoint="HuggingFaceTB/SmolLM3-3B",
        repo="huggingface/swift-jinja",
        path="Tests/Templates/ChatTemplates.swift",
        revision=None,
        sha256="e6143bdf3129c6b2a9ac4b6304076041fbb2f6ac39a66172519f18075f0a2a6c",
        verbatim=False,
        note="the template is a string in that Swift test file: the shipped "
        "file is that string's text, not the file",
    ),
    "gpt_oss": OfficialSource(
        checkpoint="openai/gpt-oss-120b (the same template as gpt-oss-20b's)",
        repo="ggml-org/llama.cpp",
        path="models/templates/openai-gpt-oss-120b.jinja",
        revision=None,
        sha256="a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146",
    ),
}


def templates_folder():
    """The folder of the shipped templates, as a resource."""
    return importlib.resources.files(__package__) / "templates"


def template_path(name):
    """The shipped file `templates/<name>.jinja`, as a resource."""
    return templates_folder() / f"{name}.jinja"


@functools.cache
def official_template(name):
    """The official template `templates/<name>.jinja` (`OFFICIAL_SOURCES`)."""
    if name not in OFFICIAL_SOURCES:
        raise KeyError(f"{name!r} is not a shipped official template: {sorted(OFFICIAL_SOURCES)}")
    return template_path(name).read_text(encoding="utf-8")
