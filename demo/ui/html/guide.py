"""The guided reading of a reply: its first steps told in a few plain lines from its own trace, what
was drafted, what the target verified, what it accepted and the token it added itself; and, while
the step buttons walk the reply, the step shown told the same way.

Pure functions of a RunTrace and token texts (demo/ui/html/inspector.py takes a step apart in full).
"""

from __future__ import annotations

from demo.service.chat import RunTrace, StepRecord
from demo.ui.html.inspector import cut_short, rejected_nodes
from demo.ui.html.render import escape

FIRST_STEPS = 3  # the steps a finished reply's guide tells
TOKEN_CHARS = 16


def quoted(texts: list[str]) -> str:
    """Tokens as a reader sees them: each in quotes, whitespace visible."""
    out = []
    for text in texts:
        text = text.replace("\n", "↵")
        text = text if len(text) <= TOKEN_CHARS else text[: TOKEN_CHARS - 1] + "…"
        out.append(f"‘{text}’")
    return " ".join(out) or "nothing"


def step_ids(record: StepRecord) -> list[int]:
    """The token ids a step's story names (for one token_texts call)."""
    return list(dict.fromkeys([*record.token_ids, *record.draft_ids]))


def tell_step(record: StepRecord, text: dict[int, str], prompt_tokens: int | None = None) -> str:
    """One step in a sentence or three: the prefill's first token; a target-only step's token; or
    what the drafter proposed, what the target verified in its one call, accepted and added."""
    t = lambda ids: quoted([text.get(i, "?") for i in ids])  # noqa: E731
    if record.step == 0:
        read = f" read the prompt ({prompt_tokens} tokens) and" if prompt_tokens else ""
        return f"The prefill: the target{read} wrote its first token, {t(record.token_ids)}."
    if record.tree is None:
        return f"Step {record.step}: no drafts; the target's call wrote one token, {t(record.token_ids)}."
    tree, n = record.tree, record.num_accepted
    chain = all(parent == i for i, parent in enumerate(tree.parents))  # node i + 1 hangs from node i
    drafted = (f"the drafter proposed {t(tree.tokens)}" if chain else
               f"the drafter proposed a tree of {len(tree.tokens)} tokens")
    kept = record.token_ids[:n]  # the accepted drafts the reply keeps (a stop token or the budget may end it inside)
    accepted = kept
    parts = [f"Step {record.step}: {drafted}; the target checked {len(tree.tokens) + 1} positions in one call"]
    if n:
        parts.append(f"and agreed with {t(accepted)}")
    rejected = rejected_nodes(record)
    if rejected:
        parts.append(("but not with " if n else "and agreed with none: not with ") + t([tree.tokens[rejected[0] - 1]]))
    if cut_short(record):
        parts.append("; the reply ended there")
    else:
        own = record.token_ids[n:n + 1]
        added = "in its place" if rejected else "after them" if n else ""
        parts.append(f"; it added its own {t(own)} {added}".rstrip())
    count = len(record.token_ids)
    return " ".join(parts).replace(" ;", ";") + f": {count} token{'s' if count != 1 else ''} for one target call."


def render_guide(trace: RunTrace | None, text: dict[int, str], focus: int | None = None,
                 prompt_tokens: int | None = None) -> str:
    """The prefill and the first FIRST_STEPS steps of the run told; with `focus` (a step the step
    buttons show), that step told; nothing before a run."""
    if trace is None or not trace.steps:
        return ""
    if focus is not None and 0 <= focus < len(trace.steps):
        records = [trace.steps[focus]]
    else:
        records = trace.steps[: FIRST_STEPS + 1]
    lines = "".join(f"<li>{escape(tell_step(r, text, prompt_tokens))}</li>" for r in records)
    more = ("" if focus is not None else
            '<div class="sl-guide-more">“step ▸” beside Replay walks the reply one step at a time: the text, the '
            "tree, the charts and the inspector move together.</div>")
    return f'<div class="sl-guide"><ol>{lines}</ol>{more}</div>'
