"""One way in: `export` prints what `serve` and `KerasHubLLM` set."""

import shlex

import pytest

from vllm_keras_hub import settings
from vllm_keras_hub.entrypoints import cli
from vllm_keras_hub.entrypoints.prepare import settings_as_flags
from vllm_keras_hub.export.model_folder import FolderConfig
from vllm_keras_hub.export.preset_folder import write_model_folder

PRESETS = {
    # Whole images a step (the image scheduler), and a video converter.
    "gemma4 bidirectional": lambda shared: shared.vision_preset("gemma4", bidirectional=True),
    # No encoder profile on the CPU.
    "qwen3_5 images": lambda shared: shared.vision_preset("qwen3_5"),
    # The chat format's tool and reasoning parsers.
    "qwen3 chat": lambda shared: shared.preset("qwen3", chat=True),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_printed_flags_are_what_serve_would_set(shared, tmp_path, capsys, name):
    """Parsed by `vllm serve`'s own parser, the printed flags leave nothing
    for `serve` to set: each setting it would set is there, with its value."""
    preset = PRESETS[name](shared)
    folder = str(tmp_path / "folder")
    cli.export(preset, folder)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "vllm serve" in x]
    argv = shlex.split(line)[3:]
    parser, _ = cli._serve_parser()
    args = vars(parser.parse_args(["serve", "placeholder", *argv]))
    given = {arg[2:].replace("-", "_") for arg in argv if arg.startswith("--")}
    # The tokenizer mode of the same export, not the flags'.
    config = FolderConfig(folder, write_model_folder(preset, str(tmp_path / "again")))
    wanted = settings.settle(config, {}, set())
    wanted.update(settings.chat_parser_flags(config, {}))
    assert len(wanted) > 3, wanted
    assert {name: args[name] for name in wanted} == wanted, line
    left = settings.settle(config, args, given)
    left.update(settings.chat_parser_flags(config, args))
    assert all(args[name] == value for name, value in left.items()), (line, left)


def test_flags_leave_out_vllms_defaults_and_quote_values():
    flags = settings_as_flags(
        {
            "tokenizer_mode": "auto",
            "load_format": "keras_hub",
            "disable_chunked_mm_input": True,
            "media_io_kwargs": {"video": {"num_frames": 2}},
        }
    )
    assert flags == (
        "--load-format keras_hub --disable-chunked-mm-input "
        "--media-io-kwargs '{\"video\": {\"num_frames\": 2}}'"
    )
