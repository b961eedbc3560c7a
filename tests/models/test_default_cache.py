"""The embedded default's cache (demo/models/loading.py): made once from the GGUF, and safe when two
first starts make it at the same time. The GGUF conversion is faked (no weights, no transformers
load): what is tested is how the cache directory is written."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import transformers

from demo.models import loading

FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


class FakeModel:
    """Stands in for the dequantized model: save_pretrained writes its files slowly."""

    def __init__(self, barrier: threading.Barrier | None):
        self.barrier = barrier
        self.config = type("Config", (), {})()

    def save_pretrained(self, out):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)  # as transformers does: create, then write file by file
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # both starts are writing at once
        (out / "config.json").write_text("{}")
        time.sleep(0.2)
        (out / "model.safetensors").write_bytes(b"weights")


class FakeTokenizer:
    def save_pretrained(self, out):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        time.sleep(0.1)
        (out / "tokenizer_config.json").write_text("{}")


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """An empty cache under tmp_path and a GGUF 'conversion' that writes FILES; returns a setter for
    the barrier both writers meet at."""
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(loading, "default_gguf_path", lambda: tmp_path / "model.gguf")
    state = {"barrier": None, "conversions": 0}

    class Auto:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            state["conversions"] += 1
            return FakeModel(state["barrier"])

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", Auto)
    monkeypatch.setattr(transformers, "AutoTokenizer", type("Tok", (), {"from_pretrained": staticmethod(
        lambda *a, **k: FakeTokenizer())}))
    return state


def test_two_first_starts_at_once_both_get_the_complete_cache(fake_conversion):
    fake_conversion["barrier"] = threading.Barrier(2)
    results, errors = [], []

    def start():
        try:
            results.append(loading.default_target_dir())
        except Exception as e:  # noqa: BLE001 (the test reports what a start raised)
            errors.append(repr(e))

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 2 and results[0] == results[1]
    out = results[0]
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # complete, and nothing of the other writer
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary directory left behind


def test_a_cache_left_incomplete_by_an_interrupted_start_is_replaced(fake_conversion):
    out = Path(loading.cache_dir()) / "smollm2-135m-instruct"
    out.mkdir()
    (out / "config.json").write_text("{}")  # the model's files, no tokenizer: interrupted
    assert loading.default_target_dir() == out
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_a_complete_cache_is_used_without_converting_again(fake_conversion):
    out = loading.default_target_dir()
    assert loading.default_target_dir() == out and fake_conversion["conversions"] == 1
