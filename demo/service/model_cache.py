"""Loaded models, shared by every visitor of the app.

- ``Models`` is one target with a drafter per method ("eagle", "eagle3"), loaded together. Engines
  are made on first use per (mode, method) and share the target (and its KV cache: one generation
  at a time); a new drafter reaches its engines through ``Engine.set_proposer``, so the target is
  not reloaded.
- ``ModelCache`` holds the loaded ``Models`` by preset name, shared read-only by every visitor of
  the app; a visitor's choice of preset only picks the entry its own requests use. Past a memory
  budget the least recently used entry goes, never the default (the models the app started with).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from demo.drafter_common import DrafterConfig, drafter_dtype, drafter_int8
from demo.drafters import DRAFTER_CLASSES
from demo.engine import Engine
from demo.methods import DRAFT_METHODS, METHOD_LABELS, REGISTRY, dtype_label
from demo.proposers import proposer_for
from demo.service import zerogpu
from demo.service.engine_thread import run_on_engine_thread
from demo.service.request import RequestError
from demo.target import Target

RANDOM_INIT = "random-init (untrained)"
REPO = Path(__file__).resolve().parents[2]


def shown_source(label: str) -> str:
    """A model's source as a page, a trace or a visitor reads it: a hub id or a label as it is, a local
    directory of this checkout relative to it (assets/drafters/...), any other local path by its last
    part: the server's own paths stay on the server."""
    path = Path(label)
    if not path.is_absolute():
        return label
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name

Progress = Callable[[float, str], None]  # (fraction done, what is happening)

# Memory the ModelCache may hold (weights and KV caches of every entry), by device kind: on a CPU
# the embedded default is the only preset that fits anyway; on a GPU a fraction of its memory, so
# activations and CUDA graphs keep the rest.
MODEL_CACHE_BYTES = {"cpu": 4 * 2**30}
MODEL_CACHE_GPU_FRACTION = 0.75


@dataclass
class ModelChoice:
    """Which target and drafters to load: preset names resolved to specs (paths or hub ids)."""

    name: str
    target: str = "default"
    drafters: dict[str, str | None] = field(default_factory=dict)  # method -> spec; None: none
    fallback: bool = True  # a drafter that cannot be loaded becomes a random-init one (with a warning)
    missing: dict[str, str] = field(default_factory=dict)  # method -> why its drafter is known to be absent


def preset_choice(name: str | None = None) -> ModelChoice:
    """A ModelChoice for a preset of demo/models/presets.py (the default preset when name is None)."""
    from demo.models.checkpoints import DrafterLoadError
    from demo.models.presets import DEFAULT_PRESET, get_preset

    preset = get_preset(name or DEFAULT_PRESET)
    drafters, missing = {}, {}
    for method in DRAFT_METHODS:
        try:
            drafters[method] = preset.drafter(method) if method in preset.methods else None
        except DrafterLoadError:  # a bundled drafter not built yet
            drafters[method] = str(getattr(preset, method))
            missing[method] = f"the bundled drafter is not built yet ({drafters[method]} has no config.json)"
    return ModelChoice(name=preset.name, target=preset.target, drafters=drafters, missing=missing)


def preset_names() -> list[str]:
    from demo.models.presets import DEFAULT_PRESET, PRESETS

    return [DEFAULT_PRESET] + [n for n in PRESETS if n != DEFAULT_PRESET]


def random_drafter(method: str, target: Target):
    """An untrained drafter shaped like one target layer: the app still runs (acceptance near 0)."""
    cfg = DrafterConfig.for_target(method, target.config)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return DRAFTER_CLASSES[method](cfg)


