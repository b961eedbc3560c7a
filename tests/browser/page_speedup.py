"""The page's measured speedup against the bench's, prompt by prompt (a measurement, not a test).

    python -m tests.browser.page_speedup --prompts assets/prompts/unseen.jsonl --num-prompts 6 --max-new-tokens 96

Starts `python app.py` (the embedded default, its default draft), and for each prompt ticks
"Compare with target-only" in headless chromium, generates, and reads the speedup the headline
shows. Then, with the app idle, `python -m demo.bench` decodes the same prompts target-only and with
the page's default draft, and each prompt's bench speedup is its two runs' tokens/s of engine time
(what the page divides too). Prints one markdown table and the medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.browser.driver import (ARTIFACTS, ROOT, click, close_browser, css, open_browser, set_setting, start_app,
                                  stop_app, usable, wait_for)


def page_speedups(prompts: list[str], max_new_tokens: int) -> list[tuple[float, str]]:
    """(speedup, its range as the headline words it) of each prompt, compared on the page."""
    ARTIFACTS.mkdir(exist_ok=True)
    proc, url = start_app(ARTIFACTS / "page_speedup_app.log")
    driver = open_browser()
    out = []
    try:
        driver.set_window_size(1440, 900)
        driver.get(url)
        usable(driver, "#sl-prompt textarea")
        set_setting(driver, "#sl-max-new input[type=number]", max_new_tokens)
        box = wait_for(lambda: css(driver, "#sl-compare input"), 60, "the compare checkbox")[0]
        if not box.is_selected():
            driver.execute_script("arguments[0].click();", box)
        for prompt in prompts:
            click(driver, "#sl-clear")
            wait_for(lambda: not css(driver, "#sl-conversation .sl-assistant"), 30, "a cleared conversation")
            usable(driver, "#sl-prompt textarea").send_keys(prompt)
            driver.execute_script("arguments[0].click();", usable(driver, "#sl-generate"))
            wait_for(lambda: "speedup, measured" in css(driver, "#sl-headline")[0].text, 600, "the measured speedup")
            text = css(driver, "#sl-headline")[0].text
            speedup = float(re.search(r"([\d.]+)×\s*speedup, measured", text).group(1))
            out.append((speedup, re.search(r"speedup, measured\s*(.*?):", text).group(1)))
            print(f"page: {speedup:.2f}x  {prompt[:50]!r}", file=sys.stderr, flush=True)
    finally:
        close_browser(driver)
        stop_app(proc)
    return out


def bench_speedups(prompts_file: Path, max_new_tokens: int) -> list[float]:
    """Each prompt's eagle3 / target-only tokens/s, from two bench runs at the page's default draft."""
    from demo.methods import default_draft

    k, tree = default_draft("cpu")
    draft = ["-k", str(k)] + (["--tree-topk", str(tree.topk), "--num-draft-tokens", str(tree.size)]
                              if tree else [])
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, extra in (("none", []), ("eagle3", draft)):
            out = Path(tmp) / f"{method}.json"
            subprocess.run([sys.executable, "-m", "demo.bench", "--method", method, *extra, "--prompts", str(prompts_file),
                            "--max-new-tokens", str(max_new_tokens), "--json", str(out)], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            runs[method] = [r["stats"]["tokens_per_s"] for r in json.loads(out.read_text())["records"]]
    return [s / t for s, t in zip(runs["eagle3"], runs["none"])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.browser.page_speedup", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", default="assets/prompts/unseen.jsonl")
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=96)
    a = p.parse_args(argv)
    rows = [json.loads(line) for line in (ROOT / a.prompts).read_text().splitlines() if line.strip()][:a.num_prompts]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    prompts = [r["turns"][0] for r in rows]
    page = page_speedups(prompts, a.max_new_tokens)
    bench = bench_speedups(Path(f.name), a.max_new_tokens)
    print("| prompt | page speedup | bench speedup | page / bench | bench within the page's range |\n"
          "|---|---|---|---|---|")
    within = 0
    for prompt, (s, how), b in zip(prompts, page, bench):
        span = re.search(r"([\d.]+)–([\d.]+) over", how)  # the range the page states (three timings)
        inside = bool(span) and float(span.group(1)) <= round(b, 2) <= float(span.group(2))
        within += inside
        print(f"| {prompt[:48]} | {s:.2f}x ({how}) | {b:.2f}x | {s / b:.2f} | {'yes' if inside else 'no'} |")
    mp, mb = statistics.median(s for s, _ in page), statistics.median(bench)
    print(f"\nmedian: page {mp:.2f}x, bench {mb:.2f}x, page / bench {mp / mb:.2f}; "
          f"the bench's within the page's range on {within} of {len(page)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
