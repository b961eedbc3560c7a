"""The page reads at WCAG AA contrast, in a real browser (headless chromium, the shared app of
conftest.py), on a desktop (1440x900) and a phone (390x844): Generate, Stop and the selected tabs'
labels at 4.5:1 or more against what lies behind them, at rest and under the pointer; the prompt
box, focused from the keyboard, shows a ring at least 2px wide at 3:1 or more against the page
(WCAG 2.2 focus appearance). Every colour is the browser's computed one; the ratio is WCAG's, from
relative luminance. Helpers and skip rules are tests/browser/driver.py's.
"""

from __future__ import annotations

import pytest

from tests.browser import driver as browser
from tests.browser.driver import css, usable, wait_for

pytestmark = browser.pytestmark  # skipped without chromium, as every browser test

SIZES = pytest.mark.parametrize("size", [(1440, 900), (390, 844)], ids=["desktop", "phone"])
TEXT_AA = 4.5  # WCAG 1.4.3, normal-size text
FOCUS_RING = 3.0  # WCAG 2.2 focus appearance: 3:1 against what surrounds it, at least 2 CSS px thick

# In the page: colours parsed from computed styles, composited over what lies behind, and WCAG's ratio.
CONTRAST_JS = """
const parse = (c) => {
  const m = c && c.match(/rgba?\\(([^)]*)\\)/);
  if (!m) return null;
  const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
};
const over = (top, under) => {  // top composited over an opaque colour
  const a = top[3];
  return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat([1]);
};
const backdrop = (el) => {  // the opaque colour behind el's content: its background and those under it
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
};
const luminance = (c) => {
  const [r, g, b] = c.slice(0, 3).map((v) => {
    v /= 255;
    return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const ratio = (a, b) => {
  const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (hi + 0.05) / (lo + 0.05);
};
const textElement = (el) => {  // the element that draws el's first visible text
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) if (n.textContent.trim()) return n.parentElement;
  return el;
};
"""

TEXT_CONTRAST_JS = CONTRAST_JS + """
const el = textElement(arguments[0]);
const bg = backdrop(el);
const fg = parse(getComputedStyle(el).color);
return {text: el.textContent.trim(), color: getComputedStyle(el).color,
        background: `rgb(${bg.slice(0, 3).map(Math.round).join(', ')})`, ratio: fg ? ratio(over(fg, bg), bg) : 0};
"""

FOCUS_RING_JS = CONTRAST_JS + """
const el = arguments[0];
const style = getComputedStyle(el);
const page = backdrop(el.parentElement);  // what the ring is drawn on
const rings = [];
if (style.outlineStyle !== 'none') {
  rings.push({kind: 'outline', color: style.outlineColor, width: parseFloat(style.outlineWidth)});
}
// box-shadow: "rgb(37, 99, 235) 0px 0px 0px 2px, rgba(0, 0, 0, 0.05) 0px 2px 4px 0px inset"
for (const shadow of (style.boxShadow === 'none' ? [] : style.boxShadow.split(/,(?![^(]*\\))/))) {
  if (/\\binset\\b/.test(shadow)) continue;  // drawn inside the box, under the text
  const color = (shadow.match(/rgba?\\([^)]*\\)/) || [''])[0];
  const lengths = shadow.replace(color, '').match(/-?[\\d.]+px/g) || [];
  rings.push({kind: 'box-shadow', color: color, width: parseFloat(lengths[3] || '0')});  // its spread
}
for (const ring of rings) {
  const c = parse(ring.color);
  ring.ratio = c ? ratio(over(c, page), page) : 0;
}
return {focused: document.activeElement === el, rings: rings,
        page: `rgb(${page.slice(0, 3).map(Math.round).join(', ')})`};
"""


def settled(read, what: str):
    """read() once two reads 0.25 s apart agree: a colour mid-transition (Gradio fades a button's
    background on hover) is not yet the colour the state shows."""
    seen = []

    def same_twice():
        seen.append(read())
        return len(seen) > 1 and seen[-1] == seen[-2]
    wait_for(same_twice, 15, what)
    return seen[-1]


def text_contrast(driver, element) -> dict:
    return settled(lambda: driver.execute_script(TEXT_CONTRAST_JS, element), "the colours to settle")


def selected_tabs(driver) -> list:
    """The selected tab of each tab bar (the page's Chat / Benchmark, the charts' tabs)."""
    tabs = []
    for bar in ("#sl-tabs", "#sl-chart-tabs"):
        selector = f"{bar} [role=tab][aria-selected=true]"
        shown = wait_for(lambda: [e for e in css(driver, selector) if e.is_displayed()], 30, f"the selected tab of {bar}")
        tabs.append(shown[0])
    return tabs


def open_page(driver, app_url, size) -> None:
    driver.set_window_size(*size)
    driver.get(app_url)
    usable(driver, "#sl-prompt textarea")


def keyboard_focus(driver, selector: str):
    """Focus the element matching selector with the Tab key, from the control before it in tab order."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    target = usable(driver, selector)
    driver.execute_script("""
        const target = arguments[0];
        const tabbable = [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
          .filter((e) => !e.disabled && e.tabIndex >= 0 && e.getClientRects().length > 0);
        const before = tabbable[tabbable.indexOf(target) - 1];
        if (before) before.focus(); else document.activeElement.blur();""", target)
    for _ in range(5):  # one Tab, unless something the list missed takes focus on the way
        ActionChains(driver).send_keys(Keys.TAB).perform()
        if driver.execute_script("return document.activeElement === arguments[0];", target):
            return target
    raise AssertionError(f"Tab did not reach {selector}")


@SIZES
def test_generate_stop_and_the_selected_tabs_read_at_wcag_aa_contrast(app_url, driver, size):
    from selenium.webdriver.common.action_chains import ActionChains

    open_page(driver, app_url, size)
    measured = {name: text_contrast(driver, usable(driver, f"#sl-{name}")) for name in ("generate", "stop")}
    for tab in selected_tabs(driver):
        label = text_contrast(driver, tab)
        measured[f"tab {label['text']!r}"] = label
    for name in ("generate", "stop"):  # under the pointer too (Gradio darkens the background on hover)
        button = usable(driver, f"#sl-{name}")
        ActionChains(driver).move_to_element(button).perform()
        measured[f"{name}, hovered"] = text_contrast(driver, button)

    low = {name: f"{m['ratio']:.2f}:1 ({m['color']} on {m['background']})" for name, m in measured.items()
           if m["ratio"] < TEXT_AA}
    assert not low, f"below {TEXT_AA}:1 at {size}: {low}"


@SIZES
def test_the_prompt_box_focused_from_the_keyboard_shows_a_ring_at_3_to_1_and_2px(app_url, driver, size):
    open_page(driver, app_url, size)
    box = keyboard_focus(driver, "#sl-prompt textarea")
    focus = settled(lambda: driver.execute_script(FOCUS_RING_JS, box), "the focus ring to settle")
    assert focus["focused"]
    visible = [r for r in focus["rings"] if r["width"] >= 2 and r["ratio"] >= FOCUS_RING]
    rings = [f"{r['kind']} {r['width']:g}px {r['color']} at {r['ratio']:.2f}:1" for r in focus["rings"]]
    assert visible, f"no focus ring of 2px at {FOCUS_RING}:1 on {focus['page']} at {size}: {rings or 'none'}"
