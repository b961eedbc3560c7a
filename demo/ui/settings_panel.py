"""The settings in the sidebar: method, mode, k and the draft's shape, sampling, max new tokens,
seed and the target-only comparison; the legend follows k, the comparison follows the method, the
tree's options follow the shape. Phones start with the sidebar closed ("⚙ Settings" opens it).
"""

from __future__ import annotations

import math

import gradio as gr

from demo.config import MAX_DRAFT_TOKENS, MAX_LOOKUP, MAX_TREE_TOPK, DraftShape, Rule, TreeShape

from demo.methods import DEFAULT_METHOD, METHOD_LABELS, MODE_LABELS, REGISTRY, default_tree
from demo.service import zerogpu
from demo.service.model_cache import RANDOM_INIT
from demo.service.request import DEFAULT_REQUEST, LIMITS, NO_COMPARISON, RequestError, check_number, most_new_tokens
from demo.service.session import Session
from demo.service.settings import AppSettings
from demo.ui.controls import Controls
from demo.ui.events import PRIVATE
from demo.ui.html.render import render_legend, status_html

DRAFT_SAMPLING_CHOICES = [  # (label, value): one line each on what a step drafts at T > 0
    ("pointmass: top choices, accepted with p", Rule.POINTMASS.value),
    ("q: drawn from q, accepted with min(1, p/q)", Rule.Q.value),
    ("wor: drawn from q without replacement, each tried against what the rejections left", Rule.WOR.value),
]
# At phone width (Gradio's sidebar turns full-screen at 768 px) the settings start closed, so the
# title, the prompt and the text come first; "Settings" opens them.
CLOSE_SETTINGS_ON_PHONES_JS = """() => {
  if (!window.matchMedia('(max-width: 768px)').matches) return;
  let tries = 50;
  const close = () => {
    const bar = document.querySelector('#sl-sidebar');
    if (bar && bar.classList.contains('open')) bar.querySelector('.toggle-button').click();
    else if (!bar && tries-- > 0) setTimeout(close, 100);
  };
  close();
}"""
TOGGLE_SETTINGS_JS = "() => { document.querySelector('#sl-sidebar .toggle-button')?.click(); }"


def method_choices(session: Session) -> list[tuple[str, str]]:
    return [(METHOD_LABELS[m] + (" (random-init)" if session.drafter_labels.get(m) == RANDOM_INIT else ""), m)
            for m in session.methods()]


def shape_choice(method: str) -> dict:
    """The drafting shape's state for `method`: a method of chains fixes it to a chain."""
    spec = REGISTRY.get(method)
    if spec is not None and spec.proposer is not None and not spec.trees:
        return dict(interactive=False, info=f"{spec.label} drafts a chain: k tokens copied in a row")
    return dict(interactive=True, info="chain: k drafts in a row; tree: top-k children per node, k deep")


def compare_options(method: str) -> dict:
    """The comparison checkbox's state for `method`: off for target only, which is the baseline."""
    if method == "none":
        return dict(interactive=False, info=f"not for target only: {NO_COMPARISON}")
    return dict(interactive=True, info="then run the same prompt without drafts: speedup, and at T = 0 a "
                "token-identity check")


def verified_range(depth: int, topk: int) -> tuple[int, int]:
    """The tokens a tree of this depth and top-k can verify per step, the root included: a path of
    `depth` nodes at the least, every candidate at the most (capped by MAX_DRAFT_TOKENS)."""
    shape = DraftShape.of(depth, TreeShape(topk, 0))
    return min(depth + 1, MAX_DRAFT_TOKENS), min(shape.candidates + 1, MAX_DRAFT_TOKENS)


def default_verified(device_type: str, method: str, temperature) -> int:
    """The tokens verified per step the slider follows until the visitor sets it: the tree's that
    `method` offers first at this temperature, else the device's default tree's (0: every node)."""
    spec = REGISTRY.get(method) if isinstance(method, str) else None
    first = spec.default_draft(device_type, temperature)[1] if spec is not None else None
    return (first or default_tree(device_type)).size


