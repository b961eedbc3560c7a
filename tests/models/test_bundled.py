"""The bundled drafters load with the embedded target and really draft (real weights, CPU; that the
output is lossless is proven for any drafter in test_engine.py)."""

import pytest

from demo.config import GenerationConfig
from demo.engine import Engine
from demo.metrics import AcceptanceStats
from demo.models.checkpoints import load_drafter
from demo.models.presets import bundled_drafter_dir
from demo.models.prompts import chat_ids
from demo.target import Target

PROMPTS = ["Write a haiku about the sea.", "List five tips for learning a new language.",
           "What is the capital of Japan, and what is it famous for?"]


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_bundled_drafters_load_and_accept_drafts(default_target, method):
    hf, tok = default_target
    target = Target(hf)
    drafter = load_drafter(str(bundled_drafter_dir(method)), target)
    assert drafter.cfg.method == method and not drafter.cfg.warnings
    engine = Engine(target, drafter, max_context=512)
    totals = AcceptanceStats(reach=3)
    for text in PROMPTS:
        ids = chat_ids(tok, [{"role": "user", "content": text}])
        events = list(engine.generate(ids, GenerationConfig(max_new_tokens=64, num_spec_tokens=3)))
        totals.merge(events[-1].stats)
    # the bar: EAGLE-3 > 2.0 here. A random drafter of this shape stays at 1.0; what the shipped
    # drafters reach on this CPU is in docs/RESULTS.md ("The shipped heads")
    assert totals.mean_acceptance_length > {"eagle3": 2.0, "eagle": 1.6}[method]
