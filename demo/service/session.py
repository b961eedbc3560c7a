"""The service the app calls: loaded models, engines per (mode, method), request checks, and
generations turned into updates of a conversation. No Gradio and no HTML here: views.py maps these
objects onto components, render.py and figures.py draw them.

- ``Models`` is one target with a drafter per method ("eagle", "eagle3"), loaded together. Engines
  are made on first use per (mode, method) and share the target (and its KV cache: one generation
  at a time); a new drafter reaches its engines through ``Engine.set_drafter``, so the target is
  not reloaded. ``Session.switch`` replaces the whole ``Models`` at once, after it has loaded.
- ``ModelCache`` holds the loaded ``Models`` by preset name, shared read-only by every visitor of
  the app; a visitor's choice of preset only picks the entry its own requests use. Past a memory
  budget the least recently used entry goes, never the default (the models the app started with).
- ``Session`` is the requests on one ``Models``: cheap to make per request (``Session(models)``).
- ``Request`` is one generation's settings: method, mode, compare, and the engine's
  ``GenerationConfig``; ``Session.check`` refuses bad input with a ``RequestError`` (shown to the
  user) before any engine call.
- ``Session.reply`` streams one ``Update`` per decoding step; with ``compare`` it then runs the
  same prompt target-only (k = 0, same engine) for the speedup and, at T = 0, the token-identity check.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator

import torch

from demo.service.chat import (ChatState, Comparison, IncrementalDecoder, RunTrace, StepPoint, StepRecord, TokenPiece, Turn, Update,
                       first_difference, provenance)
from demo.drafter_common import DrafterConfig, drafter_dtype
from demo.engine import Engine, GenerationConfig, StepEvent, target_only_width
from demo.methods import (APP_MAX_SPEC_TOKENS, DRAFT_METHODS, DRAFT_SAMPLING, DRAFTER_CLASSES, METHOD_LABELS, METHODS,
                          MODE_LABELS, MODES, dtype_label, num_drafts)
from demo.metrics import AcceptanceStats
from demo.models.prompts import chat_ids
from demo.target import Target
from demo.tree import MAX_DRAFT_TOKENS, MAX_TREE_TOPK, DraftShape, TreeShape, default_draft

RANDOM_INIT = "random-init (untrained)"

# Allowed ranges of the generation settings (inclusive), checked before any engine call.
LIMITS = {
    "num_spec_tokens": (1, APP_MAX_SPEC_TOKENS),
    "temperature": (0.0, 2.0),
    "top_p": (0.01, 1.0),
    "max_new_tokens": (1, 2048),
    "seed": (0, 2**31 - 1),
}
TREE_LIMITS = {"topk": (1, MAX_TREE_TOPK), "num_draft_tokens": (0, MAX_DRAFT_TOKENS)}  # 0 tokens: every node
# A prompt (with the conversation before it) longer than max_context * this many characters cannot
# fit the context and is refused before it is tokenized: English runs about 4 characters per token,
# and no real text packs 32 into every token of a prompt.
MAX_CHARS_PER_TOKEN = 32

Progress = Callable[[float, str], None]  # (fraction done, what is happening)

# Memory the ModelCache may hold (weights and KV caches of every entry), by device kind: on a CPU
# the embedded default is the only preset that fits anyway; on a GPU a fraction of its memory, so
# activations and CUDA graphs keep the rest.
MODEL_CACHE_BYTES = {"cpu": 4 * 2**30}
MODEL_CACHE_GPU_FRACTION = 0.75


NO_COMPARISON = "target only is the target-only baseline itself"


class RequestError(ValueError):
    """Bad input; the message is shown to the user and no engine was called."""


@dataclass
class Request:
    """One generation: who drafts (method), how steps run (mode), whether to compare with the
    target alone, and the engine's settings. Build one from loose settings with ``Request.of``."""

    prompt: str
    method: str = "eagle3"
    mode: str = "eager"
    compare: bool = False  # then run the same prompt target-only for the speedup
    gen: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=128))

    @classmethod
    def of(cls, prompt: str, *, method: str = "eagle3", mode: str = "eager", compare: bool = False,
           **generation) -> "Request":
        """Request.of("hi", method="eagle", num_spec_tokens=5, temperature=0.7): the generation
        settings by name, over the request defaults."""
        return cls(prompt, method, mode, compare, replace(cls("").gen, **generation))

    @property
    def k(self) -> int:
        return num_drafts(self.method, self.gen.num_spec_tokens)

    @property
    def shape(self) -> DraftShape:
        """What each step drafts: a chain of k, a tree of depth k, or nothing (target only)."""
        return self.gen.draft_shape(self.k)

    def engine_config(self) -> GenerationConfig:
        """What the engine runs: k = 0 for the target alone."""
        return replace(self.gen, num_spec_tokens=self.k)

    def settings(self) -> dict:
        """The request as plain data (JSON-ready): method, mode, compare and the engine's settings."""
        return {"method": self.method, "mode": self.mode, "compare": self.compare, **asdict(self.engine_config())}