def verified_value(depth, topk, wanted: int) -> int:
    """`wanted` tokens verified (0: every node) where a tree of this depth and top-k allows them,
    else the nearest it allows."""
    lo, hi = verified_range(int(depth), int(topk))
    return min(max(wanted or hi, lo), hi)


# The settings a visitor can type out of range, as the request names them: a typed value outside its
# box's range is refused in one sentence that says the range and the value the box is set back to.
TYPED = {"num_spec_tokens": "k", "max_new_tokens": "max new tokens", "temperature": "temperature",
         "top_p": "top-p", "seed": "seed"}


def build_settings(session: Session, defaults: AppSettings) -> dict:
    """Every setting of a request (the preset and "Your own models" are demo/ui/models_panel.py's)."""
    method = gr.Radio(method_choices(session), value=defaults.method or session.default_method(),
                      label="Drafting method", elem_id="sl-method")
    unavailable = session.cudagraph_unavailable()
    gen = DEFAULT_REQUEST.gen
    mode = gr.Radio([(label, mode) for mode, label in MODE_LABELS.items()], value=session.default_mode(), label="Mode",
                    interactive=unavailable is None, elem_id="sl-mode",
                    info=f"CUDA graph unavailable: {unavailable}." if unavailable else
                    f"CUDA graph: {zerogpu.GRAPHS_PER_CALL}." if zerogpu.active() else
                    "CUDA graph: each step replays graphs captured before the first request.")
    k, tree = session.default_draft()
    lo, hi = LIMITS["num_spec_tokens"]
    num_spec_tokens = gr.Slider(lo, hi, value=defaults.k or k, step=1, label="k: chain length or tree depth",
                                elem_id="sl-k", info="draft tokens per step in a chain; a tree's depth")
    draft_shape = gr.Radio(["chain", "tree"], value="tree" if tree else "chain", label="Drafting shape",
                           elem_id="sl-shape", **shape_choice(method.value))
    tree = tree or default_tree(session.device.type)
    lo_nodes, hi_nodes = verified_range(defaults.k or k, tree.topk)
    nodes = verified_value(defaults.k or k, tree.topk, tree.size)
    with gr.Column(visible=draft_shape.value == "tree", elem_id="sl-tree-options") as tree_options:
        tree_topk = gr.Slider(1, MAX_TREE_TOPK, value=tree.topk, step=1, label="Tree top-k", elem_id="sl-tree-topk",
                              info="children expanded per node (1: a chain)")
        num_draft_tokens = gr.Slider(lo_nodes, hi_nodes, value=nodes, step=1, label="Tokens verified per step",
                                     elem_id="sl-draft-tokens",
                                     info="the root included; the most: every drafted node")
        lookup = gr.Slider(0, MAX_LOOKUP, value=tree.lookup, step=1, label="Lookup branch", elem_id="sl-lookup",
                           info="tokens copied from the text where its last words appeared before, verified "
                                "beside the tree (T = 0 and point-mass drafts); 0: none")
    draft_sampling = gr.Radio(DRAFT_SAMPLING_CHOICES, value=gen.draft_sampling, label="Draft sampling at T > 0",
                              elem_id="sl-draft-sampling", info="at T = 0 drafts are the drafter's top choices")
    temperature = gr.Slider(*LIMITS["temperature"], value=gen.temperature, step=0.05, label="Temperature",
                            info="0 = greedy (identical to target-only)", elem_id="sl-temperature")
    top_p = gr.Slider(*LIMITS["top_p"], value=gen.top_p, step=0.01, label="Top-p", elem_id="sl-top-p")
    most = most_new_tokens(session.max_context)  # the prompt shares the context with the reply
    max_new_tokens = gr.Slider(LIMITS["max_new_tokens"][0], most, step=1, label="Max new tokens",
                               value=min(defaults.max_new_tokens or gen.max_new_tokens, most), elem_id="sl-max-new",
                               info=f"at most {most}: the model's {session.max_context}-token context also holds "
                               "the prompt")
    seed = gr.Number(gen.seed, precision=0, minimum=LIMITS["seed"][0], maximum=LIMITS["seed"][1], label="Seed",
                     elem_id="sl-seed")
    compare = gr.Checkbox(DEFAULT_REQUEST.compare, label="Compare with target-only", elem_id="sl-compare",
                          **compare_options(method.value))
    return dict(method=method, mode=mode, num_spec_tokens=num_spec_tokens, draft_shape=draft_shape,
                tree_options=tree_options, tree_topk=tree_topk, num_draft_tokens=num_draft_tokens, lookup=lookup,
                draft_sampling=draft_sampling, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                seed=seed, compare=compare)


