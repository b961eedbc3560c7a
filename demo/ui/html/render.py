"""Token provenance -> escaped HTML: the streamed text where every token shows where it came from.

Provenance of an emitted token (the words of demo/metrics.py):

- depth 1..k: an accepted draft token, the i-th of its step's draft; coloured on one sequential
  scale (``DEPTH_COLORS``), the same colours as the acceptance chart's bars.
- depth 0: the target's own token at the end of each step (correction or bonus): plain.
- resampled: at T > 0, the target's own token drawn from the residual after a rejection: a thin
  underline (at T = 0.8 most steps end with one, so the mark stays quiet).
- rejected draft (the UI's latest reply only, ``rejected``): the step's draft the target turned
  down, struck through and grey between the accepted drafts and the target's own token that
  replaced it (demo/ui/html/inspector.py says which drafts a tree's step shows). The UI hides them with a
  toggle; they are never part of the reply's text.

The latest reply's tokens carry ``data-step``: a click or a tap opens that step in the inspector.

Text is escaped for HTML and for the template syntax of Gradio's HTML component (``{{ }}``, ``${}``,
``@children``), so model output and user text always show as text and never run. Whitespace is kept
(``white-space: pre-wrap``): newlines, code blocks and lists keep their shape.
"""

from __future__ import annotations

from demo.service.chat import ChatState, TokenPiece, Turn

# Draft depth 1..10 -> background colour: light (depth 1) to dark (depth 10), one sequential scale.
DEPTH_COLORS = ("#e3f4a8", "#c2e6a0", "#9ed9a9", "#74c9b8", "#48b5c4",
                "#2b98c2", "#2277b4", "#22559f", "#1e3a86", "#12255f")
DARK_FROM_DEPTH = 6  # white text on depths 6..10
RESAMPLED_STYLE = ("text-decoration-line:underline;text-decoration-color:#d62728;text-decoration-thickness:1px;"
                   "text-underline-offset:3px")
REJECTED_STYLE = ("color:#6e6e6e;text-decoration-line:line-through;text-decoration-color:#6e6e6e;"
                  "user-select:none")  # not part of the reply: copying the text leaves it out
TEXT_STYLE = "white-space:pre-wrap;overflow-wrap:anywhere"

_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
            "{": "&#123;", "}": "&#125;", "$": "&#36;", "`": "&#96;", "@": "&#64;"}
_TABLE = str.maketrans(_ESCAPES)


def escape(text: str) -> str:
    """HTML-escape text, and also the characters of Gradio's HTML templates ({{ }}, ${}, @children)."""
    return text.translate(_TABLE)


def depth_color(depth: int) -> str:
    """Background colour of an accepted draft token at depth 1..10."""
    return DEPTH_COLORS[min(max(depth, 1), len(DEPTH_COLORS)) - 1]


def token_span(p: TokenPiece, inspectable: bool = False) -> str:
    """One emitted token; `inspectable`: it carries its step for the inspector (data-step)."""
    if not p.text:
        return ""
    if p.depth:
        color = "#fff" if p.depth >= DARK_FROM_DEPTH else "#1b1b1b"
        style = f' style="background:{depth_color(p.depth)};color:{color}"'
        cls = f"sl-tok sl-draft sl-d{p.depth}"
    elif p.resampled:
        style, cls = f' style="{RESAMPLED_STYLE}"', "sl-tok sl-resampled"
    else:
        style, cls = "", "sl-tok sl-own"
    step = f' data-step="{p.step}"' if inspectable else ""
    return f'<span class="{cls}"{style} title="{escape(p.describe())}"{step}>{escape(p.text)}</span>'


def rejected_span(step: int, text: str) -> str:
    """A step's rejected draft: struck through, grey, newlines shown as ↵ (the layout stays the reply's)."""
    text = text.replace("\n", "↵")
    tip = f"step {step} · rejected draft: the target replaced it with the token after it"
    return (f'<span class="sl-rejected" style="{REJECTED_STYLE}" title="{escape(tip)}" data-step="{step}">'
            f"{escape(text)}</span>")


def reply_spans(pieces: list[TokenPiece], rejected: dict[int, str] | None = None,
                inspectable: bool = False) -> str:
    """The spans of these tokens, each step's rejected draft (`rejected`: step -> its text)
    before the target's own token of that step; `inspectable`: tokens carry their step. A reply's
    spans are those of its steps one after another, so a streamed page appends them (render_delta)."""
    rejected = rejected or {}
    spans = []
    for p in pieces:
        if not p.depth and p.step in rejected:
            spans.append(rejected_span(p.step, rejected[p.step]))
        spans.append(token_span(p, inspectable))
    return "".join(spans)


def render_reply(pieces: list[TokenPiece], rejected: dict[int, str] | None = None,
                 inspectable: bool = False) -> str:
    """The highlighted text of one reply (reply_spans); the latest reply (`inspectable`) says how many
    tokens it holds (data-pieces), which the streamed page counts on."""
    count = f' data-pieces="{len(pieces)}"' if inspectable else ""
    return f'<div class="sl-text sl-reply" style="{TEXT_STYLE}"{count}>{reply_spans(pieces, rejected, inspectable)}</div>'


