"""End to end in a real browser: headless Debian chromium driven by Selenium, against `python app.py`
(the embedded default model) started in a subprocess on a free port.

Needs the system packages `chromium` and `chromium-driver` (CI installs them; tests cannot download
browsers here). Leaves a screenshot in artifacts/browser_e2e.png.

    python -m tests.browser.test_browser docs/screenshot.png   # a finished EAGLE-3 tree generation, for the README
"""

import time
from pathlib import Path

import pytest

from tests.browser.driver import *  # noqa: F401,F403  (helpers shared with the other browser tests)


def test_generate_highlights_tokens_draws_charts_and_stop_ends_it(app_url, driver):
    from selenium.webdriver.common.keys import Keys

    driver.get(app_url)
    prompt = "Hi <b>there</b> {{name}}! Write a long story about a robot who learns to paint."
    budget = usable(driver, "#sl-max-new input[type=number]")
    budget.clear()
    budget.send_keys(str(MAX_NEW_TOKENS), Keys.TAB)  # long enough that Stop lands mid-reply on a fast machine
    usable(driver, "#sl-shape")
    click(driver, next(e for e in css(driver, "#sl-shape label") if e.text == "tree"))  # its settings: the device's tree
    usable(driver, "#sl-tree-topk input[type=number]")
    type_and_generate(driver, prompt)

    # the user's markup shows as text, nothing of it runs or renders
    user = wait_for(lambda: css(driver, "#sl-conversation .sl-user-text"), 60, "the user's turn")[0]
    assert user.text == prompt and not css(driver, "#sl-conversation .sl-user-text b")

    # tokens stream in, each with its provenance on hover
    tokens = wait_for(lambda: len(css(driver, "#sl-conversation .sl-assistant .sl-tok")) >= 6 and
                      css(driver, "#sl-conversation .sl-assistant .sl-tok"), 180, "streamed tokens")
    assert tokens[0].get_attribute("title").startswith("step 0 · target's own token")
    if bundled_drafters_exist():  # a trained drafter gets drafts accepted: coloured by depth
        wait_for(lambda: css(driver, "#sl-conversation .sl-draft"), 120, "accepted (highlighted) draft tokens")

    # the live charts render bars while it generates (each in its tab)
    show_tab(driver, "time")
    wait_for(lambda: css(driver, "#sl-plot-latency .js-plotly-plot g.trace.bars path"), 60, "the latency chart's bars")
    show_tab(driver, "acceptance")
    wait_for(lambda: css(driver, "#sl-plot-acceptance_length .js-plotly-plot g.trace.bars path"), 30, "the bars")
    assert "mean acceptance length" in css(driver, "#sl-stats")[0].text

    # the tree view draws the latest step's tree as it streams (a tree was chosen: a CPU's default is a chain)
    show_tab(driver, "tree")
    assert "tree: depth" in css(driver, "#sl-conversation .sl-assistant .sl-role")[0].text
    wait_for(lambda: tree_step(driver) >= 2, 60, "the tree of step 2 or later")
    assert len(css(driver, "#sl-plot-tree .js-plotly-plot g.trace.scatter path.point")) >= 3  # root and drafts

    # Stop ends the generation: the reply stops growing and says so
    click(driver, "#sl-stop")
    wait_for(lambda: "stopped" in css(driver, "#sl-status")[0].text, 30, "the stopped status")
    time.sleep(2.0)  # a step already running may still land
    count = len(css(driver, "#sl-conversation .sl-assistant .sl-tok"))
    time.sleep(4.0)
    assert len(css(driver, "#sl-conversation .sl-assistant .sl-tok")) == count
    assert count < MAX_NEW_TOKENS + 1  # it did not run to max new tokens
    assert "(stopped)" in css(driver, "#sl-conversation")[0].text

    # the step slider shows an earlier step's tree
    css(driver, "#sl-tree-step input[type=range]")[0].send_keys(Keys.HOME)
    wait_for(lambda: tree_step(driver) == 1, 30, "the tree of step 1")
    assert css(driver, "#sl-tree-step input[type=number]")[0].get_attribute("value") == "1"
    driver.save_screenshot(str(ARTIFACTS / "browser_e2e.png"))

    click(driver, "#sl-clear")  # Clear empties the conversation and the panels
    wait_for(lambda: not css(driver, "#sl-conversation .sl-turn"), 30, "an empty conversation")
    assert "No generation yet" in css(driver, "#sl-stats")[0].text


