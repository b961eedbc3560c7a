"""The page on a phone, in a real browser (headless chromium, the shared app of conftest.py): a
390 x 844 touch viewport, emulated as a phone shows it (CSS pixels, overlay scrollbars), checked
beside a desktop's 1440 x 900 where the same rule serves both. Every example prompt reads whole;
while a reply streams its headline stands on the first screen, right above the reply."""

from __future__ import annotations

import time

from tests.browser.driver import *  # noqa: F401,F403  (helpers shared with the other browser tests)

PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
DESKTOP = (1440, 900)
LONG = "Write a long story about a robot who learns to paint."


def open_as_phone(driver, url: str) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 5})
    driver.get(url)
    usable(driver, "#sl-prompt textarea")
    time.sleep(1.0)  # the settings slide away
    wait_for(lambda: "open" not in css(driver, "#sl-sidebar")[0].get_attribute("class").split(), 10,
             "the settings to be closed")


def open_as_desktop(driver, url: str) -> None:
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})
    driver.set_window_size(*DESKTOP)
    driver.get(url)
    usable(driver, "#sl-prompt textarea")


def example_prompts() -> list[str]:
    from demo.ui.assets import example_prompts as read

    return read()


# Each example's cell: the text it shows, whether it or anything in it is cut off (its content wider
# or taller than its box), and its box.
EXAMPLES_JS = """
return [...document.querySelectorAll('#sl-examples .gallery-item')].map(cell => {
  const cut = [cell, ...cell.querySelectorAll('*')].filter(e =>
    e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1);
  const r = cell.getBoundingClientRect();
  return {text: cell.innerText.trim(), cut: cut.map(e => e.tagName + '.' + e.className),
          left: r.left, right: r.right, top: Math.round(r.top)};
});
"""


def examples_read_whole(driver) -> list[dict]:
    """Every example's cell shows its whole prompt, uncut, on the screen. (Gradio's textbox example
    shows a prompt's first 60 characters and "...": assets/examples.json keeps each prompt shorter.)"""
    prompts = example_prompts()
    cells = wait_for(lambda: (lambda c: c if len(c) == len(prompts) else None)(driver.execute_script(EXAMPLES_JS)),
                     30, "the example prompts")
    width = driver.execute_script("return document.documentElement.clientWidth;")
    unread = [(prompt, cell["text"], cell["cut"], (round(cell["left"]), round(cell["right"])))
              for prompt, cell in zip(prompts, cells)
              if cell["text"] != prompt or cell["cut"] or not 0 <= cell["left"] <= cell["right"] <= width + 1]
    assert unread == [], f"(prompt, shown, clipped parts, box in a {width}px page): {unread}"
    return cells


def test_every_example_prompt_reads_whole_on_a_phone(app_url, driver):
    open_as_phone(driver, app_url)
    examples_read_whole(driver)

    open_as_desktop(driver, app_url)  # a desktop still sets several examples side by side
    cells = examples_read_whole(driver)
    assert len({c["top"] for c in cells}) < len(cells)


def test_on_a_phone_the_headline_shows_on_the_first_screen_right_above_the_streaming_reply(app_url, driver):
    open_as_phone(driver, app_url)
    set_setting(driver, "#sl-max-new input[type=number]", MAX_NEW_TOKENS)  # long: it streams while we look
    type_and_generate(driver, LONG)
    wait_for(lambda: len(css(driver, "#sl-conversation .sl-assistant .sl-tok")) >= 12
             and "tokens per target call" in css(driver, "#sl-headline")[0].text, 240, "12 streamed tokens")
    try:
        driver.execute_script("window.scrollTo(0, 0);")
        assert "generating" in css(driver, "#sl-status")[0].text  # still streaming
        headline, reply = (rect(driver, css(driver, s)[0]) for s in ("#sl-headline", "#sl-conversation"))
        fold = driver.execute_script("return window.innerHeight;")
        assert 0 <= headline["top"] and headline["bottom"] <= fold, f"headline {headline}, fold at {fold}"
        assert 0 <= reply["bottom"] - headline["bottom"] and reply["top"] - headline["bottom"] <= 16, \
            f"the headline {headline} is not right above the reply {reply}"
        assert reply["bottom"] <= fold + 1  # the reply box still whole on the first screen
    finally:
        click(driver, "#sl-stop")
        wait_for(lambda: "stopped" in css(driver, "#sl-status")[0].text, 60, "the stopped status")

    open_as_desktop(driver, app_url)  # a desktop already has it there
    headline, reply = (rect(driver, css(driver, s)[0]) for s in ("#sl-headline", "#sl-conversation"))
    assert headline["bottom"] <= reply["top"] and headline["bottom"] <= driver.execute_script("return innerHeight;")


# The boxes of the legend's entries and of the "show rejected drafts" checkbox beside it.
LEGEND_JS = """
const box = e => { const r = e.getBoundingClientRect(); return {left: r.left, top: r.top, right: r.right, bottom: r.bottom,
                                                                 text: e.innerText.trim().slice(0, 40)}; };
const items = [...document.querySelectorAll('#sl-legend .sl-legend-item')].filter(e => e.offsetParent).map(box);
return {items, toggle: box(document.querySelector('#sl-show-rejected label'))};
"""


def legend_overlaps(driver) -> list[str]:
    """The legend entries the checkbox beside them covers, and any entry out of the page's width."""
    found = driver.execute_script(LEGEND_JS)
    t, width = found["toggle"], driver.execute_script("return document.documentElement.clientWidth;")
    return [i["text"] for i in found["items"]
            if (i["left"] < t["right"] and t["left"] < i["right"] and i["top"] < t["bottom"] and t["top"] < i["bottom"])
            or i["right"] > width + 1] + (["the checkbox is out of the page"] if t["right"] > width + 1 else [])


@pytest.mark.parametrize("width", [360, 390])
def test_the_legend_and_its_checkbox_never_overlap_on_a_narrow_phone_or_a_desktop(app_url, driver, width):
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**PHONE, "width": width})
    driver.get(app_url)
    usable(driver, "#sl-prompt textarea")
    wait_for(lambda: css(driver, "#sl-legend .sl-legend-item"), 30, "the legend")
    assert legend_overlaps(driver) == []

    open_as_desktop(driver, app_url)
    assert legend_overlaps(driver) == []
