"""The app's settings from environment variables, read in one place: what a Hugging Face Space sets
in its Settings -> Variables (app.py applies them; command-line flags win where both exist).

    SPECLENS_PRESET          the preset the app starts with (demo/models/presets.py; default: the embedded one)
    SPECLENS_METHOD          the method the page offers first: none, ngram, eagle or eagle3 (default: EAGLE-3 if loaded)
    SPECLENS_K               k the page offers first, 1-10 (default: the device's fastest draft)
    SPECLENS_MAX_NEW_TOKENS  max new tokens the page offers first, 1-2048 and at most what the model's
                             context leaves a reply (1,920 of the default's 2,048) (default 128)
    SPECLENS_QUEUE_SIZE      events Gradio's queue holds, 1-1000 (default demo.service.hosting.QUEUE_MAX_SIZE)

The /generate API keeps its documented defaults; these change the page only. A bad value stops the
app at start with one line naming the variable, its value and what is allowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from demo.methods import APP_MAX_SPEC_TOKENS, METHOD_LABELS, METHODS
from demo.service.hosting import QUEUE_MAX_SIZE
from demo.service.request import LIMITS, most_new_tokens

ENV = {"preset": "SPECLENS_PRESET", "method": "SPECLENS_METHOD", "k": "SPECLENS_K",
       "max_new_tokens": "SPECLENS_MAX_NEW_TOKENS", "queue_size": "SPECLENS_QUEUE_SIZE"}
MAX_QUEUE_SIZE = 1000  # more waiting events than a 2-core Space could answer in an hour


class SettingsError(ValueError):
    """A SPECLENS_* variable with a value the app cannot use; the message is one line."""


@dataclass(frozen=True)
class AppSettings:
    """What the page offers first, and the queue's size. None: the app's own default."""

    preset: str | None = None
    method: str | None = None
    k: int | None = None
    max_new_tokens: int | None = None
    queue_size: int = QUEUE_MAX_SIZE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "AppSettings":
        """The settings the SPECLENS_* variables of `environ` (default: os.environ) give; an unset or
        empty variable keeps the default. Raises SettingsError."""
        env = os.environ if environ is None else environ
        raw = {field: env.get(name, "").strip() for field, name in ENV.items()}
        values: dict = {}
        if raw["preset"]:
            from demo.models.presets import PRESETS

            if raw["preset"] not in PRESETS:
                raise _error("preset", raw["preset"], "one of " + ", ".join(repr(n) for n in PRESETS))
            values["preset"] = raw["preset"]
        if raw["method"]:
            if raw["method"] not in METHODS:
                raise _error("method", raw["method"], "one of " + ", ".join(
                    f"{m} ({METHOD_LABELS[m]})" for m in METHODS))
            values["method"] = raw["method"]
        for field, (lo, hi) in (("k", (1, APP_MAX_SPEC_TOKENS)), ("max_new_tokens", LIMITS["max_new_tokens"]),
                                ("queue_size", (1, MAX_QUEUE_SIZE))):
            if raw[field]:
                values[field] = _whole(field, raw[field], lo, hi)
        return cls(**values)

    def check(self, methods: list[str], model: str, max_context: int | None = None) -> None:
        """The method must be one the loaded models have (methods: Session.methods()), and max new
        tokens at most what the page offers on their context (most_new_tokens: the prompt shares it)."""
        if self.method is not None and self.method not in methods:
            raise _error("method", self.method, f"one {model} has loaded: " + ", ".join(methods))
        if self.max_new_tokens is not None and max_context is not None:
            most = most_new_tokens(max_context)
            if self.max_new_tokens > most:
                raise _error("max_new_tokens", str(self.max_new_tokens),
                             f"at most {most} on {model}, whose {max_context}-token context also holds the prompt")


def _whole(field: str, value: str, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        raise _error(field, value, f"a whole number from {lo} to {hi}")
    return n


def _error(field: str, value: str, allowed: str) -> SettingsError:
    return SettingsError(f"{ENV[field]}={value!r} is not allowed: {allowed}.")
