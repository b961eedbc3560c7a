"""One decoding step taken apart for a learner, as plain data and escaped HTML: what was drafted at
each depth, the drafter's candidates with q and the target's best tokens with p, which drafts were
accepted and why, what the step emitted, and its draft and verify time. Also the step's rejected
draft, which the conversation shows struck through after the accepted tokens.

Pure functions of a RunTrace (demo/service/chat.py) and the texts of the token ids they show (``texts``:
id -> text, from the session's tokenizer); no Gradio, no tokenizer, no tensors here.

The words are demo/metrics.py's; the acceptance rules are those of demo/sampling.py (chains) and
demo/tree_verify.py (trees):

- greedy (T = 0): a draft is accepted when it equals the target's argmax at its position; a tree
  accepts the child that does, if any.
- pointmass (T > 0, drafts are the drafter's top choices): a draft x is accepted with probability
  p(x); a tree's siblings are tried in turn, each with p(x) / (1 - p of the siblings tried before).
- q (T > 0, drafts drawn from the drafter's q): accepted with probability min(1, p(x) / q(x)); a
  tree's later siblings are tested against the residual the earlier rejections left.
- wor (T > 0, a node's drafts drawn from q without replacement): as q, but each rejection also
  takes the rejected draft out of q, and later siblings are tested against what is left of both.

The rejected draft of a step, the one the conversation strikes through: for a chain, the drafts after
the accepted ones (the first was rejected, the rest were discarded with it); for a tree, the
drafter's first candidate at each depth below the last accepted token, that is the chain the drafter
would have drafted from there (its siblings, also rejected, are in the inspector).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from demo.config import DRAFT_SAMPLING, Rule
from demo.service.chat import RunTrace, StepRecord
from demo.tree import DraftTree
from demo.ui.html.render import escape

GREEDY = "greedy"  # T = 0, where every Rule is the greedy test
POINTMASS, Q, WOR = Rule.POINTMASS, Rule.Q, Rule.WOR
RULES = {
    GREEDY: "T = 0: a draft is accepted when it is the target's most likely token (its argmax) at that "
    "position; at the first mismatch the target's own argmax takes its place.",
    POINTMASS: "T > 0, drafts are the drafter's top choices: a draft x is accepted with probability p(x) "
    "(a tree's siblings are tried in turn, each against what is left of p); after a rejection the target "
    "draws its own token from p with the rejected drafts removed.",
    Q: "T > 0, drafts drawn from the drafter's q: a draft x is accepted with probability min(1, p(x) / q(x)); "
    "after a rejection the target draws its own token from the residual max(p − q, 0).",
    WOR: "T > 0, a node's drafts drawn from the drafter's q without replacement (distinct tokens): a draft x is "
    "accepted with probability min(1, p(x) / q(x)); after a rejection p becomes the residual max(p − q, 0) and q "
    "loses the rejected draft, both renormalised, and the next sibling is tested against them; when all fail the "
    "target draws its own token from what is left of p.",
}
TOKEN_CHARS = 24  # a token shows at most this many characters in the inspector
HINT = "Click or tap a token of the latest reply to inspect its step."


def prob_text(x: float) -> str:
    """A probability or a ratio as the inspector prints it: 3 decimals from 0.001 up, 3 significant
    digits below (2.1e-05, 0.00067), so a small value never reads as 0.000."""
    return f"{x:.3f}" if x >= 0.001 or x == 0 else f"{x:.3g}"


def acceptance_rule(settings: dict) -> str:
    """GREEDY, POINTMASS, Q or WOR: how the run's drafts were accepted (RunTrace.settings)."""
    if float(settings.get("temperature", 0.0)) <= 0.0:
        return GREEDY
    rule = settings.get("draft_sampling")
    return Rule(rule) if rule in DRAFT_SAMPLING else POINTMASS


def children(tree: DraftTree, node: int) -> list[int]:
    """The nodes (1..N) hanging from `node` (0: the root), in the tree's order: the drafter's."""
    return [i for i, parent in enumerate(tree.parents, 1) if parent == node]


