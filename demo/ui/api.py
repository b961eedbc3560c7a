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
from demo.service.request import DEFAULT_REQUEST, Request, RequestError
from demo.service.session import Session, panel_stats
from demo.ui.events import ENGINE
from demo.ui.html.render import render_chat


def register(cache: ModelCache, hosting: Hosting) -> None:
    d, g = DEFAULT_REQUEST, DEFAULT_REQUEST.gen

    def generate(prompt: str, method: str = d.method, mode: str = d.mode, num_spec_tokens: int = g.num_spec_tokens,
                 temperature: float = g.temperature, top_p: float = g.top_p, max_new_tokens: int = g.max_new_tokens,
                 seed: int = g.seed, tree_topk: int = 0, num_draft_tokens: int = 0,
                 draft_sampling: str = g.draft_sampling) -> Iterator[dict]:
        """Generate a reply to `prompt` (one turn), streaming one value per decoding step. Each value
        holds `html` (the highlighted rendering the UI shows), `text`, `stats` (the stats panel's
        numbers: mean_acceptance_length, acceptance_per_position, tokens_per_s, ...), `status` and
        `done`. tree_topk > 0 drafts a tree of depth num_spec_tokens with that many children per
        node, verifying num_draft_tokens per step (the root included; 0: every node); 0 drafts a chain."""
        tree = TreeShape(tree_topk, num_draft_tokens) if tree_topk else None
        request = Request.of(prompt, method=method, mode=mode, num_spec_tokens=num_spec_tokens,
                             temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                             tree=tree, draft_sampling=draft_sampling)
        session = Session(cache.get(cache.default_name))
        try:
            hosting.check_work(request, session.device)
            for update in on_engine_thread(session.generate(request)):
                reply = update.chat.turns[-1]
                yield {"html": render_chat(update.chat), "text": reply.text if reply.role == "assistant" else "",
                       "stats": panel_stats(session, update.chat.trace), "status": update.status,
                       "done": update.done, "finish_reason": update.chat.trace.finish_reason}
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None

    gr.api(zerogpu.on_gpu(generate), api_name="generate", concurrency_id=ENGINE)
