"""The service the page and the API call: requests on loaded models, and generations turned into
updates of a conversation. No Gradio and no HTML here: demo/ui maps these objects onto components.

- ``Session`` is the requests on one ``Models`` (demo/service/model_cache.py): cheap to make per
  request (``Session(models)``). ``Session.check`` refuses bad input with a ``RequestError``
  (demo/service/request.py) before any engine call.
- ``Session.reply`` streams one ``Update`` per decoding step; with ``compare`` it then runs the
  same prompt target-only (k = 0, same engine) for the speedup and, at T = 0, the token-identity check.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Generator, Iterator

from demo.config import DRAFT_SAMPLING, Deadline, DraftShape, GenerationConfig, TreeShape

from demo.methods import DEFAULT_METHOD, METHODS, METHOD_LABELS, MODES, MODE_LABELS, REGISTRY, default_draft, draft_depth
from demo.engine import Engine, target_only_width
from demo.step_result import StepEvent
from demo.metrics import AcceptanceStats
from demo.models.prompts import chat_ids
from demo.service.chat import (
    COMPARE_ROUNDS,
    ChatState,
    Comparison,
    IncrementalDecoder,
    RunTrace,
    StepPoint,
    StepRecord,
    TokenPiece,
    Turn,
    Update,
    first_difference,
    provenance,
)
from demo.service.engine_thread import run_on_engine_thread
from demo.service.model_cache import RANDOM_INIT, ModelCache, ModelChoice, Models, Progress
from demo.service.request import MAX_CHARS_PER_TOKEN, NO_COMPARISON, Request, RequestError, check_values

# "Compare with target-only" times both runs again with nothing drawn, in COMPARE_ROUNDS rounds where
# they fit in COMPARE_BUDGET_S together (a GPU's replies, and a CPU's short ones), so the speedup is a
# median with its range: one timing on a 2-core CPU gave 0.9 to 2.2x for one prompt. A longer reply
# is timed once, and the page says so (Comparison.round_s).
COMPARE_BUDGET_S = 60.0
DRAFT_TEXTS_KEPT = 8192  # rejected drafts' texts kept per Models (a 2,048-token reply has at most 2,048)


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

    def unshown_stop(self, trace: RunTrace | None) -> str:
        """Where a stop token the reply's text leaves out (a special token, as the reply is decoded)
        ended the run: "the last token, <|im_end|>, ends the turn and is not shown", the clause every
        line that counts the reply's tokens adds (the counts include it, as vLLM's do); else ""."""
        if trace is None or trace.finish_reason != "stop" or not trace.steps or not trace.steps[-1].token_ids:
            return ""
        stop = trace.steps[-1].token_ids[-1]
        if self.tokenizer.decode([stop], skip_special_tokens=True, clean_up_tokenization_spaces=False):
            return ""  # a stop token with text: the reply shows it
        return f"the last token, {self.token_texts([stop])[0]}, ends the turn and is not shown"

    def draft_texts(self, drafts: list[list[int]]) -> list[str]:
        """Each draft's text, its tokens decoded together (special tokens kept): a character split
        over several tokens reads whole. Kept per Models, as token_texts are (the page redraws every
        rejected draft at every step), the most recent DRAFT_TEXTS_KEPT."""
        texts = self.models.draft_text_cache
        keys = [tuple(int(i) for i in ids) for ids in drafts]
        missing = [k for k in dict.fromkeys(keys) if k not in texts]
        if missing:
            texts.update(zip(missing, self.tokenizer.batch_decode([list(k) for k in missing], skip_special_tokens=False,
                                                                  clean_up_tokenization_spaces=False)))
        out = [texts[k] for k in keys]
        if len(texts) > DRAFT_TEXTS_KEPT:  # drop the oldest (dicts keep insertion order)
            for k in list(texts)[:len(texts) - DRAFT_TEXTS_KEPT]:
                del texts[k]
        return out

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, choice: ModelChoice, *, device: str = "auto", dtype: str = "auto", max_context: int = 2048,
             progress: Progress | None = None) -> "Session":
        """The models `choice` names, loaded on the engine thread (demo/service/engine_thread.py)."""
        return cls(run_on_engine_thread(Models.load, choice, device=device, dtype=dtype, max_context=max_context,
                                        progress=progress))

    def switch(self, choice: ModelChoice, progress: Progress | None = None) -> list[str]:
        """Load `choice`. A new target comes with new engines and only the drafters `choice` names;
        the same target stays loaded and only the named drafters change (Engine.set_proposer). On
        any error the loaded models stay as they were. Returns the warnings to show. Loads on the
        engine thread."""
        return run_on_engine_thread(self._switch, choice, progress)

    def _switch(self, choice: ModelChoice, progress: Progress | None) -> list[str]:
        if choice.target == self.target_spec:
            warnings = self.models.load_drafters(choice, progress)
            self.models.name = choice.name
            return warnings
        self.models = Models.load(choice, max_context=self.models.max_context_asked, progress=progress,
                                  **self.models.load_args)  # every model at once, after everything loaded
        return self.warnings

    # ------------------------------------------------------------------ engines
    def cudagraph_unavailable(self) -> str | None:
        """Why CUDA-graph mode cannot run here, or None when it can."""
        if self.device.type != "cuda":
            return f"CUDA graphs need a CUDA GPU; this app runs on {self.device.type}"
        return None

    def default_mode(self) -> str:
        """The mode the app offers first: graph mode on a dedicated GPU; eager on a CPU and on ZeroGPU,
        where each request would first capture its graphs (offered, with the cost said)."""
        from demo.service import zerogpu

        return "eager" if self.cudagraph_unavailable() or zerogpu.active() else "cudagraph"

    def default_draft(self, temperature=0.0, method: str = DEFAULT_METHOD) -> tuple[int, TreeShape | None]:
        """(k, tree) the app offers first here for `method` (one not in the registry: the default's):
        the fastest measured shape on this device at `temperature`."""
        drafts = isinstance(method, str) and method in REGISTRY and REGISTRY[method].proposer is not None
        return default_draft(self.device.type, temperature, method if drafts else DEFAULT_METHOD)

    def default_method(self) -> str:
        """The method the app offers first: the registry's default where its drafter is loaded, else the
        last this session offers."""
        methods = self.methods()
        return DEFAULT_METHOD if DEFAULT_METHOD in methods else methods[-1]

    def warmup(self, modes: tuple[str, ...] = ("eager",)) -> float:
        """One tiny generation per mode with the default method and draft shape, and at T > 0 with
        that temperature's where it differs (kernels, allocations, and in cudagraph mode the shapes'
        capture, so the app's first request with default settings captures nothing), on the engine
        thread. Returns the seconds it took."""
        return run_on_engine_thread(self._warmup, modes)

    def _warmup(self, modes: tuple[str, ...]) -> float:
        start = time.perf_counter()
        ids = self.tokenizer("Hi")["input_ids"] or [0]
        method = self.default_method()
        drafts = {0.0: self.default_draft(0.0, method)}
        if self.default_draft(1.0, method) != drafts[0.0]:
            drafts[1.0] = self.default_draft(1.0, method)
        for mode in modes:
            for temperature, (k, tree) in drafts.items():
                gen = GenerationConfig(max_new_tokens=3, num_spec_tokens=draft_depth(method, k), tree=tree,
                                       temperature=temperature)
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
        if REGISTRY[request.method].needs_drafter and self.drafters[request.method] is None:
            raise RequestError(f"{self.name} has no {METHOD_LABELS[request.method]} drafter loaded; "
                               f"choose one of: {', '.join(METHOD_LABELS[m] for m in self.methods())}.")
        if request.mode not in MODES:
            raise RequestError(f"Unknown mode {request.mode!r}: choose one of {', '.join(MODES)}.")
        if request.mode == "cudagraph" and self.cudagraph_unavailable():
            raise RequestError(self.cudagraph_unavailable() + ": use eager mode.")
        self._check_sampling(request)
        check_values(request)
        ids = chat_ids(self.tokenizer, history + [{"role": "user", "content": request.prompt}])
        max_new = int(request.gen.max_new_tokens)
        need = len(ids) + max_new + request.shape.width
        if need > self.max_context:
            what = "conversation" if history else "prompt"
            room = self.max_context - len(ids) - request.shape.width  # the most new tokens that fit after it
            fits = f": at most {room} new tokens fit after it" if room >= 1 else ""
            raise RequestError(f"The {what} is {len(ids)} tokens; with max new tokens {max_new} "
                               f"it needs {need} of the {self.max_context}-token context{fits}. Shorten it, lower max "
                               "new tokens" + (", or clear the chat." if history else "."))
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
    def _check_sampling(request: Request) -> None:
        if request.gen.draft_sampling not in DRAFT_SAMPLING:
            raise RequestError(f"Unknown draft sampling {request.gen.draft_sampling!r}: choose one of "
                               f"{', '.join(DRAFT_SAMPLING)}.")

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
        clock = Deadline(request.time_limit_s)
        captured_s = engine.capture_s
        if request.mode == "cudagraph":  # capture now, visibly, rather than silently inside the first step
            yield Update(chat, f"capturing CUDA graphs for k = {k} (once per draft shape and drafter)…")
            shapes = {request.shape}
            if request.compare:  # the target-only baseline and, at T = 0, bf16's exact reference (_compare)
                shapes.add(DraftShape(0))
                if gen.temperature <= 0:
                    shapes.add(DraftShape(0, pad=reference_width(gen, engine) - 1))
            for shape in shapes:  # the attend buckets this request reaches, no more (as Engine.generate bounds them)
                engine.prepare(shape, len(ids) + gen.max_new_tokens + shape.width + shape.reach,
                               sampled=gen.temperature > 0)
        captured_s = engine.capture_s - captured_s
        turn = Turn("assistant", "", label=self._label(request), state="streaming")
        chat.turns.append(turn)
        chat.trace = RunTrace(request.method, request.mode, k, AcceptanceStats(request.shape.reach),
                              settings=request.settings(), prompt_ids=list(ids))
        chat.comparison = None
        decoder = IncrementalDecoder(self.tokenizer)
        for event in engine.generate(ids, clock.bound(gen)):
            if turn.state != "streaming":  # stopped: a step that was in flight is not shown
                return
            self._absorb(event, decoder, turn, chat.trace)
            yield Update(chat, f"generating: step {event.step}, {len(turn.pieces)} tokens")
        self._finish(decoder, turn)
        status = self._done_status(chat, clock)
        if captured_s > 0:  # on ZeroGPU every request; on a dedicated GPU the first of a shape after warm-up
            status += f"; CUDA graphs captured for this request in {captured_s:.2f} s, before its first step"
        if request.compare and k:
            compared = yield from self._compare(chat, ids, engine, gen, clock)
            if compared is False:
                status += f"; no comparison: {clock.ran_out()}"
            elif chat.comparison is not None:  # the speed above was the stream's, slowed by drawing the page
                status += (f" as streamed, {chat.comparison.speculative_tokens_per_s:.1f} timed with nothing drawn "
                           f"({chat.comparison.speedup:.2f}× target-only)")
        elif request.compare:  # target only against target only would compare a run with itself
            status += f"; no comparison: {NO_COMPARISON}"
        yield Update(chat, status, done=True)

    def generate(self, request: Request) -> Iterator[Update]:
        """One single-turn generation (the API): a fresh conversation with request.prompt."""
        chat = self.add_user_turn(ChatState(), request)
        yield from self.reply(chat, request)

    def copy_context(self, trace: RunTrace, step: int) -> tuple[str, str, str] | None:
        """Where step `step`'s copied drafts (the n-gram method's, a tree's lookup branch) came from, as
        text: (a few tokens before, the suffix the lookup matched, what followed it there: the copy's
        source), found as the engine's lookup finds it (demo/proposers/ngram.py); None: nothing copied."""
        from demo.proposers.ngram import copy_source

        record = trace.steps[step] if 0 < step < len(trace.steps) else None
        if record is None or record.tree is None or not record.tree.copied:
            return None
        text = trace.prompt_ids + [t for s in trace.steps[:step] for t in s.token_ids]
        found = copy_source(text)
        if found is None:
            return None
        start, n = found
        pieces = (text[max(0, start - n - 6):start - n], text[start - n:start], text[start:start + record.tree.copied])
        return tuple(self.tokenizer.decode(p, skip_special_tokens=False) for p in pieces)

    # ------------------------------------------------------------------ internals
    def _label(self, request: Request) -> str:
        method = METHOD_LABELS[request.method]
        if request.k:
            shape = request.shape
            drafts = (f"k = {request.k}" if shape.chain  # a chain drawn from q runs as a tree of top-1
                      else f"tree: depth {shape.depth}, top-{shape.topk}, {shape.width} tokens"
                      + (f" with a lookup branch of {shape.lookup}" if shape.lookup else ""))
            method += f" ({drafts}" + (", random-init" if self.drafter_labels.get(request.method) == RANDOM_INIT
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
            depth = event.stats.reach if event.draft_ids else 0  # the most a step can accept
            kept = min(event.num_accepted, len(event.token_ids))  # no draft past the end of the reply
            trace.points.append(StepPoint(event.step, depth, kept, len(event.token_ids),
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

    def _record(self, chat: ChatState, engine: Engine, ids: list[int], gen: GenerationConfig, method: str,
                label: str, clock: Deadline) -> tuple[Turn, RunTrace] | None:
        """One whole generation, recorded as the reply is (token by token, its steps and engine times),
        with nothing drawn between its steps; None when Stop ended the comparison meanwhile, or when the
        request's time ran out before it ended (a cut run would compare a prefix)."""
        k = gen.num_spec_tokens
        turn = Turn("assistant", "", label=label, state="streaming")
        trace = RunTrace(method, chat.trace.mode, k, AcceptanceStats(gen.draft_shape(k).reach), prompt_ids=list(ids))
        decoder = IncrementalDecoder(self.tokenizer)
        if clock.expired():
            return None
        for event in engine.generate(ids, clock.bound(gen)):
            if not chat.comparing:
                return None
            self._absorb(event, decoder, turn, trace)
        if trace.finish_reason == "time":
            return None
        self._finish(decoder, turn)
        return turn, trace

    def _compare(self, chat: ChatState, ids: list[int], engine: Engine, gen: GenerationConfig,
                 clock: Deadline) -> Generator[Update, None, bool | None]:
        """The speedup, measured as a learner can trust it: the speculative run and the same prompt
        target-only (same engine, so same mode), each run again with nothing drawn between steps
        (the streamed reply's own speed is slowed by drawing it), three times where that is cheap
        (COMPARE_ROUNDS, COMPARE_BUDGET_S), so the speedup comes with its range; then, at T = 0, the
        token identity. The median round's two recorded runs are its speeds and the race's lanes. Returns False when the
        request's time ran out first (the reply stays; no comparison), None when Stop ended it."""
        chat.comparing = True
        yield Update(chat, "comparing: the same prompt target-only, and both runs again without drawing the page…")
        spec_reply = chat.turns[-1]
        record = {"spec": lambda: self._record(chat, engine, ids, gen, chat.trace.method, spec_reply.label, clock),
                  "base": lambda: self._record(chat, engine, ids, replace(gen, num_spec_tokens=0), "none",
                                               "target only", clock)}
        rounds, start, wanted, round_s = [], time.perf_counter(), 1, 0.0
        while len(rounds) < wanted:
            if rounds:
                yield Update(chat, f"comparing: timing round {len(rounds) + 1} of {wanted}, for the median and range…")
            # every other round runs target-only first, so a drift in the machine's speed falls on both alike
            order = ("spec", "base") if len(rounds) % 2 == 0 else ("base", "spec")
            runs = {}
            for which in order:
                runs[which] = record[which]()
                if runs[which] is None:
                    break
            if None in runs.values() and chat.comparing and clock.expired() and rounds:
                break  # out of time after a whole round: the rounds measured stand
            if None in runs.values():  # stopped, or out of time
                stopped = not chat.comparing
                chat.comparing = False
                return None if stopped else False
            rounds.append((runs["spec"], runs["base"]))
            if len(rounds) == 1:
                round_s = time.perf_counter() - start
                left = clock.left()  # and within the request's time limit, so no third round is cut short
                more = round_s * (COMPARE_ROUNDS - 1)
                if round_s * COMPARE_ROUNDS <= COMPARE_BUDGET_S and (left is None or more < left):
                    wanted = COMPARE_ROUNDS  # cheap enough: time them twice more, for the median and a range
        speedups = [s[1].stats.tokens_per_s / b[1].stats.tokens_per_s if b[1].stats.tokens_per_s else 0.0
                     for s, b in rounds]
        # the median round stands for the comparison: its speeds, its step times and the race's lanes
        middle = sorted(range(len(rounds)), key=speedups.__getitem__)[len(rounds) // 2]
        (spec_turn, spec_trace), (reply, trace) = rounds[middle]
        tokens = [p.token_id for p in reply.pieces]
        spec_tokens = [p.token_id for p in spec_reply.pieces]
        greedy = gen.temperature <= 0
        identical = first = one_row = None
        width = reference_width(gen, engine) if greedy else 1
        if greedy:
            reference = tokens
            if width > 1:  # bf16: the exact reference is target-only run at the verification's width
                yield Update(chat, f"checking the reply against target-only run {width} rows wide…")
                exact = replace(gen, num_spec_tokens=0, target_only_width=width)
                events = list(engine.generate(ids, clock.bound(exact)))
                if events[-1].finish_reason == "time":
                    chat.comparing = False
                    return False
                reference = [t for event in events for t in event.token_ids]
                one_row = first_difference(tokens, spec_tokens)
            first = first_difference(reference, spec_tokens)
            identical = first is None
        chat.comparing = False
        chat.comparison = Comparison.of(spec_trace, trace, greedy, identical, first, reply, width, one_row, speedups,
                                        spec_turn, round_s)
        chat.comparison.unshown = (self.unshown_stop(spec_trace), self.unshown_stop(trace))

    def _done_status(self, chat: ChatState, clock: Deadline) -> str:
        trace = chat.trace
        s = trace.stats
        reason = (clock.ran_out() if trace.finish_reason == "time" else
                  {"stop": "end of turn", "length": "max new tokens reached"}.get(trace.finish_reason, "done"))
        unshown = self.unshown_stop(trace)
        return (f"done ({reason}): {s.accounting()}{'; ' + unshown if unshown else ''}; "
                f"{s.tokens_per_call:.2f} tokens per target call, "
                f"{s.tokens_per_s:.1f} tokens/s")


def reference_width(gen: GenerationConfig, engine: Engine) -> int:
    """The rows of the target-only run a speculative reply of `gen` is checked against at T = 0: 1 in
    fp32 or where the target computes every row alike at any width (the fused kernels on a GPU), else
    the verification's width in bf16 and fp16 (demo.engine.target_only_width)."""
    return target_only_width(gen.draft_shape(gen.num_spec_tokens if engine.drafter is not None else 0),
                             engine.target.dtype, engine.target.rows_alike())


def panel_stats(session: Session, trace: RunTrace | None) -> dict:
    """The stats panel's numbers (also the API's `stats`): AcceptanceStats.summary() plus the run's
    k (num_spec_tokens), method, mode, device and dtype, and how many of the vocabulary's tokens its drafter drafts over."""
    info = session.describe()
    if trace is None:
        return {"device": info["device"], "dtype": info["dtype"]}
    return {**trace.stats.summary(), "num_spec_tokens": trace.num_spec_tokens, "method": trace.method, "mode": trace.mode,
            "method_label": METHOD_LABELS[trace.method], "mode_label": MODE_LABELS[trace.mode],
            "device": info["device"], "dtype": info["dtype"], "draft_vocab": info["draft_vocab"].get(trace.method),
            "vocab_size": info["vocab_size"]}


def visitor_session(cache: ModelCache, name: str) -> Session:
    """A visitor's models, loaded if they are not cached (a preset evicted since loads again): for
    the engine queue only. A failed load is a RequestError that says why."""
    try:
        return Session(cache.get(name))
    except Exception as e:
        raise RequestError(f"Could not load {name}: {e}. Choose a preset.") from None


def shown_session(cache: ModelCache, name: str) -> Session:
    """A visitor's models for display only: never loads (the default when theirs are not cached)."""
    return Session(cache.peek(name) or cache.peek(cache.default_name))
