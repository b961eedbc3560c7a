"""The page's components, as one dataclass the features' listeners read and write, and the request
its settings describe."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from demo.config import TreeShape
from demo.service.request import Request


@dataclass
class Controls:
    """The components the listeners read and write."""

    chat: gr.State
    model: gr.State  # the name of the visitor's models (a preset's): a ModelCache key
    conversation: gr.HTML
    stream: gr.HTML  # hidden: a streamed step's new tokens, which assets/stream.js appends to the conversation
    legend: gr.HTML
    prompt: gr.Textbox
    generate: gr.Button
    stop: gr.Button
    clear: gr.Button
    status: gr.HTML
    comparison: gr.HTML
    guide: gr.HTML  # the reply's first steps told, or the step the step buttons show (demo/ui/html/guide.py)
    settings_button: gr.Button
    pace: gr.Radio
    replay: gr.Button
    step_back: gr.Button
    step_next: gr.Button
    shown_step: gr.State  # the step the step buttons show (None: the whole reply)
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
    lookup: gr.Slider  # a tree's prompt-lookup branch (TreeShape.lookup)
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
    trace_download: gr.DownloadButton  # the latest run's trace (demo/ui/trace_download.py)
    # "Your own models": local mode only (public mode neither builds them nor registers their events)
    target_spec: gr.Textbox | None = None
    eagle_spec: gr.Textbox | None = None
    eagle3_spec: gr.Textbox | None = None
    load: gr.Button | None = None
    bench: object = None  # the Benchmark tab's BenchControls (demo/ui/bench_tab.py)

    @property
    def settings(self) -> set:
        """The components a request is read from (handlers get their values by component)."""
        return {self.method, self.mode, self.compare, self.draft_shape, self.tree_topk, self.num_draft_tokens,
                self.lookup, *self.generation.values()}

    @property
    def generation(self) -> dict:
        """GenerationConfig field -> the component that sets it."""
        return {"num_spec_tokens": self.num_spec_tokens, "draft_sampling": self.draft_sampling,
                "temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens,
                "seed": self.seed}

    @property
    def plots(self) -> list:
        return [self.acceptance, self.acceptance_length, self.latency, self.throughput]

    @property
    def view(self) -> list:
        """What a chat state draws: the text, the headline, the stats, the charts and the tree view
        (demo/ui/update.py)."""
        return [self.conversation, self.headline, self.guide, self.stats, *self.plots, self.tree, self.tree_step]

    def request(self, prompt: str, values: dict) -> Request:
        """The request the settings' current values describe (values: component -> value)."""
        as_int = lambda v: int(v) if isinstance(v, float) and v.is_integer() else v  # noqa: E731 (sliders send floats)
        tree = (TreeShape(as_int(values[self.tree_topk]), as_int(values[self.num_draft_tokens]),
                          as_int(values[self.lookup])) if values[self.draft_shape] == "tree" else None)
        return Request.of(prompt or "", method=values[self.method], mode=values[self.mode],
                          compare=bool(values[self.compare]), tree=tree,
                          **{name: as_int(values[comp]) for name, comp in self.generation.items()})
