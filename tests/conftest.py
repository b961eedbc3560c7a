import pytest


@pytest.fixture(scope="session")
def default_target():
    """The embedded SmolLM2-135M-Instruct (hf_model, tokenizer), fp32 on CPU, loaded once."""
    from demo.loading import load_target

    return load_target("default", device="cpu", dtype="float32")
