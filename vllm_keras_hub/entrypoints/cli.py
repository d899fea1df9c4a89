"""`vllm-keras-hub`: serve a KerasHub preset over vLLM's OpenAI API.

    vllm-keras-hub serve [MODEL] [any `vllm serve` flag]
    vllm-keras-hub export MODEL DIR
    vllm-keras-hub convert-lora MODEL ADAPTER.lora.h5

`serve` runs vLLM's own OpenAI-compatible server (`vllm serve`) on a model
folder written for MODEL: `keras_hub:<preset>` or a local preset folder; with
none, the default model, SmolLM2-135M-Instruct. `export` writes that folder
(no weights) so that plain `vllm serve DIR --load-format keras_hub` serves it.
`convert-lora` prints the PEFT folder of a KerasHub adapter, which plain
`vllm serve --lora-modules` takes.
"""

import argparse
import json
import os
import sys

DEFAULT_HOST = "127.0.0.1"


def _preset_of(model):
    """The preset a MODEL argument names, and the name to serve it under."""
    from vllm_keras_hub import smollm2
    from vllm_keras_hub.export import preset_folder

    if model is None:
        return smollm2.default_preset_dir(), smollm2.DEFAULT_MODEL_NAME
    preset = preset_folder.strip_prefix(model)
    if preset is None:
        if not os.path.isdir(os.path.expanduser(model)):
            raise preset_folder.PresetError(
                f"MODEL '{model}' is neither 'keras_hub:<preset>' nor a local "
                "preset folder (no such directory)."
            )
        preset = model
    return preset, model


def _serve_parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm-keras-hub")
    subparsers = parser.add_subparsers(dest="subparser", required=True)
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    return parser, command


def _convert_lora_modules(preset, args):
    """Points each `--lora-modules` KerasHub `.lora.h5` file at its vLLM
    folder, converting it before the engine starts (`lora/adapters.py`)."""
    import dataclasses

    from vllm_keras_hub.lora import adapters as lora_adapters

    for index, module in enumerate(args.lora_modules or ()):
        if lora_adapters.is_keras_hub_adapter(module.path):
            folder = lora_adapters.peft_folder(
                preset, os.path.abspath(module.path), args.max_lora_rank
            )
            args.lora_modules[index] = dataclasses.replace(module, path=folder)


def serve(model, vllm_argv):
    """Serves MODEL with vLLM's OpenAI-compatible server, in this process.

    vLLM parses `vllm_argv` exactly as `vllm serve` does. Where they are not
    given, this sets `--load-format keras_hub`, the folder's tokenizer mode,
    `--host 127.0.0.1`, `--served-model-name MODEL`, on CPU a 2 GiB KV cache,
    the chat format's tool call and reasoning parsers (printed), and for the
    default model `--dtype float32`. `--lora-weights FILE` (ours,
    not vLLM's) merges a KerasHub `.lora.h5` adapter into the kernels at
    load. With `--enable-lora`, `--lora-modules NAME=FILE.lora.h5` serves
    KerasHub adapters per request (the OpenAI `model` field picks one). Like
    `vllm serve`, it runs the model under torch.compile unless
    `--enforce-eager` is given (vLLM turns it off on the CPU with LoRA).

    Args:
        model: `keras_hub:<preset>`, a local preset folder, or `None`.
        vllm_argv: Further `vllm serve` flags.
    """
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    from vllm_keras_hub import settings
    from vllm_keras_hub.entrypoints.prepare import prepare
    from vllm_keras_hub.plugin import register

    preset, served_name = _preset_of(model)
    ours = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ours.add_argument("--lora-weights")
    own_args, vllm_argv = ours.parse_known_args(vllm_argv)
    register()
    cli_env_setup()
    parser, command = _serve_parser()
    args = parser.parse_args(["serve", "placeholder", *vllm_argv])
    given = {
        arg.split("=", 1)[0][2:].replace("-", "_")
        for arg in vllm_argv
        if arg.startswith("--")
    }
    # Reads the preset: a bad MODEL is named before any adapter of it is read.
    prepared = prepare(preset, vars(args), given, own_args.lora_weights)
    try:
        updates = {**prepared.updates, **settings.chat_parser_flags(prepared.folder, vars(args))}
        for name, value in updates.items():
            setattr(args, name, value)
        chosen = _parser_flags(updates)
        if chosen:
            print(f"vllm-keras-hub: the chat format's parsers: {chosen}", file=sys.stderr)
        _convert_lora_modules(preset, args)
        args.model = args.model_tag = prepared.folder.path
        if args.host is None:
            args.host = DEFAULT_HOST
        if not args.served_model_name:
            args.served_model_name = [served_name]
        if model is None and "dtype" not in given:
            # The default model's own (float32) weights: in bfloat16 this 135M
            # model's near-tied answers flip ("What is the capital of France?").
            args.dtype = "float32"
        configure_logging_from_args(args)
        command.validate(args)
        command.cmd(args)
    finally:
        prepared.cleanup()


def _parser_flags(values):
    """The `vllm serve` flags of the parsers in `values`, as one string."""
    flags = []
    if values.get("tool_call_parser"):
        flags.append(f"--enable-auto-tool-choice --tool-call-parser {values['tool_call_parser']}")
    if values.get("reasoning_parser"):
        flags.append(f"--reasoning-parser {values['reasoning_parser']}")
    return " ".join(flags)


