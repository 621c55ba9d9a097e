"""Trajectory shapes recorded from the embedded SmolLM2-135M (hf engine, markdown tools, temperature 0.8,
max 200 tokens a turn, 400 a trajectory) on 12 short math questions: (prompt tokens, tokens per turn,
tool-response tokens after each turn but the last, tool seconds after each turn but the last).
SmolLM2 made no tool call in these runs, so every shape is one turn; `--db` replays a richer store."""

SMOLLM2_SAMPLE = [
    (161, [200], [], []), (162, [200], [], []), (160, [146], [], []), (165, [200], [], []),
    (163, [144], [], []), (165, [60], [], []), (160, [200], [], []), (162, [200], [], []),
    (164, [137], [], []), (166, [200], [], []), (160, [83], [], []), (164, [200], [], []),
]
