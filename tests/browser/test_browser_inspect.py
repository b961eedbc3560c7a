"""The teaching parts of the page in a real browser (tests/browser/driver.py; the app of conftest's `app_url`):
the headline, the rejected drafts and their toggle, and the step inspector opened by a tap.

Each test runs one short greedy generation of the embedded default; the inspector's tests draft a chain
(a chain's step shows the drafter's and the target's top 5 at each depth; a tree's, the siblings drafted).

    python -m tests.browser.test_browser_inspect docs/screenshot-inspector.png   # the README's inspector screenshot
"""

import time
from pathlib import Path

from tests.browser import driver as browser
from tests.browser.driver import (
    app_in_browser,
    bundled_drafters_exist,
    choose_shape,
    click,
    css,
    screenshot_path,
    tree_step,
    usable,
    wait_for,
)

pytestmark = browser.pytestmark  # skipped without chromium, as every browser test

PROMPT = "List five tips for learning a new language."  # the bundled drafter gets some drafts wrong here
BUDGET = 24  # tokens: a few steps, a few seconds on 2 cores


def set_number(driver, selector: str, value) -> None:
    box = usable(driver, f"{selector} input[type=number]")
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));"
                          "arguments[0].dispatchEvent(new Event('blur'));", box, str(value))


def generate(driver, prompt: str = PROMPT) -> None:
    """Send `prompt` (by script: on a phone the sidebar may cover the button) and wait for the end."""
    box = usable(driver, "#sl-prompt textarea")
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));",
                          box, prompt)
    driver.execute_script("arguments[0].click();", usable(driver, "#sl-generate"))
    wait_for(lambda: "sl-status-done" in css(driver, "#sl-status")[0].get_attribute("innerHTML"), 240,
             "the end of the generation")


SETTLED_POINT_JS = """
const [element, done] = arguments;
element.scrollIntoView({block: "center"});
// a token that wraps (" a": the space ends one line, the letter starts the next) has a box per
// line and its bounding box's middle lies between them: aim at its widest line box
const point = () => { const boxes = [...element.getClientRects()];
                      const r = boxes.length ? boxes.reduce((a, b) => (b.width > a.width ? b : a))
                                             : element.getBoundingClientRect();
                      return [r.left + Math.min(r.width / 2, 4), r.top + r.height / 2]; };
const before = point();
requestAnimationFrame(() => requestAnimationFrame(() => {
  const [x, y] = point();
  const hit = document.elementFromPoint(x, y);
  const still = x === before[0] && y === before[1];
  done(still && hit && (hit === element || element.contains(hit)) ? [x, y] : null);
}));
"""