def shown_draft(draft: tuple[int, TreeShape | None], topk, nodes) -> tuple:
    """A draft (k, tree) as the page's k, shape, top-k and verified-tokens settings show it (a chain
    keeps whatever the hidden tree settings hold)."""
    k, tree = draft
    return (k, "chain", topk, nodes) if tree is None else (k, "tree", tree.topk, tree.size)


def draft_for_method(device_type: str, temperature, method: str, k, shape, topk, nodes) -> tuple | None:
    """The draft settings (k, shape, top-k, verified tokens) the page moves to when the method
    changes: `method`'s first draft at this temperature (Method.default_draft), where the page still
    shows a method's first draft (untouched); a method of chains turns a visitor's tree into a chain
    as deep; None: the settings stay."""
    spec = REGISTRY.get(method)
    if spec is None or spec.proposer is None:
        return None
    try:
        current = (int(k), shape, int(topk), int(nodes))
    except (TypeError, ValueError):
        return None
    firsts = [m.default_draft(device_type, temperature) for m in REGISTRY.values() if m.proposer is not None]
    if any(current[:2 if tree is None else 4] == shown_draft((d, tree), *current[2:])[:2 if tree is None else 4]
           for d, tree in firsts):
        return shown_draft(spec.default_draft(device_type, temperature), *current[2:])
    if shape == "tree" and not spec.trees:
        return (current[0], "chain", *current[2:])
    return None


def draft_at_temperature(device_type: str, temperature, k, shape, topk, nodes,
                         method: str = DEFAULT_METHOD) -> tuple | None:
    """The draft settings (k, shape, top-k, verified tokens) the page moves to when the temperature
    changes: `method`'s fastest shape on the device at the new temperature (``default_draft``), where
    the page still shows its fastest at the other side of 0; a shape the visitor chose stays (None)."""
    spec = REGISTRY.get(method) if isinstance(method, str) else None
    if spec is None or spec.proposer is None:
        return None
    greedy, sampled = spec.default_draft(device_type, 0.0), spec.default_draft(device_type, 1.0)
    if greedy == sampled:
        return None
    here = spec.default_draft(device_type, temperature)
    there = sampled if here == greedy else greedy
    try:
        current = (int(k), shape, int(topk), int(nodes))
    except (TypeError, ValueError):
        return None
    width = 2 if there[1] is None else 4  # a chain is its k and shape; a tree's top-k and tokens count too
    if current[:width] != shown_draft(there, *current[2:])[:width]:
        return None
    return shown_draft(here, *current[2:])


def refusal(name: str, value, lo, hi) -> tuple[str, float] | None:
    """(the sentence refusing a typed `value` of setting `name` outside [lo, hi] or not a number, the
    value the box is set back to: the nearest in range, `lo` for no number); None for a good value."""
    try:
        check_number(name, value, lo, hi)
    except RequestError as e:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        back = min(max(round(value) if isinstance(lo, int) else value, lo), hi) if number else lo
        return f"{str(e).rstrip('.')}; set to {back}.", back
    return None


