"""The Gradio UI: layout builders that return components, then one block that registers listeners.

Handlers only translate between components and demo/service/session.py (which owns models, engines and
request checks); figures come from demo/ui/figures.py and HTML from demo/ui/html/render.py; demo/service/hosting.py
says what a public app leaves out and limits.

Each visitor's preset lives in their own gr.State (``Controls.model``) and picks the entry of the
shared ``ModelCache`` their requests use; nothing a visitor does changes another's models. In local
mode "Your own models" loads a target or drafters for that visitor too (a new drafter for the same
target changes the shared models in place: local mode is one trusted user).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import gradio as gr

from demo.service import zerogpu
from demo.ui.bench_tab import BenchControls, build_bench_tab, register_bench_listeners
from demo.service.chat import ChatState, RunTrace
from demo.service import downloads
from demo.service.engine_thread import engine_thread_idle, on_engine_thread
from demo.ui.figures import (CHART_DEFINITIONS, acceptance_figure, acceptance_length_figure, latency_figure,
                          throughput_figure, tree_figure)
from demo.ui.html.headline import baseline_key, record_baseline, render_headline
from demo.ui.html.inspector import rejected_texts, render_inspector, shown_ids
from demo.methods import METHOD_LABELS, MODE_LABELS
from demo.metrics import DEFINITIONS, AcceptanceStats
from demo.ui.html.render import escape, render_chat, render_comparison, render_legend, render_stats
from demo.ui.html.race import render_race, render_race_hint
from demo.service.hosting import Hosting
from demo.models.presets import PRESETS
from demo.ui.replay import PACES, REAL_TIME, chat_at, play, race_frames, race_scale, replay_frames, step_at
from demo.tree import MAX_DRAFT_TOKENS, MAX_TREE_TOPK, TreeShape, default_tree
from demo.service.session import (DEFAULT_REQUEST, LIMITS, NO_COMPARISON, RANDOM_INIT, ModelCache, ModelChoice, Request,
                          RequestError, Session, panel_stats, preset_names)
from demo.service.settings import AppSettings
from demo.ui.trace_download import build_trace_download, register_trace_download

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
# Each refresh sends the whole reply's HTML and redraws the charts, so a long reply streamed faster
# than a slow browser redraws it queues updates there: on 2 busy cores a page refreshed up to 30
# times a second (charts 4) fell minutes behind and took no clicks (the browser test's Stop click
# timed out in 3 of 8 runs, 1 of 2 beside a busy process); at 10 and 2, 3 of 3 beside one passed.
TEXT_INTERVAL_S = 1 / 10  # the text refreshes every step, but at most 10 times a second (GPU steps take ms)
FIGURE_INTERVAL_S = 0.5  # the charts refresh at most this often while streaming
ENGINE = "engine"  # concurrency group of everything that touches the models: one at a time
PROMPT_HINT = "Ask something, then press Generate or Shift+Enter (Enter starts a new line)"
DRAFT_SAMPLING_CHOICES = [  # (label, value): one line each on what a step drafts at T > 0
    ("pointmass: top choices, accepted with p", "pointmass"),
    ("q: drawn from q, accepted with min(1, p/q)", "q"),
]
PLAYBACK = "playback"  # concurrency group of replays and races: no engine, several at once
PLAYBACK_CONCURRENCY = 8
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
NOTHING_TO_REPLAY = "Nothing to replay yet: generate a reply first."
RACE_NEEDS_COMPARISON = ("The race needs the target-only run of the same prompt: tick “Compare with target-only” "
                         "in the settings and generate.")


def read_asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def example_prompts() -> list[str]:
    return json.loads(read_asset("examples.json"))


@dataclass
class Controls:
    """The components the listeners read and write."""

    chat: gr.State
    model: gr.State  # the name of the visitor's models (a preset's): a ModelCache key
    conversation: gr.HTML
    legend: gr.HTML
    prompt: gr.Textbox
    generate: gr.Button
    stop: gr.Button
    clear: gr.Button
    status: gr.HTML
    comparison: gr.HTML
    settings_button: gr.Button
    pace: gr.Radio
    replay: gr.Button
    race: gr.HTML
    race_button: gr.Button
    notices: gr.HTML
    preset: gr.Dropdown
    method: gr.Radio
    mode: gr.Radio
    num_spec_tokens: gr.Slider
    draft_shape: gr.Radio
    tree_options: gr.Column
    tree_topk: gr.Slider
    num_draft_tokens: gr.Slider
    draft_sampling: gr.Radio
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    seed: gr.Number
    compare: gr.Checkbox
    stats: gr.HTML
    acceptance: gr.Plot
    acceptance_length: gr.Plot
    latency: gr.Plot
    throughput: gr.Plot
    tree: gr.Plot
    tree_step: gr.Slider
    headline: gr.HTML  # tokens per target call and the speedup, large
    show_rejected: gr.Checkbox
    inspector: gr.HTML  # the step of a clicked or tapped token (its JS sends the step)
    baselines: gr.State  # the visitor's measured target-only tokens/s, by baseline_key(model, mode)
    # "Your own models": local mode only (public mode neither builds them nor registers their events)
    target_spec: gr.Textbox | None = None
    eagle_spec: gr.Textbox | None = None
    eagle3_spec: gr.Textbox | None = None
    load: gr.Button | None = None
    trace_download: gr.DownloadButton | None = None  # the latest run's trace (demo/ui/trace_download.py)
    bench: BenchControls | None = None  # the Benchmark tab (demo/ui/bench_tab.py)

    @property
    def settings(self) -> set:
        """The components a request is read from (handlers get their values by component)."""
        return {self.method, self.mode, self.compare, self.draft_shape, self.tree_topk, self.num_draft_tokens,
                *self.generation.values()}

    @property
    def generation(self) -> dict:
        """GenerationConfig field -> the component that sets it."""
        return {"num_spec_tokens": self.num_spec_tokens, "draft_sampling": self.draft_sampling,
                "temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens,
                "seed": self.seed}

    @property
    def plots(self) -> list:
        return [self.acceptance, self.acceptance_length, self.latency, self.throughput]

    def request(self, prompt: str, values: dict) -> Request:
        """The request the settings' current values describe (values: component -> value)."""
        as_int = lambda v: int(v) if isinstance(v, float) and v.is_integer() else v  # noqa: E731 (sliders send floats)
        tree = (TreeShape(as_int(values[self.tree_topk]), as_int(values[self.num_draft_tokens]))
                if values[self.draft_shape] == "tree" else None)
        return Request.of(prompt or "", method=values[self.method], mode=values[self.mode],
                          compare=bool(values[self.compare]), tree=tree,
                          **{name: as_int(values[comp]) for name, comp in self.generation.items()})