def tap(driver, element, timeout: float = 30) -> None:
    """A finger's tap (touch events, then the click the browser makes of them): no hover, no mouse.
    It lands once the element stays put for two frames and is what the finger would touch: on a busy
    machine the inspector's smooth scroll into sight, or a redraw above the element, can move it
    between reading its place and tapping there (CI: the step before's button missed once)."""
    x, y = wait_for(lambda: driver.execute_async_script(SETTLED_POINT_JS, element), timeout,
                    f"a {element.tag_name} to settle under the finger")
    driver.execute_cdp_cmd("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": y}]})
    driver.execute_cdp_cmd("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def inspected(driver) -> int | None:
    """The step the inspector shows (None: its hint)."""
    step = driver.execute_script("const e = document.querySelector('#sl-inspector [data-inspected]');"
                                 "return e ? e.getAttribute('data-inspected') : null;")  # one read: it re-renders
    return int(step) if step is not None else None


def test_the_headline_and_rejected_drafts_show_and_the_toggle_hides_them(app_url, driver):
    driver.get(app_url)
    set_number(driver, "#sl-max-new", BUDGET)
    generate(driver)
    headline = css(driver, "#sl-headline")[0].text
    assert "tokens per target call" in headline and "accepted drafts +" in headline and "Why:" in headline
    assert "upper bound" in headline  # no comparison measured this run: the why says its t1 is an upper bound
    big = css(driver, "#sl-headline .sl-hl b")[0]
    assert float(big.text) >= 1.0 and float(big.value_of_css_property("font-size")[:-2]) >= 28  # large type

    if not bundled_drafters_exist():
        return
    rejected = wait_for(lambda: css(driver, "#sl-conversation .sl-rejected"), 10, "rejected drafts")
    assert rejected[0].is_displayed() and "line-through" in rejected[0].value_of_css_property("text-decoration")
    reply = lambda: css(driver, "#sl-conversation .sl-assistant .sl-reply")[0].text  # noqa: E731
    with_drafts = reply()
    toggle = usable(driver, "#sl-show-rejected input")
    click(driver, toggle)  # off: the struck drafts leave the text
    wait_for(lambda: not any(e.is_displayed() for e in css(driver, "#sl-conversation .sl-rejected")), 10,
             "the rejected drafts to hide")
    assert len(reply()) < len(with_drafts)
    click(driver, toggle)
    wait_for(lambda: css(driver, "#sl-conversation .sl-rejected")[0].is_displayed(), 10, "the rejected drafts back")
    assert "rejected draft" in css(driver, "#sl-legend")[0].text


def split_character_app():
    """(demo, url): the predictable tiny target (every token "a") with an EAGLE drafter that drafts the
    bytes of "é" over and over (tests/tiny.py's OracleDrafter, reading positions): a chain of 2 has
    every draft rejected, and every other step's draft is the character's two byte tokens."""
    from demo.service.hosting import Hosting
    from demo.service.model_cache import Models
    from demo.service.session import Session
    from demo.views import build_demo
    from tests.service.http_app import serve
    from tests.tiny import OracleDrafter
    from tests.tiny_chat import SHIFT, tiny_session

    tiny = tiny_session(predictable=True)
    hf, tok = tiny.models.target.hf, tiny.tokenizer
    e_acute = [(b - SHIFT) % 256 for b in "é".encode()]  # two byte tokens
    oracle = OracleDrafter(e_acute * 512, hf.config.vocab_size, hf.config.hidden_size)
    session = Session(Models(hf, tok, {"eagle": oracle}, name="tiny", target_spec="tiny", max_context=512))
    demo = build_demo(session, Hosting())
    return demo, serve(demo, Hosting())


def test_a_character_split_over_a_rejected_drafts_tokens_reads_whole(driver):
    demo, url = split_character_app()
    try:
        driver.get(url)
        click(driver, wait_for(lambda: [e for e in css(driver, "#sl-method label") if e.text == "EAGLE"], 60,
                               "the EAGLE choice")[0])
        choose_shape(driver, "chain")
        set_number(driver, "#sl-k", 2)
        set_number(driver, "#sl-max-new", 8)
        generate(driver, "hi")
        drafts = [e.text for e in css(driver, "#sl-conversation .sl-rejected")]
        assert "é" in drafts, drafts  # decoded token by token it read as two replacement characters
    finally:
        demo.close()


def test_a_tapped_token_opens_its_step_in_the_inspector_and_the_tree_view(app_url, driver):
    from selenium.webdriver.common.keys import Keys

    driver.set_window_size(412, 915)  # a phone: touch, no hover
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 1})
    driver.get(app_url)
    usable(driver, "#sl-prompt textarea")
    time.sleep(1.0)  # a phone's settings close once the page has loaded
    sidebar_open = lambda: "open" in css(driver, "#sl-sidebar")[0].get_attribute("class").split()  # noqa: E731
    wait_for(lambda: not sidebar_open(), 10, "a phone's settings to start closed")
    click(driver, "#sl-settings-button")
    set_number(driver, "#sl-max-new", BUDGET)
    choose_shape(driver, "chain")
    driver.execute_script("document.querySelector('#sl-sidebar .toggle-button').click();")  # it covers the page
    wait_for(lambda: not sidebar_open(), 10, "the settings to close")
    assert inspected(driver) is None and "tap a token" in css(driver, "#sl-inspector")[0].text
    generate(driver)

    steps = sorted({int(e.get_attribute("data-step")) for e in css(driver, "#sl-conversation .sl-tok[data-step]")})
    step = next((s for s in steps if s >= 2), steps[-1])
    tap(driver, css(driver, f'#sl-conversation .sl-tok[data-step="{step}"]')[-1])
    wait_for(lambda: inspected(driver) == step, 30, f"the inspector on step {step}")
    text = css(driver, "#sl-inspector")[0].text
    for words in (f"Step {step}", "drafter's top 5 (q)", "target's top 5 (p)", "emitted", "verify", "T = 0"):
        assert words in text, words
    assert "accepted" in text or "rejected" in text
    wait_for(lambda: tree_step(driver) == step, 30, f"the tree view on step {step}")
    assert css(driver, "#sl-tree-step input[type=number]")[0].get_attribute("value") == str(step)
    picked = {e.get_attribute("data-step") for e in css(driver, "#sl-conversation .sl-picked")}
    assert picked == {str(step)}  # the step's tokens are outlined in the text
    top = driver.execute_script("return arguments[0].getBoundingClientRect().top < window.innerHeight;",
                                css(driver, "#sl-inspector")[0])
    assert top  # in sight on the phone

    tap(driver, css(driver, "#sl-inspector .sl-step-link")[0])  # ◀ the step before
    wait_for(lambda: inspected(driver) == step - 1, 30, "the previous step")
    css(driver, "#sl-tree-step input[type=range]")[0].send_keys(Keys.HOME)  # the slider moves the inspector too
    wait_for(lambda: inspected(driver) == 1, 30, "the inspector on the slider's step 1")
    tap(driver, css(driver, "#sl-inspector .sl-close")[0])
    wait_for(lambda: inspected(driver) is None, 30, "the inspector to close")


def take_inspector_screenshot(out: Path) -> None:
    """A finished EAGLE-3 chain generation with one step open in the inspector: rejected drafts struck
    through in the text, the headline, the step's candidates and its tree."""
    with app_in_browser() as (d, url):
        d.set_window_size(1600, 1200)
        d.set_window_size(1600, 2400 - d.execute_script("return window.innerHeight;"))  # a 1600 x 1200 page
        d.get(url)
        set_number(d, "#sl-max-new", 40)
        choose_shape(d, "chain")
        click(d, "#sl-explainer button")  # fold the explainer: room for the inspector
        generate(d)
        step = int(d.execute_script(  # a step that accepted a draft, then rejected a long one
            "const r = Array.from(document.querySelectorAll('#sl-conversation .sl-rejected'))"
            ".filter(e => e.previousElementSibling && e.previousElementSibling.classList.contains('sl-draft'))"
            ".sort((a, b) => b.textContent.length - a.textContent.length);"
            "return (r[0] || document.querySelector('#sl-conversation .sl-rejected')).getAttribute('data-step');"))
        d.execute_script("arguments[0].click();", css(d, f'#sl-conversation .sl-tok[data-step="{step}"]')[-1])
        wait_for(lambda: inspected(d) == step and tree_step(d) == step, 60, "the inspector and the tree")
        d.execute_script("window.scrollTo(0, 0);")
        d.execute_script("arguments[0].scrollIntoView({block: 'start'});", css(d, "#sl-headline")[0])
        time.sleep(2.0)
        d.save_screenshot(str(out))


if __name__ == "__main__":
    take_inspector_screenshot(screenshot_path("docs/screenshot-inspector.png"))