def render_user(text: str) -> str:
    return f'<div class="sl-text sl-user-text" style="{TEXT_STYLE}">{escape(text)}</div>'


def render_turn(role: str, body_html: str, label: str = "", note: str = "") -> str:
    head = escape(label or ("You" if role == "user" else "Model"))
    tail = f'<div class="sl-note">{escape(note)}</div>' if note else ""
    return (f'<div class="sl-turn sl-{role}"><div class="sl-role">{head}</div>'
            f"{body_html}{tail}</div>")


def render_turn_of(turn: Turn, rejected: dict[int, str] | None = None, inspectable: bool = False) -> str:
    """One turn of the conversation: the user's text, or the reply with its token provenance."""
    if turn.role == "user":
        return render_turn("user", render_user(turn.text), "You")
    note = {"streaming": "generating…", "stopped": "(stopped)"}.get(turn.state, "")
    return render_turn("assistant", render_reply(turn.pieces, rejected, inspectable), turn.label, note)


def render_chat(chat: ChatState, rejected: dict[int, str] | None = None) -> str:
    """The whole conversation as the UI and the API's `html` show it. The latest reply, the one
    chat.trace records, is inspectable and shows `rejected` (step -> rejected draft texts)."""
    latest = max((i for i, t in enumerate(chat.turns) if t.role == "assistant"), default=-1) if chat.trace else -1
    return '<div class="sl-chat">' + "".join(
        render_turn_of(t, rejected, True) if i == latest else render_turn_of(t)
        for i, t in enumerate(chat.turns)) + "</div>"


def render_legend(k: int) -> str:
    """Colour key in one line: accepted draft tokens by depth 1..k, the target's own token, a rejected
    draft, a resampled token (each swatch says more on hover; the explainer says it all)."""
    k = max(1, min(k, len(DEPTH_COLORS)))
    swatches = "".join(
        f'<span class="sl-swatch" style="background:{depth_color(d)};color:'
        f'{"#fff" if d >= DARK_FROM_DEPTH else "#1b1b1b"}" title="accepted draft token at depth {d}">{d}</span>'
        for d in range(1, k + 1))
    return ('<div class="sl-legend">'
            f'<span class="sl-legend-item">accepted draft, by depth: {swatches}</span>'
            '<span class="sl-legend-item"><span class="sl-swatch sl-own" title="the target\'s own token: one ends '
            "every step, the correction after a rejection or the bonus after a full accept\">abc</span> the target's "
            "own token</span>"
            f'<span class="sl-legend-item"><span class="sl-swatch" style="{REJECTED_STYLE}" title="a rejected draft: '
            "the rest of a chain's draft; in a tree, the drafter's first choice below the last accepted token\">abc"
            "</span> rejected draft</span>"
            f'<span class="sl-legend-item"><span class="sl-swatch" style="{RESAMPLED_STYLE}" title="at T &gt; 0 the '
            'target\'s token was resampled, drawn from what is left of p after a rejection">abc</span> resampled '
            "(T &gt; 0)</span>"
            '<span class="sl-legend-item sl-legend-hint">click or tap a token to inspect its step</span>'
            "</div>")


def _row(name: str, value: str, definition: str = "") -> str:
    tip = f' title="{escape(definition)}"' if definition else ""
    note = f'<div class="sl-def">{escape(definition)}</div>' if definition else ""
    return f'<tr{tip}><th>{escape(name)}</th><td>{escape(value)}{note}</td></tr>'


