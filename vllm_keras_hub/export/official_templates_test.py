"""The shipped official chat templates are the pinned copies, and nothing else.

The tool and thinking tests render our formats against these same files, so
an edit to a file would pass them: the files are pinned here by SHA-256.
"""

import hashlib

import pytest

from vllm_keras_hub.export import chat_templates
from vllm_keras_hub.export import official_templates
from vllm_keras_hub.export.official_templates import OFFICIAL_SOURCES


@pytest.mark.parametrize("name", sorted(OFFICIAL_SOURCES))
def test_each_shipped_template_is_the_pinned_copy(name):
    data = official_templates.template_path(name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == OFFICIAL_SOURCES[name].sha256, (
        f"templates/{name}.jinja changed: an official template is a copy of "
        f"{OFFICIAL_SOURCES[name].repo}/{OFFICIAL_SOURCES[name].path}. Replace it "
        "with a newer upstream copy and update its row, or it is no longer official."
    )
    # A chat format serves that file's text.
    formats = (*chat_templates._CHAT_FORMATS.values(), chat_templates._LLAMA3_1)
    served = [chat_format.template for chat_format in formats]
    assert data.decode("utf-8") in served, f"no chat format serves templates/{name}.jinja"


def test_every_shipped_template_has_a_source_and_every_source_a_file():
    names = [entry.name for entry in official_templates.templates_folder().iterdir()]
    shipped = {name.removesuffix(".jinja") for name in names if name.endswith(".jinja")}
    assert shipped == set(OFFICIAL_SOURCES)


def test_a_copy_that_is_not_the_upstream_file_says_what_it_is():
    for name, source in OFFICIAL_SOURCES.items():
        assert source.verbatim or source.note, name
        assert len(source.sha256) == 64 and source.repo.count("/") == 1, name
    with pytest.raises(KeyError, match="not a shipped official template"):
        official_templates.official_template("qwen4")
