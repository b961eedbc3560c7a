"""The visitor's models: the preset dropdown and, in local mode only, "Your own models" (a target
and drafters by path or hub id). Each visitor's choice lives in their own gr.State
(``Controls.model``) and picks the entry of the shared ModelCache their requests use; nothing a
visitor does changes another's models (a new drafter for the same target changes the shared models
in place: local mode is one trusted user).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from demo.methods import DRAFT_METHODS
from demo.metrics import DEFINITIONS
from demo.models.presets import PRESETS
from demo.service.model_cache import ModelCache, ModelChoice, preset_names
from demo.service.session import Session, panel_stats, shown_session, visitor_session
from demo.ui.controls import Controls
from demo.ui.events import ENGINE, PRIVATE
from demo.ui.html.render import notices_html, render_stats, status_html
from demo.ui.settings_panel import method_choices


def preset_options(device) -> list[tuple[str, str]]:
    """(label, name) of each preset; one that cannot run on `device` says why in its label."""
    return [(name + (f" (unavailable: {why})" if (why := PRESETS[name].unavailable(device)) else ""), name)
            for name in preset_names()]


def build_preset(session: Session) -> gr.Dropdown:
    return gr.Dropdown(preset_options(session.device), value=session.name if session.name in PRESETS else None,
                       label="Model preset", elem_id="sl-preset")


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


def register(c: Controls, cache: ModelCache) -> None:
    def loaded(session: Session, message: str) -> dict:
        return {c.model: session.name, c.method: gr.update(choices=method_choices(session),
                                                           value=session.default_method()),
                c.notices: notices_html(session.warnings), c.status: status_html(message, "done"),
                c.stats: render_stats(panel_stats(session, None), DEFINITIONS)}

    def refused(message: str, model: str) -> dict:
        """The visitor keeps their models: the dropdown goes back to them, the status says why."""
        gr.Warning(message)
        return {c.preset: gr.update(value=model if model in PRESETS else None), c.status: status_html(message)}

    def choose_preset(name, model, progress=gr.Progress()):
        """This visitor's models become the preset's (loaded, or shared from the cache)."""
        preset = PRESETS.get(name)
        why = preset.unavailable(shown_session(cache, model).device) if preset else "not a preset"
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
            session = visitor_session(cache, model)
            target = (target or "").strip() or session.target_spec
            drafters = {m: s.strip() for m, s in zip(DRAFT_METHODS, (eagle or "", eagle3 or "")) if s.strip()}
            name = session.name if target == session.target_spec else Path(target).name or target
            session.switch(ModelChoice(name=name, target=target, drafters=drafters, fallback=False),
                           progress=lambda f, d: progress(f, desc=d))
        except Exception as e:
            raise gr.Error(f"Could not load: {e}", print_exception=False) from None
        cache.put(session.name, session.models)
        return loaded(session, f"Loaded {name}" + (f" with drafters {', '.join(drafters.values())}." if drafters
                                                   else "."))

    engine = dict(concurrency_id=ENGINE, **PRIVATE)
    outputs = [c.model, c.method, c.notices, c.status, c.stats]
    c.preset.input(choose_preset, inputs=[c.preset, c.model], outputs=[c.preset, *outputs], **engine)
    if c.load is not None:  # local mode only: public mode registers no event that names a path or a hub id
        c.load.click(load_custom, inputs=[c.target_spec, c.eagle_spec, c.eagle3_spec, c.model], outputs=outputs,
                     **engine)