DEFAULT_REQUEST = Request("")


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
                engine.set_drafter(drafter)

    def methods(self) -> list[str]:
        """The methods a request can use now: the target alone, and each loaded drafter."""
        return ["none"] + [m for m in DRAFT_METHODS if self.drafters[m] is not None]

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
            drafter = None if method == "none" else self.drafters[method]
            self._engines[key] = Engine(self.target, drafter, mode=mode, max_context=self.max_context,
                                        drafter_dtype=drafter_dtype(self.target.dtype, self.target.device))
        return self._engines[key]

    def describe(self) -> dict:
        return {"model": self.name, "device": str(self.device), "dtype": dtype_label(self.target.dtype),
                "max_context": self.max_context, "drafters": dict(self.drafter_labels),
                "vocab_size": self.target.config.vocab_size,
                "draft_vocab": {m: d.drafting_vocab for m, d in self.drafters.items() if d is not None}}


class Session:
    """The requests on one ``Models``; one generation at a time (the app's engine concurrency is 1).
    Cheap to make: ``Session(models)`` per request over a shared ``ModelCache`` entry."""

    def __init__(self, models: Models):
        self.models = models

    # the loaded models, read through the session
    name = property(lambda self: self.models.name)
    target_spec = property(lambda self: self.models.target_spec)
    tokenizer = property(lambda self: self.models.tokenizer)
    target = property(lambda self: self.models.target)
    max_context = property(lambda self: self.models.max_context)
    drafters = property(lambda self: self.models.drafters)
    drafter_labels = property(lambda self: self.models.drafter_labels)
    warnings = property(lambda self: self.models.warnings)
    device = property(lambda self: self.models.device)

    def methods(self) -> list[str]:
        return self.models.methods()

    def engine(self, method: str, mode: str) -> Engine:
        return self.models.engine(method, mode)

    def describe(self) -> dict:
        return self.models.describe()

    def token_texts(self, ids: list[int]) -> list[str]:
        """Each token's own text, decoded alone (a draft tree's labels; special tokens kept). Kept per
        Models: the page redraws every step's rejected draft at every step it streams."""
        texts = self.models.token_text_cache
        missing = [int(i) for i in dict.fromkeys(ids) if int(i) not in texts]
        if missing:
            texts.update(zip(missing, self.tokenizer.batch_decode([[i] for i in missing], skip_special_tokens=False,
                                                                  clean_up_tokenization_spaces=False)))
        return [texts[int(i)] for i in ids]

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, choice: ModelChoice, *, device: str = "auto", dtype: str = "auto", max_context: int = 2048,
             progress: Progress | None = None) -> "Session":
        from demo.models.loading import load_target

        say = progress or (lambda f, d: None)
        say(0.0, f"loading target {choice.target}")
        hf, tok = load_target(choice.target, device, dtype)
        session = cls(Models(hf, tok, name=choice.name, target_spec=choice.target, max_context=max_context))
        session.models.load_args = dict(device=device, dtype=dtype)
        session.load_drafters(choice, progress=say)
        return session

    def switch(self, choice: ModelChoice, progress: Progress | None = None) -> list[str]:
        """Load `choice`. A new target comes with new engines and only the drafters `choice` names;
        the same target stays loaded and only the named drafters change (Engine.set_drafter). On
        any error the loaded models stay as they were. Returns the warnings to show."""
        if choice.target == self.target_spec:
            warnings = self.load_drafters(choice, progress)
            self.models.name = choice.name
            return warnings
        fresh = Session.load(choice, max_context=self.models.max_context_asked, progress=progress,
                             **self.models.load_args)
        self.models = fresh.models  # every model at once, after everything loaded
        return self.warnings

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
            self.models.set_drafter(method, drafter, label, warnings)
        return [w for _, _, ws in loaded.values() for w in ws]

    def set_drafter(self, method: str, drafter, label: str) -> None:
        """Use `drafter` for `method` in every engine made for it, without touching the target."""
        self.models.set_drafter(method, drafter, label)

    # ------------------------------------------------------------------ engines
    def cudagraph_unavailable(self) -> str | None:
        """Why CUDA-graph mode cannot run here, or None when it can."""
        from demo.service import zerogpu

        if zerogpu.active():
            return zerogpu.GRAPHS_OFF
        if self.device.type != "cuda":
            return f"CUDA graphs need a CUDA GPU; this app runs on {self.device.type}"
        return None

    def default_draft(self) -> tuple[int, TreeShape]:
        """(k, tree) the app offers first here: the fastest measured shape on this device."""
        return default_draft(self.device.type)

    def warmup(self, modes: tuple[str, ...] = ("eager",)) -> float:
        """One tiny generation per mode with the default method and draft shape (kernels,
        allocations, and in cudagraph mode that shape's capture, so the app's first request with
        its default settings captures nothing). Returns the seconds it took."""
        start = time.perf_counter()
        ids = self.tokenizer("Hi")["input_ids"] or [0]
        method = self.methods()[-1]
        k, tree = self.default_draft()
        gen = GenerationConfig(max_new_tokens=3, num_spec_tokens=num_drafts(method, k), tree=tree)
        for mode in modes:
            for _ in self.engine(method, mode).generate(ids, gen):
                pass
        return time.perf_counter() - start

    # ------------------------------------------------------------------ requests
    def check(self, request: Request, chat: ChatState | None = None) -> list[int]:
        """Refuse bad input with a RequestError; return the prompt ids of the conversation so far
        plus `request.prompt` as the next user turn."""
        history = (chat or ChatState()).messages()
        if history and history[-1]["role"] == "user":  # an unanswered turn is replaced
            history = history[:-1]
        self._check_text(request.prompt, history)
        if request.method not in METHODS:
            raise RequestError(f"Unknown method {request.method!r}: choose one of {', '.join(METHODS)}.")
        if request.method != "none" and self.drafters[request.method] is None:
            raise RequestError(f"{self.name} has no {METHOD_LABELS[request.method]} drafter loaded; "
                               f"choose one of: {', '.join(METHOD_LABELS[m] for m in self.methods())}.")
        if request.mode not in MODES:
            raise RequestError(f"Unknown mode {request.mode!r}: choose one of {', '.join(MODES)}.")
        if request.mode == "cudagraph" and self.cudagraph_unavailable():
            raise RequestError(self.cudagraph_unavailable() + ": use eager mode.")
        for name, (lo, hi) in LIMITS.items():
            _check_number(name, getattr(request.gen, name), lo, hi)
        self._check_shape(request)
        ids = chat_ids(self.tokenizer, history + [{"role": "user", "content": request.prompt}])
        max_new = int(request.gen.max_new_tokens)
        need = len(ids) + max_new + request.shape.width
        if need > self.max_context:
            what = "conversation" if history else "prompt"
            raise RequestError(f"The {what} is {len(ids)} tokens; with max new tokens {max_new} "
                               f"it needs {need} of the {self.max_context}-token context. Shorten it, lower max new "
                               "tokens" + (", or clear the chat." if history else "."))
        return ids

    def _check_text(self, prompt, history: list[dict]) -> None:
        """The prompt must be text UTF-8 can encode, not empty, and short enough in characters for the
        context (checked before tokenizing: a 10 MB prompt would hold the server for seconds)."""
        if not isinstance(prompt, str):
            raise RequestError(f"The prompt must be text, not {type(prompt).__name__}.")
        cap = self.max_context * MAX_CHARS_PER_TOKEN
        chars = len(prompt) + sum(len(m["content"]) for m in history)
        if chars > cap:
            what = "conversation" if history else "prompt"
            raise RequestError(f"The {what} is {chars:,} characters, more than the {self.max_context}-token "
                               f"context can hold (at most {cap:,}). Shorten it" +
                               (", or clear the chat." if history else "."))
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RequestError(f"The prompt is not valid text: it has a lone surrogate {prompt[e.start]!r} at "
                               f"character {e.start}, which UTF-8 cannot encode. Remove it.") from None
        if not prompt.strip():
            raise RequestError("The prompt is empty: type a message first.")

    @staticmethod
    def _check_shape(request: Request) -> None:
        """The draft tree and the draft sampling rule, when the request has them."""
        gen = request.gen
        if gen.draft_sampling not in DRAFT_SAMPLING:
            raise RequestError(f"Unknown draft sampling {gen.draft_sampling!r}: choose one of "
                               f"{', '.join(DRAFT_SAMPLING)}.")
        if gen.tree is None or not request.k:
            return
        if not isinstance(gen.tree, TreeShape):
            raise RequestError(f"tree must be a TreeShape, not {gen.tree!r}.")
        for name, (lo, hi) in TREE_LIMITS.items():
            _check_number(f"tree {name}", getattr(gen.tree, name), lo, hi)
        try:
            request.shape.check()
        except ValueError as e:
            raise RequestError(f"{str(e)[0].upper()}{str(e)[1:]}.") from None

    def add_user_turn(self, chat: ChatState, request: Request) -> ChatState:
        """The fast first half of a chat exchange: check the request, then append the user's turn
        (replacing an unanswered one)."""
        self.check(request, chat)
        chat.mark_stopped()
        turns = list(chat.turns)
        if turns and turns[-1].role == "user":
            turns.pop()
        return replace(chat, turns=turns + [Turn("user", request.prompt)])

    def reply(self, chat: ChatState, request: Request) -> Iterator[Update]:
        """Generate the assistant's turn for the conversation (ending with the user's turn), one
        Update per decoding step; then, with request.compare, the target-only comparison."""
        if not chat.turns or chat.turns[-1].role != "user":
            raise RequestError("Nothing to answer: send a message first.")
        history = ChatState(turns=chat.turns[:-1])
        ids = self.check(replace(request, prompt=chat.turns[-1].text), history)
        engine = self.engine(request.method, request.mode)
        gen, k = request.engine_config(), request.k
        if request.mode == "cudagraph":  # capture now, visibly, rather than silently inside the first step
            yield Update(chat, f"capturing CUDA graphs for k = {k} (once per draft shape and drafter)…")
            shapes = {request.shape}
            if request.compare:  # the target-only baseline and, at T = 0, bf16's exact reference (_compare)
                shapes.add(DraftShape(0))
                if gen.temperature <= 0:
                    shapes.add(DraftShape(0, pad=reference_width(gen, engine) - 1))
            for shape in shapes:
                engine.prepare(shape)
        turn = Turn("assistant", "", label=self._label(request), state="streaming")
        chat.turns.append(turn)
        chat.trace = RunTrace(request.method, request.mode, k, AcceptanceStats(k), settings=request.settings())
        chat.comparison = None
        decoder = IncrementalDecoder(self.tokenizer)
        for event in engine.generate(ids, gen):
            if turn.state != "streaming":  # stopped: a step that was in flight is not shown
                return
            self._absorb(event, decoder, turn, chat.trace)
            yield Update(chat, f"generating: step {event.step}, {len(turn.pieces)} tokens")
        self._finish(decoder, turn)
        status = self._done_status(chat)
        if request.compare and k:
            yield from self._compare(chat, ids, engine, gen)
        elif request.compare:  # target only against target only would compare a run with itself
            status += f"; no comparison: {NO_COMPARISON}"
        yield Update(chat, status, done=True)

    def generate(self, request: Request) -> Iterator[Update]:
        """One single-turn generation (the API): a fresh conversation with request.prompt."""
        chat = self.add_user_turn(ChatState(), request)
        yield from self.reply(chat, request)

    # ------------------------------------------------------------------ internals
    def _label(self, request: Request) -> str:
        method = METHOD_LABELS[request.method]
        if request.k:
            shape = request.shape
            drafts = (f"tree: depth {shape.depth}, top-{shape.topk}, {shape.width} tokens" if shape.tree
                      else f"k = {request.k}")
            method += f" ({drafts}" + (", random-init" if self.drafter_labels[request.method] == RANDOM_INIT
                                        else "") + ")"
        return f"{self.name} · {method} · {MODE_LABELS[request.mode]}"

    @staticmethod
    def _absorb(event: StepEvent, decoder: IncrementalDecoder, turn: Turn, trace: RunTrace) -> None:
        root = turn.pieces[-1].token_id if event.step > 0 else -1  # the last token emitted before the step
        trace.steps.append(StepRecord(event.step, root, event.draft_ids, event.num_accepted, event.token_ids,
                                      event.token_probs, event.resampled, event.draft_ms, event.verify_ms,
                                      event.stats.elapsed_s, event.tree, event.target_top, event.draft_top))
        for token, prob, (depth, resampled) in zip(event.token_ids, event.token_probs,
                                                    provenance(event.token_ids, event.num_accepted, event.resampled)):
            text = decoder.push(token)
            turn.pieces.append(TokenPiece(token, text, event.step, depth, float(prob), resampled))
            turn.text += text
        trace.stats = event.stats
        trace.finish_reason = event.finish_reason
        if event.step > 0:
            depth = event.stats.num_spec_tokens if event.draft_ids else 0  # the most a step can accept
            trace.points.append(StepPoint(event.step, depth, event.num_accepted, len(event.token_ids),
                                          event.draft_ms, event.verify_ms, event.stats.elapsed_s,
                                          event.stats.tokens_per_s))

    @staticmethod
    def _finish(decoder: IncrementalDecoder, turn: Turn) -> None:
        """The text the decoder still held goes to the last token; the turn is done."""
        tail = decoder.flush()
        if tail and turn.pieces:
            turn.pieces[-1].text += tail
            turn.text += tail
        turn.state = "done"

    def _compare(self, chat: ChatState, ids: list[int], engine: Engine, gen: GenerationConfig) -> Iterator[Update]:
        """The same prompt target-only (same engine, so same mode), recorded like the speculative
        run (its reply token by token, its steps and engine times): the speedup, the T = 0
        identity, and the race's second lane."""
        reply = Turn("assistant", "", label="target only", state="streaming")
        trace = RunTrace("none", chat.trace.mode, 0, AcceptanceStats(0))
        decoder = IncrementalDecoder(self.tokenizer)
        for event in engine.generate(ids, replace(gen, num_spec_tokens=0)):
            self._absorb(event, decoder, reply, trace)
            yield Update(chat, f"target-only baseline: {len(reply.pieces)} tokens", baseline=reply,
                         baseline_trace=trace)
        self._finish(decoder, reply)
        tokens = [p.token_id for p in reply.pieces]
        spec_tokens = [p.token_id for p in chat.turns[-1].pieces]
        greedy = gen.temperature <= 0
        identical = first = one_row = None
        width = reference_width(gen, engine) if greedy else 1
        if greedy:
            reference = tokens
            if width > 1:  # bf16: the exact reference is target-only run at the verification's width
                yield Update(chat, f"checking the reply against target-only run {width} rows wide…", baseline=reply,
                             baseline_trace=trace)
                exact = replace(gen, num_spec_tokens=0, target_only_width=width)
                reference = [t for event in engine.generate(ids, exact) for t in event.token_ids]
                one_row = first_difference(tokens, spec_tokens)
            first = first_difference(reference, spec_tokens)
            identical = first is None
        chat.comparison = Comparison.of(chat.trace, trace, greedy, identical, first, reply, width, one_row)

    def _done_status(self, chat: ChatState) -> str:
        trace = chat.trace
        s = trace.stats
        reason = {"stop": "end of turn", "length": "max new tokens reached"}.get(trace.finish_reason, "done")
        return (f"done ({reason}): {s.num_generated} tokens in {s.num_steps + 1} target forwards, "
                f"{s.tokens_per_s:.1f} tokens/s")


