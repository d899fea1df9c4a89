"""Drafter presets: KerasHub tasks that only propose tokens for a target.

A drafter task (a family's `Family.drafters`, e.g. Gemma4's assistant)
conditions on its target's last hidden state and reads the target's KV
cache. vLLM runs such a drafter as its `mtp` method, picked by the draft
config's Hugging Face model type (`Drafter.model_type`).
"""

from vllm_keras_hub import families


def drafter_task(preset):
    """`(task class name, task config)` of a drafter preset, else `None`.

    Args:
        preset: A KerasHub preset (a Kaggle handle or a folder). An `hf://`
            checkpoint has no `task.json`, so it is read as no drafter.
    """
    from vllm_keras_hub.preset import Preset

    task = Preset.of(preset).task_config
    if task is None or task.get("class_name") not in families.DRAFTERS:
        return None
    return task["class_name"], task.get("config", {})


def drafter_fields(preset):
    """The `config.json` fields of a drafter preset; `{}` for any other.

    Args:
        preset: As for `drafter_task`.
    """
    found = drafter_task(preset)
    if found is None:
        return {}
    task, config = found
    return {
        "keras_hub_drafter": families.DRAFTERS[task].model_type,
        "backbone_hidden_size": int(config["backbone_hidden_size"]),
    }