def export(model, directory):
    """Writes the model folder of MODEL into `directory` (new or empty), and
    prints the `vllm serve` flags `serve` would set for it."""
    from vllm_keras_hub import settings
    from vllm_keras_hub.entrypoints.prepare import settings_as_flags
    from vllm_keras_hub.export.model_folder import FolderConfig
    from vllm_keras_hub.export.preset_folder import write_model_folder

    preset, _ = _preset_of(model)
    os.makedirs(directory, exist_ok=True)
    if os.listdir(directory):
        raise FileExistsError(f"Export folder '{directory}' is not empty.")
    folder = FolderConfig(directory, write_model_folder(preset, directory))
    updates = settings.settle(folder, {}, set())
    updates.update(settings.chat_parser_flags(folder, {}))
    flags = settings_as_flags(updates)
    print(f"Wrote {directory}. Serve it with vLLM (vllm-keras-hub installed):")
    print(f"  vllm serve {directory} {flags}")
    print(f"  python -m vllm.entrypoints.openai.api_server --model {directory} {flags}")
    if folder.pooling:
        print(
            f"A {folder.pooling['task']}: vLLM serves it with its pooling runner "
            f"({folder.pooling_task.endpoint})."
        )


def convert_lora(model, adapter):
    """Prints the vLLM (PEFT) folder of KerasHub adapter `adapter` for MODEL.

    For plain `vllm serve --lora-modules` and vLLM's runtime
    `/v1/load_lora_adapter`, which take PEFT folders only.
    """
    from vllm_keras_hub.lora import adapters as lora_adapters

    preset, _ = _preset_of(model)
    largest = lora_adapters.VLLM_MAX_LORA_RANKS[-1]
    folder = lora_adapters.peft_folder(preset, os.path.abspath(adapter), largest)
    with open(os.path.join(folder, "adapter_config.json")) as f:
        rank = json.load(f)["r"]
    print(folder)
    print(f"Serve it with --enable-lora --max-lora-rank {lora_adapters._needed_rank(rank)} "
          f"(its largest rank as a standard LoRA is {rank}).", file=sys.stderr)  # fmt: skip


def main(argv=None):
    """Entry point of the `vllm-keras-hub` command."""
    from vllm_keras_hub import backend

    # Before anything imports Keras: a user's fresh shell names no backend.
    try:
        backend.default_to_torch()
    except ImportError as e:  # keras-hub is not installed
        print(f"vllm-keras-hub: error: {e}", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vllm-keras-hub",
        description="Serve KerasHub causal LMs through vLLM.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser(
        "serve",
        help="serve MODEL over vLLM's OpenAI-compatible API",
        description="MODEL is keras_hub:<preset> or a local preset folder "
        "(default: SmolLM2-135M-Instruct). --lora-weights FILE merges a KerasHub "
        "LoRA adapter (.lora.h5) into its kernels at load. Every other flag is a "
        "`vllm serve` flag (--port, --max-model-len, --api-key, --chat-template, ...).",
    )
    serve_parser.add_argument("model", nargs="?")
    export_parser = commands.add_parser(
        "export", help="write the model folder of MODEL for plain `vllm serve`"
    )
    export_parser.add_argument("model")
    export_parser.add_argument("directory")
    convert_parser = commands.add_parser(
        "convert-lora",
        help="print the vLLM (PEFT) folder of a KerasHub .lora.h5 adapter of MODEL",
    )
    convert_parser.add_argument("model")
    convert_parser.add_argument("adapter")

    # Everything after MODEL belongs to vLLM's own parser.
    if argv[:1] == ["serve"]:
        model = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
        rest = argv[2:] if model is not None else argv[1:]
        if any(flag in ("-h", "--help") for flag in rest[:1]) and model is None:
            serve_parser.print_help()
            return 0
        args = argparse.Namespace(command="serve", model=model, rest=rest)
    else:
        args = parser.parse_args(argv)

    from vllm_keras_hub.export.preset_folder import PresetError
    from vllm_keras_hub.hybrid_settings import UnsupportedHybridConfigError
    from vllm_keras_hub.lora.adapters import UnsupportedLoraError
    from vllm_keras_hub.lora.merged import LoraAdapterError
    from vllm_keras_hub.families import UnsupportedFamilyError
    from vllm_keras_hub.parallel_settings import UnsupportedParallelismError
    from vllm_keras_hub.settings import UnsupportedPoolingSettingError
    from vllm_keras_hub.settings import UnsupportedImageServingError
    from vllm_keras_hub.speculative import UnsupportedSpeculativeConfigError
    from vllm_keras_hub.tasks import PoolingTaskError

    try:
        if args.command == "serve":
            serve(args.model, args.rest)
        elif args.command == "convert-lora":
            convert_lora(args.model, args.adapter)
        else:
            export(args.model, args.directory)
    except (
        PresetError,
        PoolingTaskError,
        UnsupportedPoolingSettingError,
        UnsupportedFamilyError,
        UnsupportedParallelismError,
        UnsupportedHybridConfigError,
        UnsupportedImageServingError,
        LoraAdapterError,
        UnsupportedLoraError,
        UnsupportedSpeculativeConfigError,
        FileExistsError,
    ) as e:
        print(f"vllm-keras-hub: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
