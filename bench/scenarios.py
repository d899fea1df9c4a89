"""What each benchmark run asks of a system: prompts, lengths, sizes.

No prompt is used twice in a run, so vLLM's prefix cache never serves a
timed prompt from an earlier one.
"""

import random

# Sizes of one run. Output lengths of the concurrent cases cycle through
# `mixed_lengths`; the single-request case uses `single_tokens`.
SIZES = {
    "full": dict(
        single_tokens=32,
        single_repeats=3,
        ttft_repeats=3,
        concurrency=(8, 32),
        # Each concurrent case runs this many times on new prompts (vLLM
        # systems; the slow generate() systems once): the median counts.
        repeats=3,
        mixed_lengths=(8, 16, 24, 32),
        # Each concurrency runs `serve_repeats` times, each on new random
        # prompts (another seed), `serve_prompts_per_slot` per concurrent
        # slot; the median run counts.
        serve_concurrency=(8, 32),
        serve_repeats=3,
        serve_prompts_per_slot=4,
        serve_input_len=32,
        serve_output_len=32,
    ),
    "quick": dict(
        single_tokens=8,
        single_repeats=1,
        ttft_repeats=1,
        concurrency=(8,),
        repeats=1,
        mixed_lengths=(4, 8),
        serve_concurrency=(2,),
        serve_repeats=1,
        serve_prompts_per_slot=2,
        serve_input_len=16,
        serve_output_len=8,
    ),
}

# Distinct openings, so no two prompts share a prefix-cache block.
_TOPICS = [
    "Volcanoes", "Honeybees", "The Roman Empire", "Quantum computing",
    "Sourdough bread", "Jazz music", "Mount Everest", "Photosynthesis",
    "Chess openings", "The printing press", "Coral reefs", "Electric cars",
    "Ancient Egypt", "Black holes", "Origami", "The human heart",
    "Renewable energy", "Penguins", "The Silk Road", "Impressionist painting",
    "Rainforests", "Typewriters", "Solar eclipses", "Coffee farming",
    "Lighthouses", "Marathon running", "Glaciers", "Octopuses",
    "Medieval castles", "Wind turbines", "Tea ceremonies", "Submarines",
    "Desert plants", "Hot air balloons", "The Moon landing", "Bicycles",
    "Tornadoes", "Violins", "Bonsai trees", "Deep sea fish",
    "Railways", "Snowflakes", "Libraries", "Fireflies",
    "The Great Wall", "Cheese making", "Satellites", "Tidal pools",
    "Kites", "Lightning", "Sea turtles", "Windmills", "Maple syrup", "Comets",
    "Beekeeping suits", "Paper money", "Hummingbirds", "Canals", "Compasses",
    "Mushrooms",
]  # fmt: skip
_TASKS = [
    "Explain it briefly.",
    "Write a short paragraph about it for a curious child.",
    "Describe three surprising facts about it, one per line, with a short "
    "reason for each.",
    "Give a detailed overview of its history, how it works or lives, why "
    "people care about it today, and one open question that experts still "
    "argue about.",
]
# Token-id prompts: the text prompts' lengths, ids the tiny test tokenizers
# of the random models all have.
_TASK_TOKENS = (8, 16, 28, 45)
_ID_RANGE = (4, 500)


def prompt_pool(text):
    """Distinct prompts of mixed length (about 8 to 45 tokens).

    Every topic with every task, the tasks cycling, so lengths mix in any
    slice of the pool. Prompts of one topic share only their first few
    tokens, less than a KV-cache block.

    Args:
        text: Strings if true, else lists of token ids.
    """
    pairs = [
        (topic, (i + round_) % len(_TASKS))
        for round_ in range(len(_TASKS))
        for i, topic in enumerate(_TOPICS)
    ]
    if text:
        return [f"{topic}: {_TASKS[task]}" for topic, task in pairs]
    rng = random.Random(0)
    return [
        [rng.randrange(*_ID_RANGE) for _ in range(_TASK_TOKENS[task])]
        for _, task in pairs
    ]


def plan(size, text=True, repeats=None):
    """The prompts and output lengths of each scenario.

    Args:
        size: A key of `SIZES`.
        text: Text prompts, or token ids.
        repeats: Runs of each concurrent case; the size's by default.

    Returns:
        `{"ttft": [...], "single": [...], "warmup": [...], "c8": [[(prompt,
        max_new_tokens), ...], ...], ...}`, one request list per run.
    """
    s = SIZES[size]
    repeats = s["repeats"] if repeats is None else repeats
    prompts = prompt_pool(text)
    # Latency prompts all have the same task (index 1), so about the same length.
    medium = prompts[1 : len(_TOPICS) : len(_TASKS)]
    ttft = medium[: s["ttft_repeats"]]
    single = medium[s["ttft_repeats"] : s["ttft_repeats"] + s["single_repeats"]]
    used = {id(p) for p in ttft + single}
    rest = iter(p for p in prompts if id(p) not in used)
    take = lambda n: [next(rest) for _ in range(n)]  # noqa: E731
    scenarios = {"ttft": ttft, "single": single, "warmup": take(4)}
    lengths = s["mixed_lengths"]
    for n in s["concurrency"]:
        scenarios[f"c{n}"] = [
            [(p, lengths[i % len(lengths)]) for i, p in enumerate(take(n))]
            for _ in range(repeats)
        ]
    return scenarios