def cut_short(record: StepRecord) -> bool:
    """The step emitted less than its accepted drafts + the target's token: a stop token or the
    token budget ended the reply inside it."""
    return len(record.token_ids) < record.num_accepted + 1


def rejected_nodes(record: StepRecord) -> list[int]:
    """The step's rejected draft as tree nodes, shallowest first: below the last accepted token, the
    first child at each depth (a chain: the drafts after the accepted ones). Empty when every draft
    was accepted, for a step without drafts, and for a step the reply ended inside."""
    tree = record.tree
    if tree is None or cut_short(record):
        return []
    node, tail = (tree.path[-1] if tree.path else 0), []
    while kids := children(tree, node):
        node = kids[0]
        tail.append(node)
    return tail


def rejected_ids(record: StepRecord) -> list[int]:
    return [record.tree.tokens[n - 1] for n in rejected_nodes(record)]


def rejected_texts(trace: RunTrace | None, draft_texts: Callable[[list[list[int]]], list[str]]) -> dict[int, str]:
    """Step -> the text of its rejected draft, for the conversation (one draft_texts call). Each draft
    is decoded as one sequence: a character split over its tokens reads whole, not as one
    replacement character a token."""
    if trace is None:
        return {}
    tails = {s.step: rejected_ids(s) for s in trace.steps}
    tails = {step: ids for step, ids in tails.items() if ids}
    return dict(zip(tails, draft_texts(list(tails.values())))) if tails else {}


# ---------------------------------------------------------------------- one step as data
@dataclass
class Candidate:
    """A draft token verified at one depth (a chain's one; a tree's children of the path node)."""

    token: int
    q: float | None  # the drafter's probability of it (None: not recorded)
    p: float  # the target's probability of it there
    status: str  # "accepted", "rejected", "untried" (a sibling was accepted first), "discarded" (below a rejection)
    why: str
    copied: bool = False  # copied from the text by the prompt lookup (TreeShape.lookup), not drafted


@dataclass
class Position:
    """Depth `depth` of a step: its drafts, both models' candidates there, and what was emitted."""

    depth: int  # 1..D: the depth in the draft; D + 1: the bonus position past the deepest draft
    drafts: list[Candidate]
    drafter_top: list[tuple[int, float | None]]  # the drafter's candidates (token, q): a chain's top 5, a tree's children
    target_top: list[tuple[int, float]] | None  # the target's top 5 (token, p); None: not kept (past the emitted tokens)
    emitted: tuple[int, float, str] | None  # (token, p, how it came) when the step emitted a token here


def _own_token_how(record: StepRecord, rule: str, rejected: bool) -> str:
    """How the target's own token at the end of a step came about."""
    if rule == GREEDY:
        return ("the target's own token: its argmax, in place of the rejected draft" if rejected else
                "the target's own token (bonus): its argmax after the last accepted draft")
    if rejected or record.resampled:
        return ("the target's own token, resampled: drawn from what is left of p once the rejected drafts are "
                "removed" if rule == POINTMASS else
                "the target's own token, resampled: drawn from what the rejections left of p (max(p − q, 0), "
                "with q losing each rejected draft)" if rule == WOR else
                "the target's own token, resampled: drawn from the residual max(p − q, 0)")
    return "the target's own token (bonus): drawn from p after the last accepted draft"


