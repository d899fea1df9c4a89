"""Drafter presets: KerasHub tasks that only propose tokens for a target.

`Gemma4AssistantCausalLM` (the `gemma4_*_assistant` presets) conditions on
a Gemma4 target's last hidden state and reads the target's KV cache. vLLM
runs such a drafter as its `mtp` method, picked by the draft config's
Hugging Face model type (`gemma4_assistant`, rewritten to `gemma4_mtp` by
`SpeculativeConfig.hf_config_override`).
"""

# KerasHub drafter task -> the Hugging Face model type vLLM knows it by.
DRAFTER_TASKS = {"Gemma4AssistantCausalLM": "gemma4_assistant"}


def drafter_task(preset):
    """`(task class name, task config)` of a drafter preset, else `None`.

    Args:
        preset: A KerasHub preset (a Kaggle handle or a folder). An `hf://`
            checkpoint has no `task.json`, so it is read as no drafter.
    """
    from vllm_keras_hub.preset import Preset

    task = Preset.of(preset).task_config
    if task is None or task.get("class_name") not in DRAFTER_TASKS:
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
        "keras_hub_drafter": DRAFTER_TASKS[task],
        "backbone_hidden_size": int(config["backbone_hidden_size"]),
    }
