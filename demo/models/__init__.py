"""Loading what the engine runs: targets, drafter checkpoints, the hub, presets, prompts."""
