"""The drafter class of each drafting method (demo/methods.py names the methods)."""

from __future__ import annotations

from demo.drafter_common import EAGLE1, EAGLE3
from demo.drafter_eagle import EagleDrafter
from demo.drafter_eagle3 import Eagle3Drafter

DRAFTER_CLASSES = {EAGLE1: EagleDrafter, EAGLE3: Eagle3Drafter}