def reference_width(gen: GenerationConfig, engine: Engine) -> int:
    """The rows of the target-only run a speculative reply of `gen` is checked against at T = 0: 1 in
    fp32 or where the target computes every row alike at any width (the fused kernels on a GPU), else
    the verification's width in bf16 and fp16 (demo.engine.target_only_width)."""
    return target_only_width(gen.draft_shape(gen.num_spec_tokens if engine.drafter is not None else 0),
                             engine.target.dtype, engine.target.rows_alike())


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
    def for_session(cls, session: Session) -> "ModelCache":
        """The cache of an app started on `session`: presets load with its device, dtype and context."""
        from demo.models.presets import PRESETS

        models = session.models

        def load(name: str, progress: Progress | None = None) -> Models:
            return Session.load(preset_choice(name), max_context=models.max_context_asked, progress=progress,
                                **models.load_args).models

        def expected(name: str) -> int:
            preset = PRESETS.get(name)
            return int(preset.gpu_gb * 1e9) if preset and preset.gpu_gb and session.device.type == "cuda" else 0

        return cls(models, load, cache_budget(session.device), expected)

    def get(self, name: str, progress: Progress | None = None) -> Models:
        """The Models of `name`, loaded now if not cached (then the least recently used may go)."""
        with self._lock:
            if name in self._entries:
                self._entries.move_to_end(name)
                return self._entries[name]
            self._evict(keep=name, room=self._expected(name))
        models = self._load(name, progress)
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

    def session(self, name: str, progress: Progress | None = None) -> Session:
        return Session(self.get(name, progress))

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


def _check_number(name: str, value, lo, hi) -> None:
    """A setting must be a number (a whole one where the limits are) within [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RequestError(f"{name} must be a number, not {value!r}.")
    if isinstance(lo, int) and value != int(value):
        raise RequestError(f"{name} must be a whole number, not {value}.")
    if not lo <= value <= hi:
        raise RequestError(f"{name} = {value} is out of range: allowed {lo} to {hi}.")


def panel_stats(session: Session, trace: RunTrace | None) -> dict:
    """The stats panel's numbers (also the API's `stats`): AcceptanceStats.summary() plus the run's
    method, mode, device and dtype, and how many of the vocabulary's tokens its drafter drafts over."""
    info = session.describe()
    if trace is None:
        return {"device": info["device"], "dtype": info["dtype"]}
    return {**trace.stats.summary(), "method": trace.method, "mode": trace.mode,
            "method_label": METHOD_LABELS[trace.method], "mode_label": MODE_LABELS[trace.mode],
            "device": info["device"], "dtype": info["dtype"], "draft_vocab": info["draft_vocab"].get(trace.method),
            "vocab_size": info["vocab_size"]}
