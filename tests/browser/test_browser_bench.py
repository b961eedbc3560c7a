"""In a real browser against `python app.py` (the embedded default; the shared `app_url` fixture): the
Benchmark tab measures a very small plan and shows the bench CLI's table, a chart with plotly's
"Download plot as a PNG" button and a CSV download; a finished chat reply downloads as a trace.
Helpers and skip rules are tests/browser/driver.py's."""

from __future__ import annotations

import csv
import json

from demo.methods import default_draft
from tests.browser import driver as browser
from tests.browser.driver import click, css, type_and_generate, usable, wait_for

pytestmark = browser.pytestmark  # skipped without chromium, as every browser test


def allow_downloads(driver, folder) -> None:
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)})


def set_number(driver, selector: str, value: int) -> None:
    """Type a value into a slider's number box as a visitor would, then leave it."""
    box = usable(driver, f"{selector} input[type=number]")
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));"
                          "arguments[0].dispatchEvent(new Event('blur'));", box, str(value))


def downloaded(folder, suffix: str, timeout: float = 30):
    return wait_for(lambda: sorted(folder.glob(f"*{suffix}")), timeout, f"a downloaded {suffix} file")[0]


def open_bench_tab(driver) -> None:
    click(driver, wait_for(lambda: [t for t in css(driver, "button[role=tab]") if t.text == "Benchmark"], 60, "the tabs")[0])
    usable(driver, "#sl-bench-run")


def tick(driver, group: str, wanted) -> None:
    """Tick exactly those choices of a checkbox group whose label `wanted(label)` accepts."""
    for choice in wait_for(lambda: css(driver, f"{group} label"), 30, f"the choices of {group}"):
        if choice.find_element("css selector", "input").is_selected() != wanted(choice.text.strip()):
            click(driver, choice)


def run_small_plan(driver, num_prompts: int, max_new_tokens: int, configs: int) -> None:
    """Set the plan's size, check its work line counts `configs` configurations, run it to the end."""
    set_number(driver, "#sl-bench-num-prompts", num_prompts)
    set_number(driver, "#sl-bench-max-new", max_new_tokens)
    wait_for(lambda: f"{configs} configuration(s)" in css(driver, "#sl-bench-work")[0].text, 30, "the plan's work line")
    click(driver, "#sl-bench-run")
    wait_for(lambda: f"done: {configs} configuration(s)" in css(driver, "#sl-bench-status")[0].text, 240, "the benchmark")


