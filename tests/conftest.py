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
    from demo.loading import load_target

    return load_target("default", device="cpu", dtype="float32")
