"""A page a learner can watch and trust, in a real browser (the shared app of conftest.py), at a
desktop's 1440 x 900 and a phone's 412 x 915: the prompt on the first screen, a reply box that
follows the stream, one accounting and a measured speedup only, one playback at a time, a step at a
time, readable teaching text, and settings refused in a sentence rather than clamped in silence."""

from __future__ import annotations

import re
import time

import pytest

from tests.browser.driver import *  # noqa: F401,F403  (helpers shared with the other browser tests)

SIZES = {"desktop": (1440, 900), "phone": (412, 915)}
LONG = "Write a long story about a dragon who learns to bake bread, with many details."


def open_page(driver, url: str, size: str = "desktop") -> None:
    driver.set_window_size(*SIZES[size])
    driver.get(url)
    usable(driver, "#sl-prompt textarea")


def status(driver) -> str:
    return css(driver, "#sl-status")[0].text


def finished(driver) -> bool:
    return "sl-status-done" in css(driver, "#sl-status")[0].get_attribute("innerHTML")


def generate(driver, prompt: str, max_new_tokens: int, compare: bool = False) -> None:
    set_setting(driver, "#sl-max-new input[type=number]", max_new_tokens)
    box = wait_for(lambda: css(driver, "#sl-compare input"), 60, "the compare checkbox")[0]
    if box.is_selected() != compare:
        driver.execute_script("arguments[0].click();", box)
    usable(driver, "#sl-prompt textarea").send_keys(prompt)
    driver.execute_script("arguments[0].click();", usable(driver, "#sl-generate"))


def within_first_screen(driver, selector: str) -> bool:
    box = rect(driver, css(driver, selector)[0])
    return 0 <= box["top"] < box["bottom"] <= driver.execute_script("return window.innerHeight;") + 1


@pytest.mark.parametrize("size", SIZES)
def test_the_prompt_and_generate_are_on_the_first_screen(app_url, driver, size):
    open_page(driver, app_url, size)
    time.sleep(1.0)  # a phone's settings slide away
    driver.execute_script("window.scrollTo(0, 0);")
    assert within_first_screen(driver, "#sl-prompt textarea") and within_first_screen(driver, "#sl-generate")


@pytest.mark.parametrize("size", SIZES)
def test_the_reply_box_follows_the_stream_and_shows_several_lines(app_url, driver, size):
    open_page(driver, app_url, size)
    generate(driver, LONG, 400)
    box = css(driver, "#sl-conversation")[0]
    assert driver.execute_script("return arguments[0].clientHeight;", box) >= 250  # not two lines on a phone
    at_end = []

    def grown_and_followed():  # scrollHeight - scrollTop - clientHeight: 0 at the end of the box
        grown, gap = driver.execute_script("const b = arguments[0]; return [b.scrollHeight > b.clientHeight + 60, "
                                           "b.scrollHeight - b.scrollTop - b.clientHeight];", box)
        if grown:
            at_end.append(gap < 30)
        return len(at_end) >= 6
    wait_for(grown_and_followed, 240, "the reply to outgrow its box a while", poll=0.5)
    click(driver, "#sl-stop")
    assert all(at_end), at_end  # every look while it grew found its newest tokens in view


def page(driver) -> dict:
    """The status, the conversation and the headline read at one instant (one script), so a check of
    one reply never pairs the last reply's status with the next one's text."""
    return driver.execute_script(
        "const q = s => document.querySelector(s); return {status: q('#sl-status').innerHTML, "
        "conversation: q('#sl-conversation').innerText, headline: q('#sl-headline').innerText};")