def status_html(text: str, kind: str = "info") -> str:
    return f'<div class="sl-status-{kind}">{escape(text)}</div>' if text else ""


def notices_html(session: Session) -> str:
    items = "".join(f"<li>{escape(w)}</li>" for w in session.warnings)
    return f'<div class="sl-warning"><b>⚠ Note</b><ul>{items}</ul></div>' if items else ""


def figures_of(trace: RunTrace | None, k: int = 3) -> list:
    stats = trace.stats if trace else AcceptanceStats(k)
    points = trace.points if trace else []
    return [acceptance_figure(stats), acceptance_length_figure(points), latency_figure(points),
            throughput_figure(points)]


def tree_view(session: Session, trace: RunTrace | None, step: int | None = None):
    """The tree of `step` (1-based; None: the latest) of the run, with its tokens' texts."""
    trees = trace.trees if trace else []
    if not trees:
        return tree_figure(None, [], 0, "target only: no drafts" if trace and trace.points else "no steps yet")
    i = min(max(int(step or len(trees)), 1), len(trees)) - 1
    tree = trees[i]
    return tree_figure(tree, session.token_texts([trace.roots[i], *tree.tokens]), i + 1)


def tree_step_update(trace: RunTrace | None, step: int | None = None):
    """The step slider over the run's trees, on `step` (None: the latest) (Gradio wants maximum >
    minimum, so it spans 1..2, disabled, until there are two)."""
    n = len(trace.trees) if trace else 0
    return gr.update(maximum=max(n, 2), value=min(max(step or n, 1), max(n, 1)), interactive=n > 1)


def conversation_html(session: Session, chat: ChatState) -> str:
    """The conversation as the page shows it: the latest reply inspectable, with its rejected drafts
    (the show-rejected toggle hides them in the browser)."""
    return render_chat(chat, rejected_texts(chat.trace, session.token_texts))


def inspector_html(session: Session, trace: RunTrace | None, step: int | None) -> str:
    """Step `step` of the run taken apart (demo/ui/html/inspector.py), its tokens' texts from the tokenizer."""
    record = trace.steps[step] if trace and step is not None and 0 <= step < len(trace.steps) else None
    ids = shown_ids(record) if record else []
    return render_inspector(trace, step, dict(zip(ids, session.token_texts(ids))) if ids else {})


def method_choices(session: Session) -> list[tuple[str, str]]:
    return [(METHOD_LABELS[m] + (" (random-init)" if session.drafter_labels.get(m) == RANDOM_INIT else ""), m)
            for m in session.methods()]


def default_method(session: Session) -> str:
    return session.methods()[-1]  # EAGLE-3 when loaded, else EAGLE, else target only


def preset_options(device) -> list[tuple[str, str]]:
    """(label, name) of each preset; one that cannot run on `device` says why in its label."""
    return [(name + (f" (unavailable: {why})" if (why := PRESETS[name].unavailable(device)) else ""), name)
            for name in preset_names()]


