"""Shared pieces of the browser tests (tests/test_browser*.py): start `python app.py` on a free
port, drive headless Debian chromium with Selenium, wait for and find elements. The fixtures
(`app_url`: one app for the whole session; `driver`: a fresh browser per test) are in conftest.py."""


from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
MAX_NEW_TOKENS = 1900  # the streaming tests' budget, far past where they stop the reply (prompt + 1,900 fit the 2,048-token context)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1500,1900"]


def _missing() -> str | None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return "chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -r requirements-dev.txt)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(log_path: Path, *args: str, timeout: float = 240.0) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free port; returns (process, url) once the page answers."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"app.py did not answer within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def open_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="speclens-chromium-")
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.profile_dir = profile
    return driver


def close_browser(driver) -> None:
    """Quit chromium and remove its profile folder."""
    driver.quit()
    shutil.rmtree(driver.profile_dir, ignore_errors=True)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.25):
    """Poll `predicate` until it is truthy or `timeout` passes. While a long reply streams on a busy
    2-core machine, the page can hold a WebDriver call past its own time limit, or redraw an element
    between finding and reading it (CI: a "script timeout" opening the tree tab mid-reply, 1 run in 5):
    such a poll counts as not yet, and the deadline still bounds the wait."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (StaleElementReferenceException, TimeoutException):
            value = None
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


RECORD_JS = """
const [selector, name] = arguments;
const element = document.querySelector(selector);
window[name] = [];
new MutationObserver(() => window[name].push([performance.now() / 1000, element.innerText]))
  .observe(element, {subtree: true, childList: true, characterData: true});
"""


def record_texts(driver, selector: str):
    """Record every text the element matching `selector` shows from now on, timed in the page
    (seconds); returns a function that reads the record so far as [(t, text)]. A state shown for
    less than a poll (a replay of a few steps at 4 steps / s) is in the record, where polling for
    it from here could miss it on a busy machine."""
    name = "slRecord" + re.sub(r"\W", "_", selector)
    driver.execute_script(RECORD_JS, selector, name)
    return lambda: [tuple(entry) for entry in driver.execute_script(f"return window.{name};")]


def css(driver, selector: str) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def usable(driver, selector: str, timeout: float = 60):
    """The first element matching selector once it is shown and enabled, scrolled into view (an
    element that exists before the page has finished laying out refuses keys and clicks)."""
    def ready():
        shown = [e for e in css(driver, selector) if e.is_displayed() and e.is_enabled()]
        if shown:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", shown[0])
        return shown
    return wait_for(ready, timeout, f"{selector} to be usable")[0]


def click(driver, target, timeout: float = 30) -> None:
    """Click an element, or the first usable match of a selector, retrying while something covers it
    or it cannot take the click yet: on a busy machine a panel still sliding or a redraw can take a
    click meant for it (CI: "element click intercepted" opening the settings on a phone, 1 run in 6)."""
    from selenium.common.exceptions import ElementClickInterceptedException, ElementNotInteractableException

    def attempt():
        element = usable(driver, target) if isinstance(target, str) else target
        try:
            element.click()
        except (ElementClickInterceptedException, ElementNotInteractableException):
            return False
        return True
    wait_for(attempt, timeout, f"a click on {target if isinstance(target, str) else target.tag_name}")


def tree_step(driver) -> int:
    """The step whose tree the tree view shows (0: none yet), from the figure's title. Read in the page
    in one call: while a reply streams plotly redraws the figure, and an element fetched first and read
    after could go stale at every poll on a busy machine (CI timed out so with the tree at step 482)."""
    title = driver.execute_script(
        "const t = document.querySelector('#sl-plot-tree .js-plotly-plot .gtitle'); return t ? t.textContent : '';")
    match = re.match(r"Draft tree of step (\d+):", title or "")
    return int(match.group(1)) if match else 0


def bundled_drafters_exist() -> bool:
    return all((ROOT / "assets" / "drafters" / f"smollm2-135m-{m}" / "config.json").exists() for m in ("eagle", "eagle3"))


def type_and_generate(driver, prompt: str) -> None:
    usable(driver, "#sl-prompt textarea").send_keys(prompt)
    click(driver, "#sl-generate")




def rect(driver, element) -> dict:
    """The element's box in the viewport (left, top, right, bottom, in CSS pixels)."""
    return driver.execute_script("const r = arguments[0].getBoundingClientRect();"
                                 "return {left: r.left, top: r.top, right: r.right, bottom: r.bottom};", element)


def show_tab(driver, tab: str) -> None:
    """Open a tab of the charts panel ("tree", "acceptance", "time", "race"): Gradio draws a tab's
    contents when it is opened."""
    click(driver, f"#sl-tab-{tab}-button")
    wait_for(lambda: displayed(driver, f"#sl-tab-{tab}"), 30, f"the {tab} tab")


def set_setting(driver, selector: str, value) -> None:
    """Type a value into a settings field by script (the settings may be closed, on a phone)."""
    box = wait_for(lambda: css(driver, selector), 60, selector)[0]
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'));"
                          "arguments[0].dispatchEvent(new Event('blur'));", box, str(value))


def choose_shape(driver, shape: str) -> None:
    """Pick the drafting shape ("chain" or "tree") by script (the settings may be closed, on a phone)."""
    radio = wait_for(lambda: [e for e in css(driver, "#sl-shape input") if e.get_attribute("value") == shape], 60,
                     f"the {shape} choice")[0]
    if not radio.is_selected():
        driver.execute_script("arguments[0].click();", radio)
    wait_for(lambda: radio.is_selected(), 10, f"the {shape} choice taken")


def displayed(driver, selector: str) -> bool:
    """Whether an element matching selector is shown (one removed while it is checked is not)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        return any(e.is_displayed() for e in css(driver, selector))
    except StaleElementReferenceException:
        return False


@contextmanager
def app_in_browser(log_name: str = "screenshot_app.log"):
    """`python app.py` and a fresh chromium, for the README screenshot scripts: yields (driver, url);
    both are stopped after."""
    ARTIFACTS.mkdir(exist_ok=True)
    proc, url = start_app(ARTIFACTS / log_name)
    d = open_browser()
    try:
        yield d, url
    finally:
        close_browser(d)
        stop_app(proc)


def screenshot_path(default: str) -> Path:
    """Where a screenshot script writes: its first argument, else `default`."""
    return Path(sys.argv[1] if len(sys.argv) > 1 else default).resolve()
