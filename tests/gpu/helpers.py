"""What the GPU tests share: the prompt they decode, a reply's tokens, and the drafter of a method.
(tests/gpu has no __init__.py: import this as `from tests.gpu.helpers import ...`.)"""

from demo.config import GenerationConfig
from tests.tiny import corrupted_oracle, tiny_drafter

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def reply_tokens(engine, prompt, **gen):
    """Every token engine.generate emits for `prompt` under GenerationConfig(**gen)."""
    return [t for e in engine.generate(prompt, GenerationConfig(**gen)) for t in e.token_ids]


def make_drafter(method, target, table):
    """The proposer (or drafter) of `method` for `target`: None for "none", the n-gram lookup for
    "ngram", an oracle of `table` wrong every 5th token for "oracle", else a random drafter (EAGLE-3's
    with a 128-token draft vocabulary)."""
    if method == "oracle":
        return corrupted_oracle(table, target, every=5)
    if method == "ngram":
        from demo.proposers import NgramProposer

        return NgramProposer()
    return None if method == "none" else tiny_drafter(method, target, draft_vocab_size=128 if method == "eagle3" else 0)
