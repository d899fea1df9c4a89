"""One way in: what `serve` and `KerasHubLLM` both do before vLLM starts.

The preset's model folder is written, every engine setting is checked
against it (refused with the reason before an engine starts), and the
settings it needs are returned for the caller to set where the user did
not. `export` prints the same settings as `vllm serve` flags
(`settings_as_flags`). The model classes check the engine's settings again
in every engine process (`settings.check`), for the plain `vllm` path.
"""

import dataclasses
import json
import shlex

from vllm_keras_hub import settings
from vllm_keras_hub import speculative
from vllm_keras_hub.export.model_folder import ModelFolder


@dataclasses.dataclass
class Prepared:
    """A preset made ready for vLLM.

    Attributes:
        folder: The preset's `ModelFolder`.
        draft: A KerasHub draft's `ModelFolder`, or `None`.
        updates: The engine arguments to set, by name.
    """

    folder: ModelFolder
    draft: ModelFolder | None
    updates: dict

    def cleanup(self):
        """Lets go of both folders."""
        for folder in (self.folder, self.draft):
            if folder is not None:
                folder.cleanup()


def prepare(preset, values, given, lora_weights=None):
    """Writes `preset`'s model folder and settles the engine settings.

    Args:
        preset: Anything `keras_hub.models.CausalLM.from_preset` accepts.
        values: The user's vLLM engine arguments by name.
        given: The names of the arguments the user set.
        lora_weights: A KerasHub `.lora.h5` adapter to merge at load, read
            after the preset, so a bad preset is named first.

    Returns:
        A `Prepared`; the caller keeps it until the engine stops.

    Raises:
        The refusals of `settings.settle`, `pipeline.check_stages` and
        `speculative.settle`, naming the setting and why; the folders are
        let go first.
    """
    folder = ModelFolder(preset, max_model_len=values.get("max_model_len"))
    prepared = Prepared(folder, None, {})
    try:
        if lora_weights is not None:
            from vllm_keras_hub.lora.merged import adapter_loader_config

            extra = adapter_loader_config(lora_weights, values.get("model_loader_extra_config"))
            values = {**values, "model_loader_extra_config": extra}
        prepared.updates = settings.settle(folder, values, given)
        # After the preset is read, so Keras runs on the backend chosen then.
        from vllm_keras_hub.models import pipeline

        pipeline.check_stages(folder.preset, values.get("pipeline_parallel_size"))
        updates, prepared.draft = speculative.settle(folder, values)
        prepared.updates.update(updates)
        if lora_weights is not None:
            prepared.updates["model_loader_extra_config"] = extra
    except BaseException:
        prepared.cleanup()
        raise
    return prepared


def settings_as_flags(updates):
    """`updates` as `vllm serve` flags, leaving out vLLM's own defaults.

    Args:
        updates: Engine (and server) arguments by name, as `settle` and
            `chat_parser_flags` return them.
    """
    from vllm.engine.arg_utils import EngineArgs

    defaults = {field.name: field.default for field in dataclasses.fields(EngineArgs)}
    flags = []
    for name, value in updates.items():
        if name in defaults and defaults[name] == value:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, dict):
            flags.append(f"{flag} {shlex.quote(json.dumps(value))}")
        else:
            flags.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(flags)
