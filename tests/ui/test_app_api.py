"""The /generate endpoint, answered through gradio_client by a locally launched app (tiny model)."""

import socket

import pytest

from demo.views import build_demo
from tests.tiny_chat import tiny_session

CONTRACT = ["prompt", "method", "mode", "num_spec_tokens", "temperature", "top_p", "max_new_tokens", "seed", "tree_topk", "num_draft_tokens", "draft_sampling"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client():
    from gradio_client import Client

    demo = build_demo(tiny_session(predictable=True))
    demo.queue(default_concurrency_limit=1)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


def test_generate_is_listed_with_the_contract_keyword_parameters(client):
    api = client.view_api(return_format="dict", print_info=False)
    assert list(api["named_endpoints"]) == ["/generate"]  # the UI's own events stay private
    params = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert params == CONTRACT


def test_generate_streams_steps_and_ends_with_html_and_stats(client):
    job = client.submit(prompt="Say a", method="eagle", mode="eager", num_spec_tokens=3, temperature=0.0, top_p=1.0,
                        max_new_tokens=9, seed=0, api_name="/generate")
    values = list(job)
    final = job.result()
    assert len(values) >= 3 and not values[0]["done"] and final["done"]  # prefill, steps, final
    assert 'class="sl-tok sl-draft sl-d1"' in final["html"] and "sl-d3" in final["html"]  # highlighted drafts
    assert final["text"] == "a" * 9
    stats = final["stats"]
    assert stats["mean_acceptance_length"] == pytest.approx(4.0)
    assert stats["acceptance_per_position"] == pytest.approx([1.0, 1.0, 1.0])
    assert {"tokens_per_s", "mean_draft_ms", "mean_verify_ms", "num_steps", "mode", "device", "dtype"} <= set(stats)
    assert stats["draft_vocab"] == stats["vocab_size"] > 0  # EAGLE-1 drafts over the whole vocabulary


def test_generate_drafts_a_tree_when_asked_and_stays_the_targets_text(client):
    chain = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=3, max_new_tokens=12, api_name="/generate")
    tree = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=3, max_new_tokens=12, tree_topk=2,
                          num_draft_tokens=6, api_name="/generate")
    assert tree["text"] == chain["text"] and tree["done"]


def test_generate_refuses_bad_input_with_the_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="empty"):
        client.predict(prompt="  ", api_name="/generate")
    with pytest.raises(AppError, match="num_spec_tokens"):
        client.predict(prompt="hi", num_spec_tokens=11, api_name="/generate")
    with pytest.raises(AppError, match="verifies"):
        client.predict(prompt="hi", num_spec_tokens=2, tree_topk=2, num_draft_tokens=40, api_name="/generate")