def _verdicts(tree: DraftTree, nodes: list[int], accepted: int | None, rule: str, verified: bool) -> list[Candidate]:
    """The Candidates of sibling `nodes`: which was accepted, and why each passed or failed."""
    out, tried_mass, seen, done = [], 0.0, set(), False
    for i, node in enumerate(nodes):
        token, p = tree.tokens[node - 1], tree.target_probs[node - 1]
        copied = tree.is_copied(node)
        q = tree.draft_probs[node - 1] if tree.draft_probs is not None and not copied else None
        if not verified:
            status, why = "discarded", "not verified: it hangs below a rejected draft"
        elif rule == GREEDY:
            status = "accepted" if node == accepted else "rejected"
            why = "= the target's argmax" if node == accepted else "≠ the target's argmax (its top 1)"
        elif done:
            status, why = "untried", "not tried: an earlier sibling was accepted"
        else:
            status = "accepted" if node == accepted else "rejected"
            if token in seen:
                how = "already tried as an earlier sibling"
            elif rule == POINTMASS:
                left = max(1.0 - tried_mass, 0.0)
                chance = min(1.0, p / left) if left > 0 else 0.0
                how = (f"accept with p(x) = {prob_text(p)}" if i == 0 else
                       f"accept with p(x) / (1 − p of the siblings tried) = {prob_text(p)} / {prob_text(left)} = "
                       f"{prob_text(chance)}")
            elif i == 0 and q:
                how = (f"accept with min(1, p/q) = min(1, {prob_text(p)} / {prob_text(q)}) = "
                       f"{prob_text(min(1.0, p / q))}")
            elif rule == WOR:
                how = "tested with min(1, p/q) against what the earlier rejections left of p and of q"
            else:
                how = "tested with min(1, p/q) against the residual the earlier siblings left"
            why = how + (" → accepted" if status == "accepted" else " → rejected")
            tried_mass += 0.0 if token in seen else p
            seen.add(token)
        done = done or node == accepted
        if copied:
            why = "copied from the text by the prompt lookup, not drafted; " + why
        out.append(Candidate(token, q, p, status, why, copied))
    return out


def positions(record: StepRecord, rule: str) -> list[Position]:
    """The step, depth by depth: along the accepted path, then its rejected draft (rejected_nodes)."""
    emitted = list(zip(record.token_ids, record.token_probs))
    n, tree = record.num_accepted, record.tree

    def emitted_at(j: int, rejected: bool) -> tuple[int, float, str] | None:
        if j >= len(emitted):
            return None
        if record.step == 0:
            how = "the target's own token: the prefill's first token"
        elif tree is None:
            how = "the target's own token (target only: no drafts)"
        else:
            how = ((f"accepted copy {j + 1} (the prompt lookup's)" if tree.is_copied(tree.path[j])
                    else f"accepted draft {j + 1}") if j < n else _own_token_how(record, rule, rejected))
        return (*emitted[j], how)

    def target_top_at(j: int):
        return record.target_top[j] if j < len(record.target_top) else None

    if tree is None:  # the prefill, or a target-only step
        return [Position(1, [], [], target_top_at(0), emitted_at(0, False))]
    line = tree.path + rejected_nodes(record)  # the nodes the step is read along
    out = []
    for j in range(len(line) + 1):  # position j + 1, whose drafts hang from line[j - 1]
        parent = line[j - 1] if j else 0
        kids = children(tree, parent)
        if not kids and j != n:
            break
        accepted = tree.path[j] if j < n else None
        drafts = _verdicts(tree, kids, accepted, rule, verified=j <= n)
        if record.draft_top is not None and j < len(record.draft_top):
            drafter_top = list(record.draft_top[j])  # a chain: the drafter's own top 5 there
        else:
            drafter_top = [(c.token, c.q) for c in drafts if not c.copied]  # a tree: its candidates are the children
        out.append(Position(j + 1, drafts, drafter_top, target_top_at(j), emitted_at(j, bool(kids))))
    return out


def shown_ids(record: StepRecord) -> list[int]:
    """Every token id the inspector of `record` shows (for one token_texts call)."""
    ids = list(record.token_ids) + list(record.draft_ids)
    for rows in (record.target_top, record.draft_top or []):
        ids += [t for row in rows for t, _ in row]
    return list(dict.fromkeys(ids))


