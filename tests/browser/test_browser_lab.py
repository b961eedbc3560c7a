"""In a real browser against `python app.py` (the embedded default in local mode; the shared `app_url`
fixture): the Benchmark tab's capture lab, fault off and on. The same prompt is decoded eagerly,
replayed without a fault, and replayed with the catch-up features rebound: the table's parity column
passes the first and flags the second, whose mean acceptance length falls, and the panel shows the
three replies side by side, the same text. Helpers and skip rules are tests/browser/driver.py's.

    python -m tests.browser.test_browser_lab [OUT.png]   # the README's screenshot (docs/screenshot-lab.png)
"""

from __future__ import annotations

import json
from pathlib import Path

from demo.bench.faults import FAULT_LABELS
from tests.browser import driver as browser
from tests.browser.driver import ARTIFACTS, app_in_browser, click, css, screenshot_path, usable, wait_for

pytestmark = browser.pytestmark  # skipped without chromium, as every browser test

ROWS = ("EAGLE-3 k=3 · eager", "EAGLE-3 k=3 · replayed · no fault", "EAGLE-3 k=3 · replayed · fault: stale features")


def choose(driver, selector: str, wanted: set[str]) -> None:
    """Tick exactly the labels of a checkbox group whose text is in `wanted`."""
    for label in css(driver, f"{selector} label"):
        if label.find_element("css selector", "input").is_selected() != (label.text.strip() in wanted):
            click(driver, label)


def set_number(driver, selector: str, value: int) -> None:
    box = usable(driver, f"{selector} input[type=number]")
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));"
                          "arguments[0].dispatchEvent(new Event('blur'));", box, str(value))


def run_lab(driver, url: str, num_prompts: int, max_new_tokens: int, prompt_file: Path | None = None) -> None:
    """EAGLE-3 at k = 3, eagerly and replayed with no fault and with stale features, to the end, on the
    bundled questions or `prompt_file`'s."""
    driver.get(url)
    click(driver, wait_for(lambda: [t for t in css(driver, "button[role=tab]") if t.text == "Benchmark"], 60,
                           "the tabs")[0])
    usable(driver, "#sl-bench-run")
    if prompt_file is not None:
        wait_for(lambda: css(driver, "#sl-bench-file input[type=file]"), 30, "the file input")[0].send_keys(
            str(prompt_file))
        wait_for(lambda: "your file" in css(driver, "#sl-bench-prompts")[0].text, 60, "the uploaded prompts")
    choose(driver, "#sl-bench-methods", {"EAGLE-3"})
    choose(driver, "#sl-bench-ks", {"3"})
    choose(driver, "#sl-bench-faults", {FAULT_LABELS["none"], FAULT_LABELS["stale-features"]})
    set_number(driver, "#sl-bench-num-prompts", num_prompts)
    set_number(driver, "#sl-bench-max-new", max_new_tokens)
    wait_for(lambda: "3 configuration(s)" in css(driver, "#sl-bench-work")[0].text, 30, "the plan's work line")
    click(driver, "#sl-bench-run")
    wait_for(lambda: "done:" in css(driver, "#sl-bench-status")[0].text, 600, "the benchmark to finish")


def summary(driver) -> dict[str, list[str]]:
    """The table's rows by configuration, as the page shows its cells."""
    rows = driver.execute_script(  # Gradio draws the rows as divs of role "row" holding "gridcell"s
        "return Array.from(document.querySelectorAll('#sl-bench-summary [role=row]'))"
        ".map(r => Array.from(r.querySelectorAll('[role=gridcell]')).map(c => c.textContent.trim()));")
    return {row[0]: row for row in rows if row}


def test_the_capture_lab_flags_a_fault_by_its_counts_while_the_reply_stays_the_same(app_url, driver):
    run_lab(driver, app_url, num_prompts=1, max_new_tokens=24)
    rows = summary(driver)
    assert list(rows) == list(ROWS)
    eager, clean, faulted = (rows[name] for name in ROWS)
    assert eager[-1] == "-" and clean[-1] == "✓ equal to eager" and clean[3] == eager[3]  # fault off: eager's counts
    assert faulted[-1].startswith("✗ draft ") and faulted[-1].endswith("text identical 1/1")  # fault on: flagged
    assert float(faulted[3]) < float(eager[3])  # mean acceptance length
    panel = css(driver, "#sl-bench-lab")[0]
    assert "the parity check flags it (✗)" in panel.text and "the parity check passes (✓)" in panel.text
    texts = [lane.text for lane in css(driver, "#sl-bench-lab .sl-lab-text")]
    assert len(texts) == 3 and texts[0] and texts[0] == texts[1] == texts[2]  # the same reply, off and on
    assert panel.text.count("✓ the same 24 tokens as eager's") == 2


def take_lab_screenshot(out: Path) -> None:
    """The capture lab after a two-prompt run: the table's parity column and the replies side by side."""
    prompts = ARTIFACTS / "lab_prompts.jsonl"
    ARTIFACTS.mkdir(exist_ok=True)
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, c, t in (
        (1, "writing", "Write a haiku about the sea."), (2, "stem", "Why is the sky blue?"))))
    with app_in_browser("screenshot_lab_app.log") as (d, url):
        d.set_window_size(1600, 1200)
        d.set_window_size(1600, 2400 - d.execute_script("return window.innerHeight;"))  # a 1600 x 1200 page
        run_lab(d, url, num_prompts=2, max_new_tokens=48, prompt_file=prompts)
        d.execute_script("arguments[0].scrollIntoView({block: 'start'});", css(d, "#sl-bench-status")[0])
        d.save_screenshot(str(out))


if __name__ == "__main__":
    take_lab_screenshot(screenshot_path("docs/screenshot-lab.png"))