def render_stats(stats: dict, definitions: dict[str, str], unshown: str = "", timed: dict | None = None) -> str:
    """The stats panel: AcceptanceStats.summary() numbers plus method, mode, device and dtype, each
    with its one-line definition beside it (and on hover); `unshown`: the clause saying the last token
    counted is a stop token the reply does not show (Session.unshown_stop). `timed`: the summary of
    the comparison's timed run of the same reply, whose speed and step times stand beside the streamed
    run's, each named, since drawing the page slows the stream."""
    if "mean_acceptance_length" not in stats:
        return (f'<div class="sl-stats sl-empty">No generation yet. Running on {escape(stats.get("device", "?"))}, '
                f'{escape(stats.get("dtype", "?"))}.</div>')
    d = definitions
    per_pos = " · ".join(f"draft {i}: {r:.0%}" for i, r in enumerate(stats["acceptance_per_position"], 1)) or "-"
    rows = [
        _row("mean acceptance length", f'{stats["mean_acceptance_length"]:.2f}', d["mean_acceptance_length"]),
        _row("acceptance at draft 1 .. k", per_pos, d["acceptance_per_position"]),
        *([_row("draft 1 after a full · a rejected step",
                " · ".join("-" if r is None else f"{r:.0%}" for r in (stats["acceptance_at_0_after_full"],
                                                                       stats["acceptance_at_0_after_rejection"])),
                d["acceptance_at_0_after"])]
          if stats.get("steps_after_full") or stats.get("steps_after_rejection") else []),
        *(_row(name, f"{stats[key]:.1f}" + (f" streamed · {timed[key]:.1f} timed" if timed else ""), d[term])
          for name, key, term in (("tokens/s", "tokens_per_s", "tokens_per_s"),
                                  ("draft ms / step", "mean_draft_ms", "draft_ms"),
                                  ("verify ms / step", "mean_verify_ms", "verify_ms"))),
        *([_row("streamed · timed", "the reply as it streamed, the page drawn between its steps · the same reply "
                "timed by the comparison with nothing drawn (the speedup's run)", "")] if timed else []),
        _row("steps", f'{stats["num_steps"]} (+ prefill, {stats["prefill_ms"]:.0f} ms)',
             "Target forwards after the prefill; each emits accepted drafts + 1 tokens."),
        _row("tokens", f'{stats["num_generated"]}' + (f" ({unshown})" if unshown else ""),
             "Tokens generated, the prefill's first token included."),
        _row("method · mode", " · ".join(stats.get(f"{key}_label", stats[key]) for key in ("method", "mode")), ""),
        *([_row("drafts over", f'{stats["draft_vocab"]:,} of {stats["vocab_size"]:,} tokens', d["draft_vocab"])]
          if stats.get("draft_vocab") else []),
        _row("device · dtype", f'{stats["device"]} · {stats["dtype"]}', ""),
    ]
    return f'<table class="sl-stats">{"".join(rows)}</table>'


def render_comparison(speedup: float, spec_tps: float, base_tps: float, identical: bool | None,
                      first_difference: int | None, dtype: str = "float32", reference_width: int = 1,
                      one_row_difference: int | None = None) -> str:
    """The speedup over target-only decoding, in engine time, and, at T = 0, the losslessness check
    (against target-only run `reference_width` rows wide: in bf16 the verification's width, where
    the 1-row baseline may differ from `one_row_difference` on)."""
    lines = [f'<div class="sl-speedup"><b>{speedup:.2f}×</b> vs target-only '
             f"({spec_tps:.1f} vs {base_tps:.1f} tokens/s of engine time, same mode)</div>",
             '<div class="sl-def">Engine time: each run\'s prefill and decoding steps, both runs timed again with '
             "nothing drawn between their steps (drawing the page slows the streamed reply).</div>"]
    if identical is None:
        lines.append('<div class="sl-identity">T &gt; 0: the two samples differ by design; speculative '
                     "sampling keeps the target's distribution.</div>")
    elif identical and reference_width > 1:
        rows = f"a 1-row step and a {reference_width}-row verification round differently in {escape(dtype)}"
        one_row = ("" if one_row_difference is None else
                   f" The 1-row target-only run timed above differs from token {one_row_difference} on: {rows}.")
        lines.append(f'<div class="sl-identity sl-ok">✓ T = 0: token-identical to target-only decoding run '
                     f"{reference_width} rows wide, as the verification runs, which in {escape(dtype)} is the exact "
                     f"reference (lossless).{one_row}</div>")
    elif identical:
        lines.append('<div class="sl-identity sl-ok">✓ T = 0: token-identical to target-only decoding '
                     "(lossless).</div>")
    else:
        note = (f" In {escape(dtype)}, matrix products of different shapes can round differently."
                if dtype != "float32" else "")
        wide = f" run {reference_width} rows wide" if reference_width > 1 else ""
        lines.append(f'<div class="sl-identity sl-bad">✗ T = 0: differs from target-only decoding{wide} at token '
                     f"{first_difference}.{note}</div>")
    return '<div class="sl-compare">' + "".join(lines) + "</div>"


def status_html(text: str, kind: str = "info") -> str:
    """A status line: kind "info" while something runs, "done" after it, "error" for a refusal."""
    return f'<div class="sl-status-{kind}">{escape(text)}</div>' if text else ""


def notices_html(warnings: list[str]) -> str:
    """The models' warnings (a random-init drafter, a drafter's note), or nothing."""
    items = "".join(f"<li>{escape(w)}</li>" for w in warnings)
    return f'<div class="sl-warning"><b>⚠ Note</b><ul>{items}</ul></div>' if items else ""


def render_delta(reply_id: int, pieces: list[TokenPiece], start: int, rejected: dict[int, str]) -> str:
    """What a streamed step adds to the page: the latest reply's tokens from index `start` on, with
    their steps' rejected drafts, for assets/stream.js to append where the reply holds `start`
    tokens (data-pieces); `reply_id` tells two replies' deltas apart."""
    spans = reply_spans(pieces[start:], {s: t for s, t in rejected.items() if s >= pieces[start].step}
                        if start < len(pieces) else {}, True)
    return f'<div class="sl-delta" data-reply="{reply_id}" data-from="{start}" data-to="{len(pieces)}">{spans}</div>'