# ---------------------------------------------------------------------- HTML
def token_html(text: str, cls: str = "") -> str:
    """A token as the inspector shows it: whitespace made visible, cut to TOKEN_CHARS, escaped."""
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in
                    text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")) or "∅"
    if len(shown) > TOKEN_CHARS:
        shown = shown[: TOKEN_CHARS - 1] + "…"
    return f'<code class="sl-itok{" " + cls if cls else ""}" title="{escape(repr(text))}">{escape(shown)}</code>'


MARKS = {"accepted": ("✓", "accepted"), "rejected": ("✗", "rejected"), "untried": ("·", "not tried"),
         "discarded": ("·", "discarded")}


def _candidates_html(title: str, rows: list[tuple[int, float | None]], texts: dict[int, str], symbol: str,
                     drafted: set[int], emitted: int | None) -> str:
    if not rows:
        return ""
    items = []
    for token, prob in rows:
        tags = [c for c, on in (("sl-is-draft", token in drafted), ("sl-is-emitted", token == emitted)) if on]
        width = f"{100 * prob:.0f}" if prob is not None else "0"
        value = prob_text(prob) if prob is not None else "?"
        items.append(f'<li class="{" ".join(["sl-cand", *tags])}">{token_html(texts.get(token, "?"))}'
                     f'<span class="sl-bar"><span style="width:{width}%"></span></span>'
                     f'<span class="sl-prob">{symbol} = {value}</span></li>')
    return f'<div class="sl-cands"><div class="sl-cands-title">{escape(title)}</div><ol>{"".join(items)}</ol></div>'


def _position_html(pos: Position, texts: dict[int, str], chain: bool, last_drafted: int) -> str:
    if not last_drafted:
        head = "the next token"
    elif pos.depth > last_drafted:
        head = f"position {pos.depth}: past the deepest draft"
    else:
        head = f"depth {pos.depth}"
    lines = []
    for c in pos.drafts:
        mark, word = MARKS[c.status]
        q = f"q = {prob_text(c.q)} · " if c.q is not None else ""
        lines.append(f'<div class="sl-verdict sl-{c.status}"><span class="sl-mark">{mark}</span> draft '
                     f'{token_html(texts.get(c.token, "?"))} {word} <span class="sl-why">({q}p = {prob_text(c.p)}: '
                     f"{escape(c.why)})</span></div>")
    if not pos.drafts and last_drafted:
        lines.append('<div class="sl-verdict">no draft here: the target adds its own token after the last '
                     "accepted one</div>")
    drafted = {c.token for c in pos.drafts}
    emitted = pos.emitted[0] if pos.emitted else None
    drafter_title = "drafter's top 5 (q)" if chain else "drafter's candidates here (q)"
    lists = (_candidates_html(drafter_title, pos.drafter_top, texts, "q", drafted, emitted) +
             (_candidates_html("target's top 5 (p)", pos.target_top, texts, "p", drafted, emitted)
              if pos.target_top else '<div class="sl-cands sl-cands-none">target\'s top 5: not kept past the '
              "first rejection</div>"))
    if pos.emitted:
        token, p, how = pos.emitted
        out = (f'<div class="sl-emitted">emitted {token_html(texts.get(token, "?"), "sl-is-emitted")} '
               f'<span class="sl-why">(p = {prob_text(p)}: {escape(how)})</span></div>')
    else:
        out = ""
    return (f'<div class="sl-pos"><div class="sl-pos-head">{escape(head)}</div>{"".join(lines)}'
            f'<div class="sl-cands-row">{lists}</div>{out}</div>')


def is_chain(record: StepRecord) -> bool:
    """Whether a step drafted a chain (its drafts in a row, none a lookup branch beside a tree)."""
    tree = record.tree
    path = tree is not None and all(p == i for i, p in enumerate(tree.parents))
    return record.draft_top is not None or path and tree.copied in (0, len(tree.tokens))


