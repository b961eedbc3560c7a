"""Tests that need a device whose default draft shapes differ from the measured ones: the drafter
methods' defaults in the registry (demo/methods.py) replaced for the test."""

from __future__ import annotations

from dataclasses import replace

from demo.methods import DRAFT_METHODS, REGISTRY


def set_eagle_defaults(monkeypatch, device: str, greedy=None, sampled=None) -> None:
    """The drafter methods' first drafts on `device`: (k, tree) at T = 0 and at T > 0 (None: as they
    are; sampled="greedy": the T = 0 one at every temperature)."""
    for name in DRAFT_METHODS:
        method = REGISTRY[name]
        table = {d: (g, s) for d, g, s in method.defaults}
        g, s = table[device]
        g = greedy or g
        table[device] = (g, g if sampled == "greedy" else sampled or s)
        monkeypatch.setitem(REGISTRY, name, replace(method, defaults=tuple((d, *gs) for d, gs in table.items())))