def compare_options(method: str) -> dict:
    """The comparison checkbox's state for `method`: off for target only, which is the baseline."""
    if method == "none":
        return dict(interactive=False, info=f"not for target only: {NO_COMPARISON}")
    return dict(interactive=True, info="then run the same prompt without drafts: speedup, and at T = 0 a "
                "token-identity check")


# ---------------------------------------------------------------------- layout
def build_chat_column(k: int) -> dict:
    headline = gr.HTML(render_headline(None), elem_id="sl-headline")
    legend = gr.HTML(render_legend(k), elem_id="sl-legend")
    show_rejected = gr.Checkbox(True, label="show rejected drafts", elem_id="sl-show-rejected", container=False)
    conversation = gr.HTML(render_chat(ChatState()), elem_id="sl-conversation")
    inspector = gr.HTML(render_inspector(None, None, {}), elem_id="sl-inspector", js_on_load=read_asset("inspect.js"))
    with gr.Row(elem_id="sl-input-row"):
        # lines > 1: Gradio's textbox inserts a newline on Enter and submits on Shift+Enter
        prompt = gr.Textbox(placeholder=PROMPT_HINT,
                            show_label=False, lines=2, max_lines=8, scale=5, elem_id="sl-prompt")
        with gr.Column(scale=1, min_width=130):
            generate = gr.Button("Generate", variant="primary", elem_id="sl-generate")
            with gr.Row():
                stop = gr.Button("Stop", variant="stop", elem_id="sl-stop", min_width=55)
                clear = gr.Button("Clear", elem_id="sl-clear", min_width=55)
            settings_button = gr.Button("⚙ Settings", size="sm", elem_id="sl-settings-button")
    status = gr.HTML("", elem_id="sl-status")
    comparison = gr.HTML("", elem_id="sl-comparison")
    return dict(headline=headline, legend=legend, show_rejected=show_rejected, conversation=conversation,
                inspector=inspector, prompt=prompt, generate=generate, stop=stop, clear=clear,
                settings_button=settings_button, status=status, comparison=comparison)


def build_playback_row() -> dict:
    """How fast steps are shown, and Replay of the latest reply from its trace."""
    with gr.Row(elem_id="sl-play-row", equal_height=True):
        pace = gr.Radio(list(PACES), value=REAL_TIME, label="Pace", scale=4, elem_id="sl-pace",
                        info="real time: each step after its engine time; slower: the run goes at full speed, "
                             "then plays back step by step")
        replay = gr.Button("↺ Replay", scale=1, min_width=96, elem_id="sl-replay")
    return dict(pace=pace, replay=replay)


def build_settings(session: Session, hosting: Hosting, defaults: AppSettings = AppSettings()) -> dict:
    preset = gr.Dropdown(preset_options(session.device), value=session.name if session.name in PRESETS else None,
                         label="Model preset", elem_id="sl-preset")
    method = gr.Radio(method_choices(session), value=defaults.method or default_method(session),
                      label="Drafting method", elem_id="sl-method")
    unavailable = session.cudagraph_unavailable()
    gen = DEFAULT_REQUEST.gen
    mode = gr.Radio([(label, mode) for mode, label in MODE_LABELS.items()], value=DEFAULT_REQUEST.mode, label="Mode",
                    interactive=unavailable is None, elem_id="sl-mode",
                    info=f"CUDA graph unavailable: {unavailable}." if unavailable else
                    "CUDA graph: each step replays graphs captured before the first request.")
    k, tree = session.default_draft()
    k = defaults.k or k
    lo, hi = LIMITS["num_spec_tokens"]
    num_spec_tokens = gr.Slider(lo, hi, value=k, step=1, label="k: chain length or tree depth", elem_id="sl-k",
                                info="draft tokens per step in a chain; a tree's depth")
    draft_shape = gr.Radio(["chain", "tree"], value="tree" if tree else "chain", label="Drafting shape",
                           elem_id="sl-shape", info="chain: k drafts in a row; tree: top-k children per node, k deep")
    tree = tree or default_tree(session.device.type)
    with gr.Column(visible=draft_shape.value == "tree", elem_id="sl-tree-options") as tree_options:
        tree_topk = gr.Slider(1, MAX_TREE_TOPK, value=tree.topk, step=1, label="Tree top-k", elem_id="sl-tree-topk",
                              info="children expanded per node (1: a chain)")
        num_draft_tokens = gr.Slider(0, MAX_DRAFT_TOKENS, value=tree.num_draft_tokens, step=1,
                                     label="Tokens verified per step", elem_id="sl-draft-tokens",
                                     info="the root included; 0 = every drafted node")
    draft_sampling = gr.Radio(DRAFT_SAMPLING_CHOICES, value=gen.draft_sampling, label="Draft sampling at T > 0",
                              elem_id="sl-draft-sampling", info="at T = 0 drafts are the drafter's top choices")
    temperature = gr.Slider(*LIMITS["temperature"], value=gen.temperature, step=0.05, label="Temperature",
                            info="0 = greedy (identical to target-only)", elem_id="sl-temperature")
    top_p = gr.Slider(*LIMITS["top_p"], value=gen.top_p, step=0.01, label="Top-p", elem_id="sl-top-p")
    max_new_tokens = gr.Slider(*LIMITS["max_new_tokens"], value=defaults.max_new_tokens or gen.max_new_tokens, step=1,
                               label="Max new tokens", elem_id="sl-max-new")
    seed = gr.Number(gen.seed, precision=0, minimum=LIMITS["seed"][0], maximum=LIMITS["seed"][1], label="Seed",
                     elem_id="sl-seed")
    compare = gr.Checkbox(DEFAULT_REQUEST.compare, label="Compare with target-only", elem_id="sl-compare",
                          **compare_options(method.value))
    settings = dict(preset=preset, method=method, mode=mode, num_spec_tokens=num_spec_tokens, draft_shape=draft_shape,
                    tree_options=tree_options, tree_topk=tree_topk, num_draft_tokens=num_draft_tokens,
                    draft_sampling=draft_sampling, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, seed=seed, compare=compare)
    return settings if hosting.public else {**settings, **build_custom_models(session)}


