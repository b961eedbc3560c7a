"""The /generate endpoint, answered through gradio_client by a locally launched app (tiny model)."""

import re
import socket

import pytest

from demo.views import build_demo
from tests.tiny_chat import tiny_session

CONTRACT = ["prompt", "method", "mode", "num_spec_tokens", "temperature", "top_p", "max_new_tokens", "seed", "tree_topk",
            "num_draft_tokens", "draft_sampling", "lookup"]


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
    job = client.submit(prompt="Say a", method="eagle", mode="eager", num_spec_tokens=3, tree_topk=0,
                        temperature=0.0, top_p=1.0, max_new_tokens=9, seed=0, api_name="/generate")  # a chain
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
    chain = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=3, tree_topk=0, max_new_tokens=12,
                           api_name="/generate")
    tree = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=3, max_new_tokens=12, tree_topk=2,
                          num_draft_tokens=6, api_name="/generate")
    assert tree["text"] == chain["text"] and tree["done"]


def test_generate_verifies_a_lookup_branch_when_asked_and_stays_the_targets_text(client):
    chain = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=3, tree_topk=0, max_new_tokens=24,
                           api_name="/generate")
    looked = client.predict(prompt="Say a", method="eagle3", num_spec_tokens=2, max_new_tokens=24, tree_topk=2,
                            num_draft_tokens=4, lookup=8, api_name="/generate")
    assert looked["text"] == chain["text"] and looked["done"]
    # the tiny chat model says "a" over and over: the branch copies it, and steps accept past depth 2
    assert len(looked["stats"]["acceptance_per_position"]) == 2 + 8
    assert looked["stats"]["acceptance_per_position"][2] > 0


def test_generate_refuses_bad_input_with_the_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="empty"):
        client.predict(prompt="  ", api_name="/generate")
    with pytest.raises(AppError, match="num_spec_tokens"):
        client.predict(prompt="hi", num_spec_tokens=11, api_name="/generate")
    with pytest.raises(AppError, match="verifies"):
        client.predict(prompt="hi", num_spec_tokens=2, tree_topk=2, num_draft_tokens=40, api_name="/generate")


def test_values_before_the_first_step_have_no_trace_and_still_answer():
    # graph mode's first update says it captures graphs before the chat has a trace (a GPU's; a CPU
    # refuses graph mode, so the update is fed here as the session makes it)
    from demo.service.chat import ChatState, Turn, Update
    from demo.ui.api import values

    chat = ChatState(turns=[Turn("user", "hi")])
    session = tiny_session(predictable=True)
    first, = values((u for u in [Update(chat, "capturing CUDA graphs for k = 3 (once per draft shape and drafter)…")]),
                    session)
    assert first["finish_reason"] is None and first["step"] is None and not first["done"]
    assert first["delta"] == "" and first["status"].startswith("capturing")


def test_a_reply_streams_what_each_step_added_and_its_whole_rendering_once(client):
    job = client.submit(prompt="Say a", method="eagle", num_spec_tokens=3, max_new_tokens=9, api_name="/generate")
    values = list(job)
    assert "".join(v["delta"] for v in values) == values[-1]["text"] == "a" * 9
    assert all(v["html"] == "" and v["text"] == "" for v in values[:-1]) and values[-1]["html"]
    assert [v["step"] for v in values] == sorted(v["step"] for v in values)  # one value per step, in order


def test_the_defaults_are_the_devices_fastest_mode_and_its_draft_shape_at_the_requests_temperature(client, monkeypatch):
    from demo.config import TreeShape
    from tests.defaults import set_eagle_defaults
    from demo.methods import default_draft

    api = client.view_api(return_format="dict", print_info=False)
    defaults = {p["parameter_name"]: p["parameter_default"] for p in api["named_endpoints"]["/generate"]["parameters"]}
    assert defaults["mode"] == "eager"  # a CPU: graph mode needs a CUDA GPU
    assert defaults["num_spec_tokens"] is defaults["tree_topk"] is defaults["num_draft_tokens"] is None
    # a device whose sampled default differs (as a GPU's does): a call without a shape decodes each side's
    set_eagle_defaults(monkeypatch, "cpu", sampled=(2, TreeShape(2, 4)))
    for temperature, k in ((0.0, default_draft("cpu", 0.0)[0]), (0.8, 2)):
        values = list(client.submit(prompt="Say a", temperature=temperature, max_new_tokens=4, api_name="/generate"))
        assert values[-1]["stats"]["num_spec_tokens"] == k
    values = list(client.submit(prompt="Say a", temperature=0.8, num_spec_tokens=3, max_new_tokens=4,
                                api_name="/generate"))
    assert values[-1]["stats"]["num_spec_tokens"] == 3  # a shape given is kept


def test_a_shape_parameter_left_out_comes_from_the_devices_fastest_shape_at_the_temperature():
    from demo.config import TreeShape
    from demo.methods import default_draft
    from demo.ui.api import draft_of

    greedy, sampled = default_draft("cuda", 0.0), default_draft("cuda", 1.0)
    assert sampled != greedy and sampled[0] < greedy[0]  # a GPU at T > 0: a shallower tree
    assert default_draft("cpu", 0.0)[1] is not None and default_draft("cpu", 1.0)[1] is None  # a CPU: tree, then chain
    assert all(default_draft("cuda", t) == greedy for t in (None, "1", float("nan"), True, -1.0))  # refused later
    assert draft_of(sampled, None, None, None) == sampled
    assert draft_of(sampled, 3, None, None) == (3, sampled[1])  # a depth given, the tree's width the default's
    assert draft_of(greedy, None, 0, None) == (greedy[0], None)  # tree_topk 0: a chain
    assert draft_of((3, None), None, 4, 8) == (3, TreeShape(4, 8))
    assert draft_of((3, None), 5, None, None) == (5, None)


def test_the_served_probe_answers_every_mode_and_shape_and_counts_a_replys_bytes(client):
    from demo.bench.tools.served import probe

    report = probe(client.src, max_new_tokens=8, long_tokens=16)
    rows = [line for line in report.splitlines() if line.startswith("| eager")]
    assert len(rows) == 6 and all("| yes |" in row for row in rows), report  # a CPU app: eager mode only
    assert "4/4 answered" in report and re.search(r"\(16 tokens, max new tokens 16\): [\d,]+ bytes", report)
