"""Fixtures the service tests share."""

from __future__ import annotations

import time

import pytest

from demo.engine import Engine


@pytest.fixture
def slow_steps(monkeypatch, request):
    """Every engine step takes the test module's STEP_S more wall time, as a real model's would on 2
    cores."""
    step_s = request.module.STEP_S
    original = Engine.generate

    def slow(self, prompt_ids, gen):
        for event in original(self, prompt_ids, gen):
            yield event
            time.sleep(step_s)

    monkeypatch.setattr(Engine, "generate", slow)