def build_custom_models(session: Session) -> dict:
    """Local mode only: a target and drafters by path or hub id."""
    with gr.Accordion("Your own models", open=False, elem_id="sl-custom"):
        gr.Markdown("A local directory or a Hugging Face hub id (owner/name). An empty field keeps what is "
                    "loaded; a new drafter does not reload the target.", elem_classes=["sl-caption"])
        target_spec = gr.Textbox(label="Target", placeholder=session.target_spec, elem_id="sl-target-spec")
        eagle_spec = gr.Textbox(label="EAGLE drafter", elem_id="sl-eagle-spec")
        eagle3_spec = gr.Textbox(label="EAGLE-3 drafter", elem_id="sl-eagle3-spec")
        load = gr.Button("Load", elem_id="sl-load")
    return dict(target_spec=target_spec, eagle_spec=eagle_spec, eagle3_spec=eagle3_spec, load=load)


def build_chart(name: str, figure) -> gr.Plot:
    with gr.Column(elem_classes=["sl-chart"], min_width=320):
        plot = gr.Plot(figure, show_label=False, elem_id=f"sl-plot-{name}")
        gr.Markdown(CHART_DEFINITIONS[name], elem_classes=["sl-caption"])
    return plot


def build_tree_panel() -> dict:
    with gr.Column(elem_id="sl-tree-panel", elem_classes=["sl-chart"]):
        tree = gr.Plot(tree_figure(None, [], 0), show_label=False, elem_id="sl-plot-tree")
        tree_step = gr.Slider(1, 2, value=1, step=1, label="Step", interactive=False, elem_id="sl-tree-step",
                              info="which decoding step's tree to show (the latest while generating)")
        gr.Markdown(CHART_DEFINITIONS["tree"], elem_classes=["sl-caption"])
    return dict(tree=tree, tree_step=tree_step)


def build_chart_tabs() -> dict:
    """The tree view, the charts and the race in tabs: one at a time beside the text (or under it
    on a phone). Gradio draws a tab's contents when it is first opened, with their latest values."""
    empty = dict(zip(["acceptance", "acceptance_length", "latency", "throughput"], figures_of(None)))
    with gr.Tabs(elem_id="sl-chart-tabs"):
        with gr.Tab("Draft tree", id="tree", elem_id="sl-tab-tree"):
            tree_parts = build_tree_panel()
        with gr.Tab("Acceptance", id="acceptance", elem_id="sl-tab-acceptance"):
            plots = {name: build_chart(name, empty[name]) for name in ("acceptance", "acceptance_length")}
        with gr.Tab("Time", id="time", elem_id="sl-tab-time"):
            plots |= {name: build_chart(name, empty[name]) for name in ("latency", "throughput")}
        with gr.Tab("Race", id="race", elem_id="sl-tab-race"):
            race = gr.HTML(render_race_hint(), elem_id="sl-race")
            race_button = gr.Button("▶ Race", elem_id="sl-race-button")
            gr.Markdown("The same prompt with drafts and target-only, replayed on one clock of engine time at the "
                        "pace chosen under the prompt (real time: as measured; slower: a target-only step lasts "
                        "that long).", elem_classes=["sl-caption"])
    return dict(**tree_parts, **plots, race=race, race_button=race_button)


def build_layout(session: Session, hosting: Hosting, defaults: AppSettings = AppSettings()) -> Controls:
    """Two tabs: the chat page, and the Benchmark tab (demo/ui/bench_tab.py)."""
    with gr.Tabs(elem_id="sl-tabs"):
        with gr.Tab("Chat", id="chat", elem_id="sl-tab-chat"):
            controls = build_chat_page(session, hosting, defaults)
        controls.bench = build_bench_tab(session, hosting)
    return controls


