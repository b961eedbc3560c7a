"""A Space's settings (demo/service/settings.py): SPECLENS_* variables read in one place, refused in one line
when wrong, and applied by app.py and the page (tiny models, no weights)."""

from __future__ import annotations

import pytest

from demo.service.hosting import QUEUE_MAX_SIZE
from demo.service.settings import AppSettings, SettingsError


def test_no_variables_keep_the_apps_own_defaults():
    assert AppSettings.from_env({}) == AppSettings(None, None, None, None, QUEUE_MAX_SIZE)
    assert AppSettings.from_env({"SPECLENS_K": " ", "SPECLENS_METHOD": ""}) == AppSettings()  # empty: unset


def test_every_variable_is_read_into_its_field():
    env = {"SPECLENS_PRESET": "Qwen3-8B", "SPECLENS_METHOD": "eagle", "SPECLENS_K": "5",
           "SPECLENS_MAX_NEW_TOKENS": "64", "SPECLENS_QUEUE_SIZE": "4"}
    assert AppSettings.from_env(env) == AppSettings(preset="Qwen3-8B", method="eagle", k=5, max_new_tokens=64,
                                                    queue_size=4)


@pytest.mark.parametrize("name, value, allowed", [
    ("SPECLENS_PRESET", "gpt-5", "one of 'SmolLM2-135M-Instruct (embedded)'"),
    ("SPECLENS_METHOD", "EAGLE-3", "one of none (target only), ngram (n-gram lookup), eagle (EAGLE), eagle3 (EAGLE-3)."),
    ("SPECLENS_K", "0", "a whole number from 1 to 10."),
    ("SPECLENS_K", "three", "a whole number from 1 to 10."),
    ("SPECLENS_MAX_NEW_TOKENS", "4096", "a whole number from 1 to 2048."),
    ("SPECLENS_QUEUE_SIZE", "-1", "a whole number from 1 to 1000."),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_variable_and_what_is_allowed(name, value, allowed):
    with pytest.raises(SettingsError) as refused:
        AppSettings.from_env({name: value})
    message = str(refused.value)
    assert message.startswith(f"{name}={value!r} is not allowed: ") and allowed in message and "\n" not in message


def test_a_method_the_models_lack_is_refused():
    AppSettings(method="eagle").check(["none", "eagle", "eagle3"], "tiny")
    with pytest.raises(SettingsError, match="SPECLENS_METHOD='eagle' is not allowed: one tiny has loaded: none, "
                                            "eagle3"):
        AppSettings(method="eagle").check(["none", "eagle3"], "tiny")


def test_max_new_tokens_past_what_the_models_context_leaves_a_reply_is_refused_naming_the_most():
    AppSettings(max_new_tokens=1920).check(["none"], "tiny", 2048)
    with pytest.raises(SettingsError, match=r"^SPECLENS_MAX_NEW_TOKENS='2000' is not allowed: at most 1920 on tiny, "
                                            r"whose 2048-token context also holds the prompt\.$"):
        AppSettings(max_new_tokens=2000).check(["none"], "tiny", 2048)


def test_the_app_stops_at_start_with_the_line_before_loading_anything(monkeypatch):
    import app

    monkeypatch.setenv("SPECLENS_K", "99")
    monkeypatch.setattr(app, "build_session", lambda args: pytest.fail("loaded models despite a bad setting"))
    with pytest.raises(SystemExit, match=r"^speclens: SPECLENS_K='99' is not allowed: a whole number from 1 to 10\.$"):
        app.main(["--no-warmup"])


def test_the_page_offers_the_settings_method_k_and_max_new_tokens_first():
    from demo.views import build_demo
    from tests.tiny_chat import tiny_session

    demo = build_demo(tiny_session(), defaults=AppSettings(method="eagle", k=5, max_new_tokens=33))
    values = {b.elem_id: getattr(b, "value", None) for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert (values["sl-method"], values["sl-k"], values["sl-max-new"]) == ("eagle", 5, 33)
    assert "at depth 5" in values["sl-legend"] and "at depth 6" not in values["sl-legend"]  # the legend for k = 5
    plain = {b.elem_id: getattr(b, "value", None) for b in build_demo(tiny_session()).blocks.values()
             if getattr(b, "elem_id", None)}
    assert (plain["sl-method"], plain["sl-max-new"]) == ("eagle3", 128)  # unset: the app's own defaults