def test_a_small_benchmark_shows_the_clis_table_a_chart_with_a_png_button_and_a_csv(app_url, driver, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    allow_downloads(driver, tmp_path)
    driver.get(app_url)
    open_bench_tab(driver)
    tick(driver, "#sl-bench-methods", lambda text: text in ("target only", "EAGLE-3"))
    tick(driver, "#sl-bench-ks", lambda text: text == "2")
    run_small_plan(driver, num_prompts=2, max_new_tokens=8, configs=2)
    summary = css(driver, "#sl-bench-summary")[0].text
    assert "target only · eager" in summary and "EAGLE-3 k=2 · eager" in summary
    assert "EAGLE-3 k=2 · eager" in css(driver, "#sl-bench-categories")[0].text
    report = css(driver, "#sl-bench-report")[0].text  # the bench CLI's acceptance table, per configuration
    assert report.count("mean acceptance length:") == 2 and "acceptance at draft 2:" in report
    chart = css(driver, "#sl-bench-chart .js-plotly-plot")[0]
    assert len(css(driver, "#sl-bench-chart .js-plotly-plot g.trace.scatter")) >= 4  # 2 series x 2 panels
    ActionChains(driver).move_to_element(chart).perform()
    assert "Download plot as a PNG" in [b.get_attribute("data-title") for b in
                                        css(driver, "#sl-bench-chart .modebar-btn")]

    click(driver, "#sl-bench-csv")
    with open(downloaded(tmp_path, ".csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["method"], r["k"], r["category"]) for r in rows[:2]] == [("none", "0", "all"), ("eagle3", "2", "all")]
    assert float(rows[1]["mean_acceptance_length"]) >= 1.0 and rows[1]["prompts"] == "2"


def test_ticking_tree_measures_the_chat_tabs_default_tree_in_a_row_named_by_its_shape(app_url, driver):
    k, tree = default_draft("cpu")  # what the Chat tab drafts first at T = 0 on this app's device, a CPU
    label = f"EAGLE-3 tree {k} × {tree.topk}, {tree.size} · eager"
    driver.get(app_url)
    open_bench_tab(driver)
    tick(driver, "#sl-bench-methods", lambda text: text in ("target only", "EAGLE-3"))
    tick(driver, "#sl-bench-shapes", lambda text: text.startswith("tree"))  # the tree, no chain
    run_small_plan(driver, num_prompts=2, max_new_tokens=8, configs=2)
    assert label in css(driver, "#sl-bench-summary")[0].text and label in css(driver, "#sl-bench-categories")[0].text
    assert label in [t.text for t in css(driver, "#sl-bench-chart .legendtext")]  # the chart's point, by name
    assert f"tree depth {k} x top-{tree.topk}, {tree.size} tokens verified per step" in \
        css(driver, "#sl-bench-report")[0].text  # the bench CLI's own words for the shape


def test_a_finished_reply_downloads_as_a_trace_of_its_steps(app_url, driver, tmp_path):
    allow_downloads(driver, tmp_path)
    driver.get(app_url)
    wait_for(lambda: css(driver, "#sl-trace-download"), 60, "the trace button")
    assert not css(driver, "#sl-trace-download")[0].is_enabled()  # nothing to trace yet
    set_number(driver, "#sl-max-new", 8)
    type_and_generate(driver, "Say hello.")
    wait_for(lambda: "sl-status-done" in css(driver, "#sl-status")[0].get_attribute("innerHTML"), 120, "the reply")
    click(driver, "#sl-trace-download")
    trace = json.loads(downloaded(tmp_path, ".json").read_text(encoding="utf-8"))
    reply = driver.execute_script(  # the reply as emitted: without the struck rejected drafts
        "const r = arguments[0].cloneNode(true); r.querySelectorAll('.sl-rejected').forEach(e => e.remove());"
        "return r.textContent;", css(driver, "#sl-conversation .sl-assistant .sl-reply")[0])
    assert trace["settings"]["max_new_tokens"] == 8 and trace["environment"]["device"] == "cpu"
    assert [s["step"] for s in trace["steps"]] == list(range(len(trace["steps"])))
    assert "".join(t["text"] for s in trace["steps"] for t in s["emitted"]).strip() == reply.strip()


CLIPPED_OR_BROKEN_JS = """
const bad = [];
for (const cell of document.querySelectorAll(arguments[0] + ' th, ' + arguments[0] + ' [role=gridcell]')) {
  const clip = (cell.querySelector('.header-content, .cell-wrap') || cell).getBoundingClientRect();
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT), tops = new Set();
  const text = cell.textContent.replace('⋮', '').trim();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest('button')) continue;  // the column menu's button
    for (const word of node.data.matchAll(/\\S+/g)) {  // each word whole inside the box that clips it
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      for (const r of range.getClientRects()) {
        tops.add(Math.round(r.top));
        if (r.right > clip.right + 0.5 || r.left < clip.left - 0.5) bad.push('clipped: ' + text);
      }
    }
  }
  if (/^[-\\d.,]+( ?x)?$/.test(text) && tops.size > 1) bad.push('split: ' + text);
}
return [...new Set(bad)];
"""


def test_the_benchmark_tab_uses_the_page_width_and_shows_every_header_and_number_whole(app_url, driver):
    # On a laptop-sized window the Chat tab's open sidebar left a blank 340-px band on this tab, and the
    # table's columns were so narrow that headers read "configurati", "tok", "propo" and numbers split
    # over two lines ("33." / "7"); the chart's two x-axis titles ran into each other.
    driver.set_window_size(1400, 1000)
    driver.get(app_url)
    open_bench_tab(driver)
    # no blank band where the Chat tab's sidebar is (the page's padding eases away: waited for)
    wait_for(lambda: css(driver, "#sl-tab-bench")[0].rect["x"] < 100, 10, "the tab to take the page's width")
    tick(driver, "#sl-bench-shapes", lambda text: True)  # chains at the default k and the tree
    run_small_plan(driver, num_prompts=1, max_new_tokens=8, configs=5)

    for table in ("#sl-bench-summary", "#sl-bench-categories"):  # in view: the grid lays out its rows there
        driver.execute_script("arguments[0].scrollIntoView();", css(driver, table)[0])
        assert driver.execute_script(CLIPPED_OR_BROKEN_JS, table) == [], table
    titles = driver.execute_script(
        "const svg = document.querySelector('#sl-bench-chart .main-svg').getBoundingClientRect();"
        "return [...document.querySelectorAll('#sl-bench-chart .g-xtitle text, #sl-bench-chart .g-x2title text')]"
        ".map(t => t.getBoundingClientRect()).map(r => [r.left - svg.left, r.right - svg.left, svg.width]);")
    assert len(titles) == 2
    (left_a, right_a, width), (left_b, right_b, _) = sorted(titles)
    assert 0 <= left_a and right_a <= left_b and right_b <= width  # each whole, side by side
