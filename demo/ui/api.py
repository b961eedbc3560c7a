"""The programmatic endpoint /generate, on the app's default models. A contract: keep its
parameters' names and defaults and the keys of what it streams (README, "Programmatic use")."""

from __future__ import annotations

from typing import Iterator

import gradio as gr

from demo.config import TreeShape
from demo.service import zerogpu
from demo.service.engine_thread import on_engine_thread
from demo.service.hosting import Hosting
from demo.service.model_cache import ModelCache
from demo.service.request import DEFAULT_REQUEST, TREE_LIMITS, TREE_PARAMS, Request, RequestError, check_number
from demo.service.session import Session, panel_stats
from demo.ui.events import ENGINE
from demo.ui.html.render import render_chat


def register(cache: ModelCache, hosting: Hosting) -> None:
    d, g = DEFAULT_REQUEST, DEFAULT_REQUEST.gen
    mode = Session(cache.get(cache.default_name)).default_mode()

    def generate(prompt: str, method: str = d.method, mode: str = mode, num_spec_tokens: int | None = None,
                 temperature: float = g.temperature, top_p: float = g.top_p, max_new_tokens: int = g.max_new_tokens,
                 seed: int = g.seed, tree_topk: int | None = None, num_draft_tokens: int | None = None,
                 draft_sampling: str = g.draft_sampling, lookup: int | None = None) -> Iterator[dict]:
        """Generate a reply to `prompt` (one turn), streaming one value per decoding step. Each value
        holds `delta` (the text this step added), `step`, `stats` (the stats panel's numbers:
        tokens_per_call, mean_acceptance_length, acceptance_per_position, tokens_per_s, ...),
        `status`, `done`, `finish_reason`, and in the last value `text`, the whole reply, and
        `html`, the highlighted rendering the UI shows (so a reply streams in size linear in its length). tree_topk > 0
        drafts a tree of depth num_spec_tokens with that many children per node, verifying
        num_draft_tokens per step (the root included; 0: every node), and beside them a prompt-lookup
        branch of `lookup` tokens copied from the text where it repeats itself (T = 0 and the pointmass
        rule; 0: none); 0 drafts a chain. The mode defaults to the device's fastest, and
        num_spec_tokens, tree_topk, num_draft_tokens and lookup left out (None) to the device's fastest
        draft shape at this temperature."""
        session = Session(cache.get(cache.default_name))
        try:
            k, tree = draft_of(session.default_draft(temperature, method), num_spec_tokens, tree_topk,
                               num_draft_tokens, lookup)
            request = Request.of(prompt, method=method, mode=mode, num_spec_tokens=k,
                                 temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                                 tree=tree, draft_sampling=draft_sampling)
            request.time_limit_s = hosting.time_limit()
            hosting.check_work(request, session.device)
            yield from values(session.generate(request), session)
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None

    gr.api(zerogpu.on_gpu(generate), api_name="generate", concurrency_id=ENGINE)


TREE_FIELDS = {param: field for field, param in TREE_PARAMS.items()}  # /generate's name -> TreeShape's


def draft_of(default: tuple[int, TreeShape | None], num_spec_tokens: int | None, tree_topk: int | None,
             num_draft_tokens: int | None, lookup: int | None = None) -> tuple[int, TreeShape | None]:
    """(k, tree) of a /generate call: each of its four shape parameters as given, or where left
    out (None) as in `default`, the device's fastest shape at the request's temperature. A chain
    (tree_topk 0) takes no tree setting: a nonzero num_draft_tokens or lookup is refused."""
    given = dict(tree_topk=tree_topk, num_draft_tokens=num_draft_tokens, lookup=lookup)
    for name, value in given.items():
        if value is not None:
            lo, hi = TREE_LIMITS[TREE_FIELDS[name]]
            check_number(name, value, 0 if name == "tree_topk" else lo, hi)  # tree_topk 0: a chain
    if tree_topk == 0 and any(given[name] for name in ("num_draft_tokens", "lookup")):
        raise RequestError("num_draft_tokens and lookup shape a tree: set tree_topk above 0 for a tree, or leave "
                           "them 0 (or out) for a chain.")
    k, tree = default
    topk = (tree.topk if tree else 0) if tree_topk is None else tree_topk
    nodes = (tree.size if tree else 0) if num_draft_tokens is None else num_draft_tokens
    branch = (tree.lookup if tree else 0) if lookup is None else lookup
    return (k if num_spec_tokens is None else num_spec_tokens), (TreeShape(topk, nodes, branch) if topk else None)


def values(updates, session: Session) -> Iterator[dict]:
    """The API's values of a generation's updates: what each step added, the whole reply and its
    rendering at the end. An update before the
    first step (graph capture) has no trace yet: no stats, no reason."""
    sent = ""
    for update in on_engine_thread(updates):
        reply = update.chat.turns[-1]
        text = reply.text if reply.role == "assistant" else ""
        trace = update.chat.trace
        whole = update.done
        yield {"delta": text[len(sent):], "text": text if whole else "",
               "step": trace.steps[-1].step if trace and trace.steps else None,
               "html": render_chat(update.chat) if whole else "",
               "stats": panel_stats(session, trace), "status": update.status, "done": update.done,
               "finish_reason": trace.finish_reason if trace else None}
        sent = text