def _summary(record: StepRecord) -> str:
    if record.step == 0:
        return "the prefill: the target read the prompt and chose the first token itself"
    if record.tree is None:
        return "target only: no drafts, one token per target forward"
    tree = record.tree
    depth = max(tree.depths, default=0)
    if tree.copied == len(tree.tokens):  # the n-gram method: every draft a copy
        shape = f"a chain of {len(tree.tokens)} tokens copied from the text: what followed its last tokens where " \
                "they appeared before (no drafter)"
    elif is_chain(record):
        shape = f"a chain of {len(tree.tokens)} drafts"
    else:
        shape = f"a tree of {len(tree.tokens)} drafts, {depth} deep"
    if 0 < tree.copied < len(tree.tokens):
        shape += (f" (the last {tree.copied} copied from the text: what followed its last tokens where they "
                  "appeared before)")
    cut = " — the reply ended inside this step" if cut_short(record) else ""
    return (f"drafted {shape}; the target accepted {record.num_accepted} and emitted "
            f"{len(record.token_ids)} token{'s' if len(record.token_ids) != 1 else ''}{cut}")


def _copied_html(copied_from: tuple[str, str, str] | None) -> str:
    """Where the copies came from: the earlier text, its matched suffix marked, then what was copied."""
    if copied_from is None:
        return ""
    before, matched, source = (escape(t) for t in copied_from)
    return (f'<div class="sl-insp-copy">copied from earlier in the text, where its last tokens appeared before: '
            f'…{before}<mark title="the suffix the lookup matched">{matched}</mark>'
            f'<u title="what followed it there: the copy">{source}</u>…</div>')


def _nav(step: int, last: int) -> str:
    def link(to: int, label: str, title: str) -> str:
        off = " disabled" if not 0 <= to <= last else ""
        return (f'<button class="sl-step-link" data-step="{to}" title="{escape(title)}"{off}>'
                f"{escape(label)}</button>")
    return (link(step - 1, "◀", "previous step") + link(step + 1, "▶", "next step") +
            '<button class="sl-step-link sl-close" data-step="-1" title="close the inspector">×</button>')


def render_inspector(trace: RunTrace | None, step: int | None, texts: dict[int, str],
                     copied_from: tuple[str, str, str] | None = None) -> str:
    """Step `step` of the run (0: the prefill), or the hint when there is none to show. copied_from:
    where its copied drafts came from (Session.copy_context): the text before, the suffix the lookup
    matched, the copy's source."""
    if trace is None or step is None or not 0 <= step < len(trace.steps):
        return f'<div class="sl-inspector sl-inspector-empty">{escape(HINT)}</div>'
    record = trace.steps[step]
    rule = acceptance_rule(trace.settings)
    chain = record.tree is not None and is_chain(record)
    pos = positions(record, rule)
    last_drafted = max(record.tree.depths, default=0) if record.tree else 0
    draft = "".join(token_html(texts.get(t, "?"), "sl-draft-ok" if n in (record.tree.path if record.tree else [])
                               else "sl-draft-no") for n, t in enumerate(record.draft_ids, 1)) if chain else ""
    timing = (f"prefill {record.verify_ms:.1f} ms" if record.step == 0 else
              f"draft {record.draft_ms:.1f} ms · verify {record.verify_ms:.1f} ms")
    parts = [
        f'<div class="sl-insp-head"><b>Step {record.step}</b><span class="sl-insp-time">{escape(timing)}</span>'
        f'<span class="sl-insp-nav">{_nav(record.step, len(trace.steps) - 1)}</span></div>',
        f'<div class="sl-insp-summary">{escape(_summary(record))}</div>',
        f'<div class="sl-insp-draft">the draft: {draft}</div>' if draft else "",
        _copied_html(copied_from),
        f'<div class="sl-insp-rule">{escape(RULES[rule])}</div>' if record.tree is not None else "",
        *(_position_html(p, texts, chain, last_drafted) for p in pos),
        '<div class="sl-insp-foot">draft: the drafter proposing this step\'s tokens; verify: the target\'s one '
        "forward over the last token and every draft, and the acceptance test.</div>" if record.tree else "",
    ]
    return f'<div class="sl-inspector" data-inspected="{record.step}">{"".join(parts)}</div>'
