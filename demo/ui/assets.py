"""The page's files under assets/: its CSS, its script, its prose and its example prompts."""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CSS_PATH = ASSETS / "style.css"


def read_asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def example_prompts() -> list[str]:
    return json.loads(read_asset("examples.json"))