def test_bad_input_and_a_bad_drafter_path_get_visible_messages(app_url, driver):
    driver.get(app_url)
    wait_for(lambda: css(driver, "#sl-prompt textarea"), 60, "the prompt box")
    if not _has_cuda():  # the CUDA-graph choice is shown disabled, with the reason
        assert "CUDA graphs need a CUDA GPU" in css(driver, "#sl-mode")[0].text
        assert all(not e.is_enabled() for e in css(driver, "#sl-mode input"))
    click(driver, "#sl-generate")  # empty prompt
    wait_for(lambda: "The prompt is empty" in driver.page_source, 30, "the empty-prompt message")
    assert not css(driver, "#sl-conversation .sl-turn")  # nothing was sent

    # a tree's settings show while the shape is a tree, and hide for a chain
    click(driver, next(e for e in css(driver, "#sl-shape label") if e.text == "tree"))
    wait_for(lambda: displayed(driver, "#sl-tree-topk"), 30, "the tree settings")
    click(driver, next(e for e in css(driver, "#sl-shape label") if e.text == "chain"))
    wait_for(lambda: not displayed(driver, "#sl-tree-topk"), 30,
             "the tree settings to hide")

    click(driver, "#sl-custom button")  # open "Your own models"
    box = wait_for(lambda: [e for e in css(driver, "#sl-eagle-spec textarea, #sl-eagle-spec input") if e.is_displayed()],
                   30, "the EAGLE drafter field")[0]
    box.send_keys("/nonexistent/eagle-drafter")
    click(driver, "#sl-load")
    wait_for(lambda: "Could not load" in driver.page_source, 60, "the load error")
    assert "EAGLE" in css(driver, "#sl-method")[0].text  # the loaded drafters are still offered


def test_prompt_hint_says_what_enter_and_shift_enter_do(app_url, driver):
    from selenium.webdriver.common.keys import Keys

    driver.get(app_url)
    box = usable(driver, "#sl-prompt textarea")
    hint = box.get_attribute("placeholder")
    box.send_keys("first line", Keys.ENTER, "second line")  # Enter: a new line, nothing sent
    time.sleep(1.0)
    assert box.get_attribute("value") == "first line\nsecond line" and not css(driver, "#sl-conversation .sl-turn")
    assert "Enter starts a new line" in hint and "Shift+Enter for a new line" not in hint
    box.send_keys(Keys.SHIFT, Keys.ENTER)  # Shift+Enter: sends, as the hint says
    wait_for(lambda: css(driver, "#sl-conversation .sl-user-text"), 60, "the turn Shift+Enter sent")
    assert "Shift+Enter" in hint
    click(driver, "#sl-stop")


def test_compare_is_off_for_target_only(app_url, driver):
    driver.get(app_url)
    box = wait_for(lambda: css(driver, "#sl-compare input"), 60, "the compare checkbox")[0]
    assert box.is_enabled()
    usable(driver, "#sl-method label")
    click(driver, next(e for e in css(driver, "#sl-method label") if e.text.lower().startswith("target only")))
    wait_for(lambda: not css(driver, "#sl-compare input")[0].is_enabled(), 30, "the compare checkbox to turn off")
    assert "not for target only" in css(driver, "#sl-compare")[0].text


