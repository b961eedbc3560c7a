import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one; run them on a GPU machine "
                                       "with `python -m pytest -m cuda tests`)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_target():
    """The embedded SmolLM2-135M-Instruct (hf_model, tokenizer), fp32 on CPU, loaded once."""
    from demo.models.loading import load_target

    return load_target("default", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def app_url():
    """`python app.py` (the embedded default) on a free port, one for every browser test of the session."""
    from tests.browser.driver import ARTIFACTS, start_app, stop_app

    ARTIFACTS.mkdir(exist_ok=True)
    proc, url = start_app(ARTIFACTS / "browser_app.log")
    yield url
    stop_app(proc)


@pytest.fixture
def driver(request):
    """A fresh headless chromium; on failure its screenshot is kept under artifacts/."""
    from tests.browser.driver import ARTIFACTS, close_browser, open_browser

    d = open_browser()
    failed = request.session.testsfailed
    yield d
    if request.session.testsfailed > failed:  # keep what the browser showed, as a test artifact
        d.save_screenshot(str(ARTIFACTS / f"failure_{request.node.name}.png"))
    close_browser(d)


@pytest.fixture(scope="module")
def public_app():
    """(demo, url): a public app on the predictable tiny default (tests/tiny_chat.py: every token "a"),
    launched as app.py launches it, one a test module."""
    from demo.service.hosting import Hosting
    from demo.views import build_demo
    from tests.service.http_app import serve
    from tests.tiny_chat import tiny_session

    demo = build_demo(tiny_session(predictable=True), Hosting(public=True))
    url = serve(demo, Hosting(public=True))
    yield demo, url
    demo.close()
