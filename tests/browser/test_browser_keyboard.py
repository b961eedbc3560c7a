"""The page from the keyboard, in a real browser (headless chromium, the shared app of conftest.py):
the first Tab reaches a link past the settings sidebar to the prompt box, and a reply's tokens are
one stop in the Tab order whose arrow keys walk its steps and whose Enter or Space opens the step
in the inspector, as a click or a tap does."""

from __future__ import annotations

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from tests.browser import driver as browser
from tests.browser.driver import choose_shape, css, usable, wait_for
from tests.browser.test_browser_contrast import keyboard_focus
from tests.browser.test_browser_inspect import BUDGET, generate, inspected, set_number

pytestmark = browser.pytestmark  # skipped without chromium, as every browser test

ACTIVE_JS = """
const e = document.activeElement, r = e.getBoundingClientRect(), s = getComputedStyle(e);
const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
return {tag: e.tagName, cls: e.className, step: e.getAttribute('data-step'), inPrompt: !!e.closest('#sl-prompt'),
        top: r.top, bottom: r.bottom, onTop: !!hit && (hit === e || e.contains(hit)),
        outline: parseFloat(s.outlineWidth) || 0, style: s.outlineStyle};
"""


def press(driver, key) -> dict:
    ActionChains(driver).send_keys(key).perform()
    return driver.execute_script(ACTIVE_JS)


def test_the_first_tab_reaches_a_visible_link_that_puts_the_prompt_box_in_focus(app_url, driver):
    driver.set_window_size(1440, 900)
    driver.get(app_url)
    usable(driver, "#sl-prompt textarea")
    driver.execute_script("document.activeElement.blur();")
    link = press(driver, Keys.TAB)
    assert link["tag"] == "A" and "sl-skip" in link["cls"], link
    # shown while focused, over everything (the settings sidebar too)
    assert 0 <= link["top"] and link["bottom"] <= driver.execute_script("return innerHeight;") and link["onTop"], link
    assert press(driver, Keys.ENTER)["inPrompt"]  # two presses, where the sidebar's controls took 38


def test_a_reply_is_one_tab_stop_whose_arrows_walk_its_steps_and_enter_opens_one(app_url, driver):
    driver.set_window_size(1440, 900)
    driver.get(app_url)
    usable(driver, "#sl-prompt textarea")
    set_number(driver, "#sl-max-new", BUDGET)
    choose_shape(driver, "chain")
    generate(driver)
    steps = list(dict.fromkeys(e.get_attribute("data-step") for e in css(driver, "#sl-conversation [data-step]")))
    assert len(steps) >= 3, steps
    stops = driver.execute_script("return [...document.querySelectorAll('#sl-conversation [data-step]')]"
                                  ".filter(e => e.tabIndex >= 0).map(e => e.getAttribute('data-step'));")
    assert stops == [steps[0]]  # one stop: the reply's first step

    first = keyboard_focus(driver, f'#sl-conversation [data-step="{steps[0]}"][tabindex="0"]')
    assert first.get_attribute("data-step") == steps[0]
    at = press(driver, Keys.ARROW_RIGHT)
    assert at["step"] == steps[1] and at["outline"] >= 2 and at["style"] != "none", at  # a ring shows where
    assert press(driver, Keys.END)["step"] == steps[-1]
    assert press(driver, Keys.ARROW_LEFT)["step"] == steps[-2]
    press(driver, Keys.ENTER)
    wait_for(lambda: inspected(driver) == int(steps[-2]), 30, f"the inspector on step {steps[-2]}")
    assert press(driver, Keys.HOME)["step"] == steps[0]
    press(driver, Keys.SPACE)
    wait_for(lambda: inspected(driver) == int(steps[0]), 30, f"the inspector on step {steps[0]}")
    stops = driver.execute_script("return [...document.querySelectorAll('#sl-conversation [data-step]')]"
                                  ".filter(e => e.tabIndex >= 0).length;")
    assert stops == 1  # still one stop: the one focused
