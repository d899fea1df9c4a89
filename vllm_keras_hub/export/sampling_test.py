import keras_hub
import pytest
from vllm import SamplingParams

from vllm_keras_hub.export import sampling


@pytest.mark.parametrize(
    "sampler, expected",
    [
        ("greedy", {"temperature": 0.0}),
        ("top_k", {"temperature": 1.0, "top_k": 5}),
        (
            keras_hub.samplers.TopKSampler(k=7, temperature=0.5, seed=3),
            {"temperature": 0.5, "top_k": 7, "seed": 3},
        ),
        (keras_hub.samplers.TopPSampler(p=0.9), {"temperature": 1.0, "top_p": 0.9}),
        (
            keras_hub.samplers.TopPSampler(p=0.8, k=20, temperature=0.7),
            {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
        ),
        (keras_hub.samplers.RandomSampler(temperature=0.3), {"temperature": 0.3}),
    ],
)
def test_sampler_translation(sampler, expected):
    kwargs = sampling.sampling_kwargs(sampler)
    assert kwargs == pytest.approx(expected)
    SamplingParams(**kwargs)  # vLLM accepts them as they are.


@pytest.mark.parametrize(
    "sampler", [keras_hub.samplers.BeamSampler(num_beams=2), "contrastive"]
)
def test_samplers_without_vllm_equivalent_are_refused(sampler):
    with pytest.raises(ValueError, match="no vLLM SamplingParams equivalent"):
        sampling.sampling_kwargs(sampler)


@pytest.mark.parametrize(
    "causal_lm, expected",
    [
        ("GemmaCausalLM", "GreedySampler"),
        ("Gemma3CausalLM", "GreedySampler"),
        ("GPT2CausalLM", "TopKSampler"),
        ("Llama3CausalLM", "TopKSampler"),
        ("QwenCausalLM", "TopKSampler"),
    ],
)
def test_default_sampler_is_the_concrete_class_default(causal_lm, expected):
    sampler = sampling.default_sampler(getattr(keras_hub.models, causal_lm))
    assert type(sampler).__name__ == expected


def test_generation_config_fields():
    assert sampling.generation_config_fields("greedy") == {
        "do_sample": False,
        "temperature": 0.0,
    }
    assert sampling.generation_config_fields(
        keras_hub.samplers.TopKSampler(k=5, seed=1)
    ) == {"do_sample": True, "temperature": 1.0, "top_k": 5}


@pytest.mark.parametrize("reverse", [False, True])
def test_gemma4_is_served_by_its_causal_lm_never_its_drafter(
    tmp_path, monkeypatch, reverse
):
    # KerasHub bug: `find_subclass` takes the first of a `set` of classes, so
    # `CausalLM.from_preset` on a Gemma4 preset builds `Gemma4CausalLM` or the
    # speculative-decoding drafter `Gemma4AssistantCausalLM` depending on the
    # process. Whatever the order, the served class is `Gemma4CausalLM`.
    from vllm_keras_hub.testing.presets import build_tiny_preset

    preset = build_tiny_preset("gemma4", str(tmp_path))
    candidates = [
        keras_hub.models.Gemma4AssistantCausalLM,
        keras_hub.models.Gemma4CausalLM,
    ]
    if reverse:
        candidates.reverse()
    monkeypatch.setattr(sampling, "list_subclasses", lambda cls: candidates)
    assert sampling.causal_lm_class(preset) is keras_hub.models.Gemma4CausalLM