def build_chat_page(session: Session, hosting: Hosting, defaults: AppSettings) -> Controls:
    with gr.Sidebar(open=True, width=340, elem_id="sl-sidebar"):
        settings = build_settings(session, hosting, defaults)
    gr.Markdown(read_asset("intro.md"), elem_id="sl-intro")
    with gr.Accordion("What am I looking at?", open=False, elem_id="sl-explainer"):
        gr.Markdown(read_asset("explainer.md"))
    notices = gr.HTML(notices_html(session), elem_id="sl-notices")
    with gr.Row(elem_id="sl-top"):
        with gr.Column(scale=6, elem_id="sl-main"):
            chat_parts = build_chat_column(defaults.k or session.default_draft()[0])
            trace_download = build_trace_download()
            gr.Examples([[p] for p in example_prompts()], inputs=[chat_parts["prompt"]], label="Example prompts",
                        examples_per_page=len(example_prompts()), elem_id="sl-examples")
        with gr.Column(scale=5, elem_id="sl-charts"):
            chart_parts = {**build_playback_row(), **build_chart_tabs()}
    with gr.Accordion("Numbers of this run", open=True, elem_id="sl-stats-panel"):
        stats = gr.HTML(render_stats(panel_stats(session, None), DEFINITIONS), elem_id="sl-stats")
    return Controls(chat=gr.State(ChatState()), model=gr.State(session.name), baselines=gr.State({}),
                    notices=notices, stats=stats, trace_download=trace_download,
                    **chat_parts, **settings, **chart_parts)