def test_k_typed_out_of_range_is_refused_with_a_sentence(app_url, driver):
    from selenium.webdriver.common.keys import Keys

    driver.get(app_url)
    k = usable(driver, "#sl-k input[type=number]")
    k.send_keys(Keys.CONTROL, "a")
    k.send_keys("15", Keys.TAB)
    wait_for(lambda: "k = 15 is out of range" in css(driver, "#sl-status")[0].text, 30, "the refusal of k = 15")
    assert "allowed 1 to 10" in css(driver, "#sl-status")[0].text
    log = (ARTIFACTS / "browser_app.log").read_text()
    assert "Traceback" not in log and "greater than maximum" not in log


ERROR_BADGE_HOSTS = ("#sl-conversation", "#sl-prompt", "#sl-status", "#sl-comparison", "#sl-stats", "#sl-legend")


def error_badges(driver) -> list[str]:
    """The hosts showing a status tracker's red "Error" badge (it stays after the toast fades)."""
    return [host for host in ERROR_BADGE_HOSTS
            if any(e.is_displayed() and e.text.strip() == "Error" for e in css(driver, f"{host} .error"))]


def test_an_input_error_shows_as_a_toast_only_with_no_badges_over_the_page(app_url, driver):
    driver.get(app_url)
    click(driver, "#sl-generate")  # empty prompt
    wait_for(lambda: any("The prompt is empty" in e.text for e in css(driver, ".toast-body")), 30, "the toast")
    time.sleep(1.0)
    assert error_badges(driver) == []
    box = usable(driver, "#sl-prompt textarea")  # what the visitor types next shows and is sent
    box.send_keys("hello")
    assert box.is_displayed() and box.get_attribute("value") == "hello"


LONG_PROMPT = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(110))  # ~1,300 tokens


@pytest.mark.parametrize("size", [(1500, 1900), (412, 915)], ids=["desktop", "phone"])
def test_long_text_scrolls_inside_the_conversation_box(app_url, driver, size):
    driver.set_window_size(*size)
    driver.get(app_url)
    set_setting(driver, "#sl-max-new input[type=number]", 1)  # on a phone the settings start closed
    box = usable(driver, "#sl-prompt textarea")
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));",
                          box, LONG_PROMPT)
    driver.execute_script("arguments[0].click();", usable(driver, "#sl-generate"))
    wait_for(lambda: css(driver, "#sl-conversation .sl-user-text"), 60, "the long turn")
    time.sleep(1.0)
    chat = css(driver, "#sl-conversation")[0]
    box = rect(driver, chat)
    for above in ("#sl-prompt", "#sl-generate", "#sl-status"):
        assert rect(driver, css(driver, above)[0])["bottom"] <= box["top"] + 1, f"the conversation covers {above}"
    for below in ("#sl-inspector", "#sl-stats"):
        assert box["bottom"] <= rect(driver, css(driver, below)[0])["top"] + 1, f"the conversation spills over {below}"
    assert driver.execute_script("return arguments[0].scrollHeight > arguments[0].clientHeight + 10 && "
                                 "['auto', 'scroll'].includes(getComputedStyle(arguments[0]).overflowY);", chat)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def take_readme_screenshot(out: Path) -> None:
    """A finished EAGLE-3 generation with the default draft tree (and the target-only comparison):
    highlighting, the tree view and charts."""
    with app_in_browser() as (d, url):
        d.set_window_size(1600, 1200)
        d.get(url)
        click(d, wait_for(lambda: css(d, "#sl-compare input"), 60, "the settings")[0])
        click(d, next(e for e in css(d, "#sl-shape label") if e.text == "tree"))  # the device's tree
        type_and_generate(d, "Write a short story about a cat who finds a hat.")  # a long answer: more to highlight
        wait_for(lambda: "sl-status-done" in css(d, "#sl-status")[0].get_attribute("innerHTML"), 600, "the end")
        time.sleep(2.0)
        d.execute_script("window.scrollTo(0, 0);")  # the title, the text and the tabs
        d.save_screenshot(str(out))


if __name__ == "__main__":
    take_readme_screenshot(screenshot_path("docs/screenshot.png"))