def test_a_speedup_shown_is_the_comparisons_own_and_the_next_prompt_reuses_none(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Name three colours.", 24, compare=True)
    wait_for(lambda: finished(driver), 300, "the compared reply")
    headline = css(driver, "#sl-headline")[0].text
    assert "speedup, measured" in headline and "nothing drawn" in headline
    generate(driver, "Name three animals.", 24, compare=False)
    shown = wait_for(lambda: (lambda p: p if "sl-status-done" in p["status"] and "animals" in p["conversation"]
                              else None)(page(driver)), 300, "the next reply")
    assert "×" not in shown["headline"].split("Why")[0] and "Compare with target-only" in shown["headline"]


def test_the_last_speedup_never_stands_beside_a_new_prompt_while_it_runs(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Name three colours.", 24, compare=True)
    wait_for(lambda: finished(driver), 300, "the compared reply")
    # at a slow pace the headline moves only at the run's end: the window a stale speedup could fill
    click(driver, next(e for e in css(driver, "#sl-pace label") if e.text == "1 step / s"))
    generate(driver, LONG, 160, compare=False)
    running = wait_for(lambda: (lambda p: p if "generating" in p["status"] and "dragon" in p["conversation"]
                                else None)(page(driver)), 300, "the next reply, running")
    assert "×" not in running["headline"], running["headline"]
    click(driver, "#sl-stop")


def test_the_headline_status_and_race_give_one_tokens_per_target_call(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Name three colours.", 24, compare=True)
    wait_for(lambda: finished(driver), 300, "the compared reply")
    headline = float(re.search(r"([\d.]+)\s*tokens per target call", css(driver, "#sl-headline")[0].text).group(1))
    said = float(re.search(r"([\d.]+) tokens per target call", status(driver)).group(1))
    accounting = re.search(r"(\d+) accepted drafts \+ (\d+) target tokens \+ 1 from the prefill = (\d+) tokens in "
                           r"(\d+) target calls", status(driver))
    accepted, own, total, calls = map(int, accounting.groups())
    assert accepted + own + 1 == total and headline == said == round((accepted + own) / calls, 2)
    show_tab(driver, "race")
    race = wait_for(lambda: css(driver, "#sl-race .sl-race-calls"), 30, "the race's summary")[0].text
    assert race.startswith(f"{headline:.2f} vs 1.00 tokens per target call")


def test_one_playback_at_a_time_a_new_one_stops_the_old(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Count from one to twenty.", 40)
    wait_for(lambda: finished(driver), 300, "the reply")
    click(driver, next(e for e in css(driver, "#sl-pace label") if e.text == "1 step / s"))
    click(driver, "#sl-replay")
    wait_for(lambda: "step 2 of" in status(driver), 60, "the replay's second step")
    click(driver, "#sl-replay")  # again: the first replay stops, the second starts at the prefill
    wait_for(lambda: "step 1 of" in status(driver), 30, "the second replay's first step")
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        match = re.search(r"step (\d+) of", status(driver))
        if match and (not seen or seen[-1] != int(match.group(1))):
            seen.append(int(match.group(1)))
        time.sleep(0.1)
    assert seen == sorted(seen) and len(seen) >= 2, seen  # one replay writing, step after step


def test_the_step_buttons_move_the_text_the_guide_and_the_inspector_together(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Count from one to ten.", 30)
    wait_for(lambda: finished(driver), 300, "the reply")
    guide = css(driver, "#sl-guide")[0].text
    assert guide.startswith("The prefill: the target wrote its first token") and "Step 1:" in guide
    click(driver, "#sl-step-next")
    wait_for(lambda: "step 0 of" in status(driver), 30, "the prefill, shown")
    click(driver, "#sl-step-next")
    wait_for(lambda: "step 1 of" in status(driver), 30, "step 1, shown")
    tokens = len(css(driver, "#sl-conversation .sl-reply .sl-tok"))
    wait_for(lambda: css(driver, "#sl-inspector [data-inspected='1']"), 30, "the inspector on step 1")
    assert css(driver, "#sl-guide")[0].text.startswith("Step 1:")
    accounting = re.search(r"= (\d+) tokens in 1 target calls", css(driver, "#sl-headline")[0].text)
    assert accounting and int(accounting.group(1)) == tokens  # the headline counts the tokens the text shows


def test_stop_during_the_comparison_says_what_it_stopped(app_url, driver):
    open_page(driver, app_url)
    generate(driver, LONG, 160, compare=True)
    wait_for(lambda: status(driver).startswith("comparing"), 300, "the comparison to start")
    click(driver, "#sl-stop")
    wait_for(lambda: "stopped during the comparison" in status(driver), 60, "the stop to be said")


def contrast(driver, element) -> float:
    """The WCAG contrast ratio of an element's text colour against the first opaque background under it."""
    return driver.execute_script("""
        const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => {
            v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
        let el = arguments[0], bg = 'rgb(255, 255, 255)';
        for (let e = el; e; e = e.parentElement) {
            const c = getComputedStyle(e).backgroundColor;
            if (c && c !== 'transparent' && !/rgba\\(.*, 0\\)$/.test(c)) { bg = c; break; } }
        const a = lum(getComputedStyle(el).color), b = lum(bg);
        return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);""", element)


def test_the_teaching_text_reads_at_4_5_to_1_or_more(app_url, driver):
    open_page(driver, app_url)
    generate(driver, "Say hi.", 8)
    wait_for(lambda: finished(driver), 300, "the reply")
    click(driver, css(driver, "#sl-conversation .sl-reply [data-step]")[-1])  # the inspector's rules and reasons
    wait_for(lambda: css(driver, "#sl-inspector .sl-insp-rule"), 30, "the inspector")
    selectors = [".sl-caption", ".sl-def", ".sl-legend-hint", "#sl-headline small", ".sl-insp-rule", ".sl-why",
                 "#sl-sidebar [data-testid='block-info']", ".sl-insp-foot"]
    weak = [(s, round(contrast(driver, e), 2)) for s in selectors for e in css(driver, s)[:3]
            if e.is_displayed() and e.text.strip() and contrast(driver, e) < 4.5]
    assert not weak, weak


def test_a_setting_typed_out_of_range_is_refused_in_a_sentence(app_url, driver):
    open_page(driver, app_url)
    set_setting(driver, "#sl-max-new input[type=number]", 5000)
    # the page offers what the model's context holds beside a prompt, and says what it set the box to
    wait_for(lambda: re.search(r"max new tokens = 5000 is out of range: allowed 1 to \d+; set to \d+\.", status(driver)),
             30, "the refusal")
    set_setting(driver, "#sl-temperature input[type=number]", 3)
    wait_for(lambda: "temperature = 3 is out of range" in status(driver), 30, "the refusal")


def test_a_chain_drawn_from_q_is_labelled_a_chain_above_its_reply(app_url, driver):
    # at T > 0 a chain's drafts are drawn from q on the tree machinery (a tree of top-1): the reply's
    # label still names the chain the visitor picked
    open_page(driver, app_url)
    set_setting(driver, "#sl-temperature input[type=number]", 1)
    choose_shape(driver, "chain")
    set_setting(driver, "#sl-k input[type=number]", 3)
    generate(driver, "Name three rivers.", 8)
    wait_for(lambda: finished(driver), 120, "the reply")
    label = css(driver, "#sl-conversation .sl-assistant .sl-role")[0].text
    assert "(k = 3)" in label and "tree" not in label, label


def test_the_verified_tokens_slider_spans_what_the_trees_shape_allows(app_url, driver):
    open_page(driver, app_url)
    click(driver, next(e for e in css(driver, "#sl-shape label") if e.text == "tree"))
    set_setting(driver, "#sl-k input[type=number]", 3)
    set_setting(driver, "#sl-tree-topk input[type=number]", 2)

    def span():
        box = css(driver, "#sl-draft-tokens input[type=number]")[0]
        return box.get_attribute("min"), box.get_attribute("max")
    wait_for(lambda: span() == ("4", "11"), 30, "depth 3, top-2: 4 to 11 tokens verified")


def test_a_lookup_branch_set_on_the_page_reaches_the_request_named_above_the_reply(app_url, driver):
    open_page(driver, app_url)
    choose_shape(driver, "tree")
    set_setting(driver, "#sl-lookup input[type=number]", 8)
    generate(driver, "Count from 1 to 30, separated by commas.", 24)
    wait_for(lambda: finished(driver), 120, "the reply")
    label = css(driver, "#sl-conversation .sl-assistant .sl-role")[0].text
    assert "with a lookup branch of 8" in label, label


def test_the_race_without_a_comparison_keeps_its_panel(app_url, driver):
    open_page(driver, app_url)
    show_tab(driver, "race")
    hint = css(driver, "#sl-race")[0].text
    click(driver, "#sl-race-button")
    time.sleep(2.0)
    assert css(driver, "#sl-race")[0].text == hint and "Compare with target-only" in hint


def test_a_tree_step_typed_past_the_run_is_refused_and_put_back(app_url, driver):
    from selenium.webdriver.common.keys import Keys

    open_page(driver, app_url)
    click(driver, next(e for e in css(driver, "#sl-shape label") if e.text == "tree"))
    generate(driver, "Say hi.", 12)
    wait_for(lambda: finished(driver) and tree_step(driver) > 0, 300, "the reply and its trees")
    last = tree_step(driver)
    box = usable(driver, "#sl-tree-step input[type=number]")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("999", Keys.TAB)  # as a visitor types it
    wait_for(lambda: "999 is not a step of this run" in driver.page_source, 30, "the refusal")
    wait_for(lambda: box.get_attribute("value") == str(last), 30, "the box back on the run's last step")


def overlap(a: dict, b: dict) -> bool:
    return min(a["right"], b["right"]) > max(a["left"], b["left"]) and min(a["bottom"], b["bottom"]) > max(a["top"], b["top"])


def test_on_a_phone_the_settings_toggle_covers_no_content_and_the_tree_title_clears_its_toolbar(app_url, driver):
    open_page(driver, app_url, "phone")
    time.sleep(1.0)
    set_setting(driver, "#sl-max-new input[type=number]", 12)
    choose_shape(driver, "tree")
    usable(driver, "#sl-prompt textarea").send_keys("Say hi.")
    driver.execute_script("arguments[0].click();", usable(driver, "#sl-generate"))
    wait_for(lambda: finished(driver) and tree_step(driver) > 0, 300, "the reply and its trees")
    toggle = css(driver, "#sl-sidebar .toggle-button")[0]
    for selector in ("#sl-prompt textarea", "#sl-conversation", "#sl-headline", "#sl-plot-tree"):
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", css(driver, selector)[0])
        time.sleep(0.3)
        assert not overlap(rect(driver, toggle), rect(driver, css(driver, selector)[0])), selector
    title = css(driver, "#sl-plot-tree .gtitle")[0]
    bar = css(driver, "#sl-plot-tree .modebar")[0]
    assert not overlap(rect(driver, title), rect(driver, bar)), "the tree's title runs under its toolbar"