# ---------------------------------------------------------------------- listeners
def register_listeners(c: Controls, cache: ModelCache, hosting: Hosting) -> None:
    def visitor_session(name: str) -> Session:
        """The visitor's models, from the engine queue only (a preset evicted since loads again)."""
        try:
            return cache.session(name)
        except Exception as e:  # a failed load: the message says why
            raise RequestError(f"Could not load {name}: {e}. Choose a preset.") from None

    def shown_session(name: str) -> Session:
        """The visitor's models for display only: never loads (the default if they are not cached)."""
        return Session(cache.peek(name) or cache.peek(cache.default_name))

    def checked(session: Session, prompt: str, values: dict) -> Request:
        request = c.request(prompt, values)
        hosting.check_work(request, session.device)
        return request

    def user(values: dict):
        """Fast first half: check the request and show the user's turn (no engine call)."""
        try:
            session = visitor_session(values[c.model])
            chat = session.add_user_turn(values[c.chat], checked(session, values[c.prompt], values))
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None
        return {c.chat: chat, c.conversation: conversation_html(session, chat), c.prompt: "", c.comparison: "",
                c.race: render_race_hint(), c.status: status_html("starting…"),
                c.inspector: render_inspector(None, None, {})}

    def run_view(session: Session, chat: ChatState, figures: bool = True) -> dict:
        """The text, the stats and (with `figures`) the charts and the tree view of one chat state: one
        source, so they always show the same tokens."""
        out = {c.conversation: conversation_html(session, chat), c.stats: render_stats(panel_stats(session, chat.trace), DEFINITIONS)}
        if figures:
            out.update(zip(c.plots, figures_of(chat.trace)))
            out[c.tree] = tree_view(session, chat.trace)
            out[c.tree_step] = tree_step_update(chat.trace)
        return out

    def finished_race(chat: ChatState) -> str:
        """The race panel at the finish of both runs (the hint without a comparison)."""
        cmp = chat.comparison
        if cmp is None or cmp.baseline_trace is None or chat.trace is None:
            return render_race_hint()
        steps = (len(chat.trace.points), len(cmp.baseline_trace.points))
        t = max(chat.trace.stats.elapsed_s, cmp.baseline_trace.stats.elapsed_s)
        return render_race(METHOD_LABELS[chat.trace.method], chat.turns[-1], chat.trace, cmp.baseline,
                           cmp.baseline_trace, t, steps, cmp)

    def comparison_html(session: Session, chat: ChatState) -> str:
        cmp = chat.comparison
        return render_comparison(cmp.speedup, cmp.speculative_tokens_per_s, cmp.baseline_tokens_per_s, cmp.identical,
                                 cmp.first_difference, session.describe()["dtype"], cmp.reference_width,
                                 cmp.one_row_difference) if cmp else ""

    def bot(values: dict) -> Iterator[dict]:
        """Stream the reply: the text every step (at most every TEXT_INTERVAL_S), the charts at most
        every FIGURE_INTERVAL_S; the comparison's target-only run streams into the race panel, the
        speculative lane beside it as it was after the same engine time. At a pace slower than real
        time only the status moves: the run goes at full speed and `follow` plays it back."""
        chat = values[c.chat]
        paced = PACES[values[c.pace]] is not None
        last_text = last_figures = 0.0
        spec_shown = False  # the speculative run's last step has been drawn in full
        try:
            session = visitor_session(values[c.model])
            request = checked(session, chat.turns[-1].text if chat.turns else "", values)
            key = baseline_key(session.name, request.mode)
            for update in on_engine_thread(session.reply(chat, request)):
                now = time.monotonic()
                if not update.done and now - last_text < TEXT_INTERVAL_S:
                    continue
                last_text = now
                status = {c.status: status_html(update.status, "done" if update.done else "info")}
                trace, baselines = update.chat.trace, values[c.baselines]
                if update.done:  # the headline of the finished run; a target-only speed it measured is kept
                    status[c.headline] = render_headline(trace, baselines.get(key), update.chat.comparison)
                    status[c.baselines] = record_baseline(baselines, key, trace, update.chat.comparison)
                if paced and not update.done:
                    yield {c.status: status_html(update.status + " · the step-by-step replay follows")}
                elif paced:  # the replay draws it all; keep what it will play
                    yield {c.chat: update.chat, **status, c.comparison: comparison_html(session, update.chat),
                           c.race: finished_race(update.chat)}
                elif update.baseline is not None and spec_shown:  # the baseline streams into the race
                    base = update.baseline_trace
                    t = base.stats.elapsed_s
                    steps = (step_at(trace, t), len(base.points))
                    yield {**status, c.race: render_race(METHOD_LABELS[trace.method], update.chat.turns[-1], trace,
                                                         update.baseline, base, t, steps, None)}
                else:
                    figures = update.done or update.baseline is not None or now - last_figures >= FIGURE_INTERVAL_S
                    out = {c.chat: update.chat, c.headline: render_headline(trace, baselines.get(key), update.chat.comparison),
                           **status, **run_view(session, update.chat, figures)}
                    if figures:
                        last_figures = now
                    spec_shown = update.baseline is not None
                    if update.done:
                        out[c.comparison] = comparison_html(session, update.chat)
                        out[c.race] = finished_race(update.chat)
                    yield out
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None

    def follow(chat, pace, model) -> Iterator[dict]:
        """After a generation at a pace slower than real time: its step-by-step replay."""
        if PACES[pace] is None:
            yield {c.status: gr.skip()}
            return
        yield from replay(chat, pace, model)

    def replay(chat, pace, model) -> Iterator[dict]:
        """The latest reply again, step by step from its trace at the pace (no engine): text, stats,
        charts and tree view of each step together."""
        if chat.trace is None or not chat.turns or chat.turns[-1].role != "assistant" \
                or chat.turns[-1].state == "streaming":
            gr.Warning(NOTHING_TO_REPLAY)
            return
        session, n = shown_session(model), len(chat.trace.points)
        frames = replay_frames(chat.trace, PACES[pace], TEXT_INTERVAL_S)
        last_figures = 0.0
        yield {**run_view(session, chat_at(chat, -1)), c.status: status_html(f"replay ({pace}): the prefill…")}
        for frame in play(frames):
            now = time.monotonic()
            figures = PACES[pace] is not None or frame is frames[-1] or now - last_figures >= FIGURE_INTERVAL_S
            last_figures = now if figures else last_figures
            yield {**run_view(session, chat_at(chat, frame.step), figures),
                   c.status: status_html(f"replay ({pace}): step {frame.step} of {n}")}
        yield {**run_view(session, chat), c.status: status_html(f"replayed {n} steps ({pace}).", "done")}

    def race(chat, pace) -> Iterator[dict]:
        """The speculative run and its target-only baseline side by side on one clock of engine time,
        from the two recorded traces (no engine)."""
        cmp = chat.comparison
        if cmp is None or cmp.baseline_trace is None:
            gr.Warning(RACE_NEEDS_COMPARISON)
            return
        spec, base = chat.trace, cmp.baseline_trace
        label = METHOD_LABELS[spec.method]
        frames = race_frames(spec, base, race_scale(PACES[pace], base), TEXT_INTERVAL_S)
        yield {c.race: render_race(label, chat.turns[-1], spec, cmp.baseline, base, 0.0, (-1, -1), None)}
        for frame in play(frames):
            yield {c.race: render_race(label, chat.turns[-1], spec, cmp.baseline, base, frame.t, frame.steps, cmp)}

    def stop(chat, model, status):
        """After the reply (or a replay) has ended: everything from the chat as it ended, so the stats,
        charts and tree view count the tokens the text shows."""
        running = bool(chat.turns) and (chat.turns[-1].role == "user" or chat.turns[-1].state == "streaming")
        chat.mark_stopped()
        engine_thread_idle()  # the step in flight lands (or, seeing the turn stopped, is dropped) before we draw
        session = shown_session(model)
        said = ("stopped" if running else "replay stopped: the whole reply is shown" if "replay (" in (status or "")
                else None)
        out = {c.chat: chat, c.conversation: conversation_html(session, chat),
               c.status: status_html(said, "done") if said else gr.skip()}
        if chat.trace is not None:
            out |= {**run_view(session, chat), c.race: finished_race(chat)}
        return out

    def clear(model):
        chat = ChatState()
        return {c.chat: chat, c.status: "", c.comparison: "", c.race: render_race_hint(),
                c.headline: render_headline(None), c.inspector: render_inspector(None, None, {}),
                **run_view(shown_session(model), chat)}

    def loaded(session: Session, message: str) -> dict:
        return {c.model: session.name, c.method: gr.update(choices=method_choices(session),
                                                           value=default_method(session)),
                c.notices: notices_html(session), c.status: status_html(message, "done"),
                c.stats: render_stats(panel_stats(session, None), DEFINITIONS)}

    def refused(message: str, model: str) -> dict:
        """The visitor keeps their models: the dropdown goes back to them, the status says why."""
        gr.Warning(message)
        return {c.preset: gr.update(value=model if model in PRESETS else None), c.status: status_html(message)}

    def choose_preset(name, model, progress=gr.Progress()):
        """This visitor's models become the preset's (loaded, or shared from the cache)."""
        preset = PRESETS.get(name)
        why = preset.unavailable(shown_session(model).device) if preset else "not a preset"
        if why:
            return refused(f"{name} is unavailable here: {why}.", model)
        try:
            models = cache.get(name, progress=lambda f, d: progress(f, desc=d))
        except Exception as e:  # a failed load leaves the visitor's models as they were
            return refused(f"Could not load {name}: {e}", model)
        return loaded(Session(models), f"Loaded {name}.")

    def load_custom(target, eagle, eagle3, model, progress=gr.Progress()):
        """Local mode: this visitor's models become the target and drafters named (kept in the cache)."""
        try:
            session = visitor_session(model)
            target = (target or "").strip() or session.target_spec
            drafters = {m: s.strip() for m, s in (("eagle", eagle or ""), ("eagle3", eagle3 or "")) if s.strip()}
            name = session.name if target == session.target_spec else Path(target).name or target
            session.switch(ModelChoice(name=name, target=target, drafters=drafters, fallback=False),
                           progress=lambda f, d: progress(f, desc=d))
        except Exception as e:
            raise gr.Error(f"Could not load: {e}", print_exception=False) from None
        cache.put(session.name, session.models)
        return loaded(session, f"Loaded {name}" + (f" with drafters {', '.join(drafters.values())}." if drafters
                                                   else "."))

    def k_changed(k):
        """The legend for k; a k typed out of range is refused in a sentence (the box then puts its
        value back in range). Reads the raw value: Gradio's own bounds check would log a traceback."""
        lo, hi = LIMITS["num_spec_tokens"]
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not lo <= k <= hi or k != int(k):
            message = f"k = {k} is not allowed: k is a whole number from {lo} to {hi}."
            gr.Warning(message)
            return {c.legend: gr.skip(), c.status: status_html(message)}
        return {c.legend: render_legend(int(k)), c.status: gr.skip()}

    def show_tree(chat, step, model):
        """The slider's step in the tree view and in the inspector."""
        session = shown_session(model)
        return {c.tree: tree_view(session, chat.trace, step), c.inspector: inspector_html(session, chat.trace, step)}

    def inspect(chat, model, evt: gr.EventData):
        """A token (or a step button) was clicked or tapped: its step in the inspector and, when the
        step drafted, in the tree view; step -1 closes the inspector."""
        step = evt._data.get("step") if isinstance(evt._data, dict) else None
        trace = chat.trace
        if not isinstance(step, int) or trace is None or not 0 <= step < len(trace.steps):
            return {c.inspector: render_inspector(None, None, {}), c.tree: gr.skip(), c.tree_step: gr.skip()}
        session = shown_session(model)
        drafted = trace.steps[step].tree is not None
        return {c.inspector: inspector_html(session, trace, step),
                c.tree: tree_view(session, trace, step) if drafted else gr.skip(),
                c.tree_step: tree_step_update(trace, step) if drafted else gr.skip()}

    def method_options(method):
        return gr.update(**compare_options(method))

    def k_released(evt: gr.EventData):
        """On leaving the number box, which sends the typed value, then clamps it to the slider's range."""
        return k_changed(evt._data)

    def shape_options(shape):
        return gr.Column(visible=shape == "tree")

    ui = dict(api_visibility="private")
    engine = dict(concurrency_id=ENGINE, **ui)
    # user() waits for the engine too, so a second Generate never edits a chat that is still streaming.
    # Neither half shows progress on its outputs: a refusal is the toast alone, since a status tracker
    # would leave a red "Error" badge over the conversation, the prompt box and the status after it fades.
    first = dict(fn=user, inputs={c.prompt, c.chat, c.model, *c.settings},
                 outputs=[c.chat, c.conversation, c.prompt, c.comparison, c.race, c.status, c.inspector],
                 show_progress="hidden", **engine)
    view = [c.conversation, c.stats, *c.plots, c.tree, c.tree_step]
    then = dict(fn=zerogpu.on_gpu(bot), inputs={c.chat, c.model, c.pace, c.baselines, *c.settings},
                outputs=[c.chat, c.status, c.comparison, c.race, c.headline, c.baselines, *view],
                show_progress="hidden", **engine)
    # replays and races read the recorded trace only: outside the engine's queue, several at once
    playback = dict(concurrency_id=PLAYBACK, concurrency_limit=PLAYBACK_CONCURRENCY, show_progress="hidden", **ui)
    after = dict(fn=follow, inputs=[c.chat, c.pace, c.model], outputs=[c.status, *view], **playback)
    replies = [c.generate.click(**first).success(**then), c.prompt.submit(**first).success(**then)]
    runs = [*replies, *(reply.success(**after) for reply in replies),
            c.replay.click(replay, inputs=[c.chat, c.pace, c.model], outputs=[c.status, *view], **playback),
            c.race_button.click(race, inputs=[c.chat, c.pace], outputs=[c.race], **playback)]
    # Stop and Clear cancel the running reply (or replay, or race) at once, then update the view from
    # the engine's queue, that is once the reply has ended, so no late step of it can overwrite what they show.
    stopped = c.stop.click(None, cancels=runs, **ui).then(stop, inputs=[c.chat, c.model, c.status],
                                                          outputs=[c.chat, c.status, c.race, *view], **engine)
    cleared = c.clear.click(None, cancels=runs, **ui).then(
        clear, inputs=[c.model],
        outputs=[c.chat, c.status, c.comparison, c.race, c.headline, c.inspector, *view], **engine)
    c.settings_button.click(None, js=TOGGLE_SETTINGS_JS, **ui)
    loads = [c.model, c.method, c.notices, c.status, c.stats]
    c.preset.input(choose_preset, inputs=[c.preset, c.model], outputs=[c.preset, *loads], **engine)
    if c.load is not None:  # local mode only: public mode registers no event that names a path or a hub id
        c.load.click(load_custom, inputs=[c.target_spec, c.eagle_spec, c.eagle3_spec, c.model], outputs=loads,
                     **engine)
    c.num_spec_tokens.change(k_changed, inputs=[c.num_spec_tokens], outputs=[c.legend, c.status], queue=False,
                             preprocess=False, **ui)
    c.num_spec_tokens.release(k_released, outputs=[c.legend, c.status], queue=False, **ui)
    c.method.change(method_options, inputs=[c.method], outputs=[c.compare], queue=False, **ui)
    c.draft_shape.change(shape_options, inputs=[c.draft_shape], outputs=[c.tree_options], queue=False, **ui)
    # the tree of another step: reads the chat's trace, never the engine (so it answers while streaming)
    c.tree_step.input(show_tree, inputs=[c.chat, c.tree_step, c.model], outputs=[c.tree, c.inspector],
                      trigger_mode="always_last", show_progress="hidden", **ui)
    # a clicked or tapped token's step (assets/inspect.js sends it); like the slider, reads the trace only
    c.inspector.click(inspect, inputs=[c.chat, c.model], outputs=[c.inspector, c.tree, c.tree_step],
                      trigger_mode="always_last", show_progress="hidden", **ui)
    # rejected drafts are always in the page's HTML; the toggle shows or hides them in the browser
    c.show_rejected.change(None, inputs=[c.show_rejected], js="(show) => { document.body.classList.toggle("
                           "'sl-hide-rejected', !show); return []; }", **ui)
    register_trace_download(c.trace_download, c.chat, c.model, [*replies, stopped], cleared, cache)
    register_bench_listeners(c.bench, c.model, cache, hosting)


def register_api(cache: ModelCache, hosting: Hosting) -> None:
    """The programmatic endpoint /generate (a contract: keep these names), on the app's default models."""

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
        session = cache.session(cache.default_name)
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


def build_demo(session: Session, hosting: Hosting = Hosting(), cache: ModelCache | None = None,
               defaults: AppSettings = AppSettings()) -> gr.Blocks:
    """The app on `session`'s models (the default every visitor starts with); other presets load
    into `cache` (by default one made for `session`) when a visitor chooses them. `defaults`: what the
    page offers first (demo/service/settings.py, from SPECLENS_* variables)."""
    cache = cache or ModelCache.for_session(session)
    # Gradio's copies of the files it serves (traces, CSVs) are deleted once as old as ours (demo/service/downloads.py)
    with gr.Blocks(title="SpecLens: watch speculative decoding", fill_width=True,
                   delete_cache=(downloads.KEEP_S, downloads.KEEP_S)) as demo:
        controls = build_layout(session, hosting, defaults)
        register_listeners(controls, cache, hosting)
        register_api(cache, hosting)
        demo.load(None, js=CLOSE_SETTINGS_ON_PHONES_JS, api_visibility="private")
    return demo