class Models:
    """One target and a drafter per method, loaded together, with the engines made for them."""

    def __init__(self, hf_model, tokenizer, drafters: dict | None = None, *, name: str, target_spec: str,
                 max_context: int, drafter_labels: dict | None = None):
        self.tokenizer, self.name, self.target_spec = tokenizer, name, target_spec
        self.target = Target(hf_model)
        self.max_context_asked = max_context
        self.max_context = min(max_context, self.target.config.max_position_embeddings)
        # how more models like these load (the device and dtype as asked: "auto" stays "auto")
        self.load_args = dict(device=str(self.device), dtype=dtype_label(self.target.dtype))
        self._engines: dict[tuple[str, str], Engine] = {}
        self.token_text_cache: dict[int, str] = {}  # token id -> its text alone (Session.token_texts)
        self.draft_text_cache: dict[tuple[int, ...], str] = {}  # draft ids -> their text (Session.draft_texts)
        self.drafters: dict = {m: None for m in DRAFT_METHODS}
        self.drafter_labels: dict[str, str] = {m: "none" for m in DRAFT_METHODS}
        self.drafter_warnings: dict[str, list[str]] = {m: [] for m in DRAFT_METHODS}
        for method, drafter in (drafters or {}).items():
            self.set_drafter(method, drafter, (drafter_labels or {}).get(method, "custom"))

    @property
    def warnings(self) -> list[str]:
        return [w for m in DRAFT_METHODS for w in self.drafter_warnings[m]]

    @property
    def device(self) -> torch.device:
        return self.target.device

    def set_drafter(self, method: str, drafter, label: str, warnings: list[str] = ()) -> None:
        """Use `drafter` for `method` in every engine made for it, without touching the target."""
        self.drafters[method] = drafter
        self.drafter_labels[method] = label if drafter is not None else "none"
        self.drafter_warnings[method] = list(warnings)
        for (mode, m), engine in self._engines.items():
            if m == method:
                engine.set_proposer(proposer_for(method, drafter) if drafter is not None else None)

    def methods(self) -> list[str]:
        """The methods a request can use now, in the registry's order: those that load nothing, and
        each whose drafter is loaded."""
        return [m for m, spec in REGISTRY.items() if not spec.needs_drafter or self.drafters[m] is not None]

    @property
    def nbytes(self) -> int:
        """Memory these models hold: weights (shared storage counted once) and the KV cache."""
        tensors = [*self.target.hf.parameters(), *self.target.hf.buffers()]
        for drafter in self.drafters.values():
            if isinstance(drafter, torch.nn.Module):
                tensors += [*drafter.parameters(), *drafter.buffers()]
        cache = getattr(self.target, "cache", None)
        tensors += [t for t in vars(cache).values() if isinstance(t, torch.Tensor)] if cache is not None else []
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def engine(self, method: str, mode: str) -> Engine:
        key = (mode, method)
        if key not in self._engines:
            proposer = proposer_for(method, self.drafters.get(method))
            self._engines[key] = Engine(self.target, proposer, mode=mode, max_context=self.max_context,
                                        drafter_dtype=drafter_dtype(self.target.dtype, self.target.device),
                                        drafter_int8=drafter_int8(self.target.dtype, self.target.device))
            if zerogpu.active():  # its buffers and graphs live for one call of the GPU
                zerogpu.per_call(self._engines[key])
        return self._engines[key]

    def describe(self) -> dict:
        return {"model": self.name, "device": str(self.device), "dtype": dtype_label(self.target.dtype),
                "max_context": self.max_context,
                "drafters": {m: shown_source(label) for m, label in self.drafter_labels.items()},
                "vocab_size": self.target.config.vocab_size,
                "draft_vocab": {m: d.drafting_vocab for m, d in self.drafters.items() if d is not None}}

    @classmethod
    def load(cls, choice: ModelChoice, *, device: str = "auto", dtype: str = "auto", max_context: int = 2048,
             progress: Progress | None = None) -> "Models":
        """The target and drafters `choice` names, loaded (a drafter that fails: see load_drafters)."""
        from demo.models.loading import load_target

        say = progress or (lambda f, d: None)
        say(0.0, f"loading target {choice.target}")
        hf, tok = load_target(choice.target, device, dtype)
        models = cls(hf, tok, name=choice.name, target_spec=choice.target, max_context=max_context)
        models.load_args = dict(device=device, dtype=dtype)
        models.load_drafters(choice, progress=say)
        return models

    def load_drafters(self, choice: ModelChoice, progress: Progress | None = None) -> list[str]:
        """Load the drafters `choice.drafters` names (a None spec removes that method's drafter);
        with `choice.fallback` one that cannot be loaded becomes a clearly-labelled random-init
        drafter, otherwise nothing changes and a RequestError says why. Returns the new warnings."""
        from demo.models.checkpoints import DrafterLoadError, load_drafter

        say = progress or (lambda f, d: None)
        loaded = {}  # method -> (drafter, label, warnings)
        for i, (method, spec) in enumerate(choice.drafters.items()):
            say(0.5 + 0.4 * i / max(len(choice.drafters), 1), f"loading {METHOD_LABELS[method]} drafter")
            if spec is None:
                loaded[method] = (None, "none", [])
                continue
            try:
                if method in choice.missing:
                    raise DrafterLoadError(choice.missing[method])
                drafter = load_drafter(spec, self.target, method=method)
                loaded[method] = (drafter, str(spec), [f"{METHOD_LABELS[method]}: {w}" for w in drafter.cfg.warnings])
            except (DrafterLoadError, OSError) as e:
                if not choice.fallback:
                    raise RequestError(f"{METHOD_LABELS[method]} drafter {spec}: {e}") from e
                note = (f"{METHOD_LABELS[method]}: no trained drafter ({e}). Using a {RANDOM_INIT} drafter: the "
                        "app works, but almost no draft token is accepted.")
                loaded[method] = (random_drafter(method, self.target), RANDOM_INIT, [note])
        for method, (drafter, label, warnings) in loaded.items():
            self.set_drafter(method, drafter, label, warnings)
        return [w for _, _, ws in loaded.values() for w in ws]