def register(c: Controls, device_type: str) -> None:
    """What follows a setting on the page at once (no queue, no engine); `device_type`: where the
    app's models run, whose fastest draft shapes the settings start from."""

    def refuse(message: str) -> dict:
        gr.Warning(message)
        return {c.status: status_html(message)}

    def typed(field: str):
        """Listeners that read the raw value (Gradio's own bounds check would log a traceback) and
        answer a bad one once: a slider on release, which sends the typed value (its change may
        carry it too, or already the browser's clamped one), a number box on change."""
        component = c.generation[field]
        lo, hi = component.minimum, component.maximum  # the box's range (max new tokens: the model's)
        slider = isinstance(component, gr.Slider)

        def answer(value, speak: bool) -> dict:
            bad = refusal(TYPED[field], value, lo, hi)
            out = {c.status: gr.skip(), component: gr.skip()}
            if bad and speak:
                message, back = bad
                out = {**refuse(message), component: back}
            if field == "num_spec_tokens":
                out[c.legend] = gr.skip() if bad else render_legend(int(value))
            return out

        def setting_checked(value):
            return answer(value, speak=not slider)

        def setting_released(evt: gr.EventData):
            """On leaving a slider's number box, which sends the typed value before clamping it."""
            return answer(evt._data, speak=True)
        return setting_checked, setting_released

    # the tokens verified per step the visitor set (None: not set, or set back to the default): the
    # slider holds them wherever the tree allows them, so k or top-k going and coming back restores them
    chosen = gr.State(None)

    def choose(verified, depth, topk, method, temperature):
        """The visitor's own tokens verified per step (None where they set the default's)."""
        default = verified_value(depth, topk, default_verified(device_type, method, temperature))
        return None if int(verified) == default else int(verified)

    def tree_sizes(depth, topk, wanted, method, temperature):
        """The verified tokens' slider spans what a tree of this depth and top-k can verify and holds
        the visitor's value, or untouched the default's, as near as the tree allows."""
        lo, hi = verified_range(int(depth), int(topk))
        wanted = default_verified(device_type, method, temperature) if wanted is None else wanted
        return gr.update(minimum=lo, maximum=hi, value=verified_value(depth, topk, wanted))

    def method_options(method, temperature, k, shape, topk, nodes):
        """The comparison and the drafting shape follow the method; an untouched draft becomes its first."""
        moved = draft_for_method(device_type, temperature, method, k, shape, topk, nodes)
        if moved is None:
            return [gr.update(**compare_options(method)), gr.skip(), gr.update(**shape_choice(method)), gr.skip(),
                    gr.skip()]
        k, shape, topk, nodes = moved
        return [gr.update(**compare_options(method)), k, gr.update(value=shape, **shape_choice(method)), topk, nodes]

    def shape_options(shape):
        return gr.Column(visible=shape == "tree")

    now = dict(queue=False, **PRIVATE)
    for field in TYPED:
        component = c.generation[field]
        checked, released = typed(field)
        outputs = [c.status, component, c.legend] if field == "num_spec_tokens" else [c.status, component]
        # the box is among the outputs (put back in range): no progress drawn over it as it moves
        component.change(checked, inputs=[component], outputs=outputs, preprocess=False, show_progress="hidden", **now)
        if isinstance(component, gr.Slider):
            component.release(released, outputs=outputs, show_progress="hidden", **now)
    tree_shape = [c.num_spec_tokens, c.tree_topk]
    for component in tree_shape:
        component.change(tree_sizes, inputs=[*tree_shape, chosen, c.method, c.temperature],
                         outputs=[c.num_draft_tokens], **now)
    c.num_draft_tokens.input(choose, inputs=[c.num_draft_tokens, *tree_shape, c.method, c.temperature],
                             outputs=[chosen], **now)

    def follow_temperature(temperature, k, shape, topk, nodes, method):
        """Across T = 0 an untouched draft shape becomes the method's fastest at the new temperature."""
        moved = draft_at_temperature(device_type, temperature, k, shape, topk, nodes, method)
        return [gr.skip()] * 4 if moved is None else list(moved)

    draft = [c.num_spec_tokens, c.draft_shape, c.tree_topk, c.num_draft_tokens]
    c.temperature.change(follow_temperature, inputs=[c.temperature, *draft, c.method], outputs=draft,
                         preprocess=False, **now)
    c.method.change(method_options, inputs=[c.method, c.temperature, *draft], outputs=[c.compare, *draft],
                    preprocess=False, **now)
    c.draft_shape.change(shape_options, inputs=[c.draft_shape], outputs=[c.tree_options], **now)
    c.settings_button.click(None, js=TOGGLE_SETTINGS_JS, **PRIVATE)