def cache_budget(device: torch.device) -> int:
    """The ModelCache's memory budget on `device` (MODEL_CACHE_BYTES, MODEL_CACHE_GPU_FRACTION)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * MODEL_CACHE_GPU_FRACTION)
    return MODEL_CACHE_BYTES["cpu"]


class ModelCache:
    """Loaded ``Models`` by name (a preset's), shared read-only by every visitor: a visitor's choice
    only picks which entry its own requests use. Past `budget_bytes` the least recently used entry
    goes, never the default (the models the app started with) nor the one just asked for; before a
    load, entries go until `expected_bytes(name)` fits beside the rest.

    `load(name, progress)` makes the Models of a name. Loads run one at a time: the app calls `get`
    from its engine queue only (and `peek`, which never loads, from elsewhere)."""

    def __init__(self, default: Models, load: Callable[[str, Progress | None], Models], budget_bytes: int,
                 expected_bytes: Callable[[str], int] = lambda name: 0):
        self.default_name = default.name
        self.budget_bytes = budget_bytes
        self._load, self._expected = load, expected_bytes
        self._entries: OrderedDict[str, Models] = OrderedDict({default.name: default})  # least recent first
        self._sizes = {default.name: default.nbytes}
        self._lock = threading.Lock()  # guards the two dicts (peek runs beside the engine queue)

    @classmethod
    def around(cls, models: Models) -> "ModelCache":
        """The cache of an app started on `models`: presets load with their device, dtype and context."""
        from demo.models.presets import PRESETS

        def load(name: str, progress: Progress | None = None) -> Models:
            return Models.load(preset_choice(name), max_context=models.max_context_asked, progress=progress,
                               **models.load_args)

        def expected(name: str) -> int:
            preset = PRESETS.get(name)
            return int(preset.gpu_gb * 1e9) if preset and preset.gpu_gb and models.device.type == "cuda" else 0

        return cls(models, load, cache_budget(models.device), expected)

    def get(self, name: str, progress: Progress | None = None) -> Models:
        """The Models of `name`, loaded now if not cached (then the least recently used may go)."""
        with self._lock:
            if name in self._entries:
                self._entries.move_to_end(name)
                return self._entries[name]
            self._evict(keep=name, room=self._expected(name))
        models = run_on_engine_thread(self._load, name, progress)  # demo/service/engine_thread.py
        self.put(name, models)
        return models

    def put(self, name: str, models: Models) -> None:
        """Cache `models` as `name` (the most recently used), then keep to the budget."""
        with self._lock:
            self._entries[name] = models
            self._entries.move_to_end(name)
            self._sizes[name] = models.nbytes
            self._evict(keep=name)

    def peek(self, name: str) -> Models | None:
        """The Models of `name` if cached: no load, no change of order."""
        with self._lock:
            return self._entries.get(name)

    def names(self) -> list[str]:
        """The cached names, least recently used first."""
        with self._lock:
            return list(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def _evict(self, keep: str, room: int = 0) -> None:
        """Drop the least recently used entries (never the default nor `keep`) while the cache and
        `room` more bytes pass the budget. Caller holds the lock."""
        for name in [n for n in self._entries if n not in (self.default_name, keep)]:
            if sum(self._sizes.values()) + room <= self.budget_bytes:
                return
            del self._entries[name], self._sizes[name]
