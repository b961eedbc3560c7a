"""ZeroGPU's lifecycle on a GPU (demo/service/zerogpu.py), through a stand-in as faithful as one process
allows (demo.bench.tools.zerogpu.stand_in): a `spaces` package whose GPU decorator gives every weight
new device memory as a call begins (ZeroGPU moves the models onto the GPU it attaches for the call)
and frees the cached memory as it ends. The handler is the page's (Session.generate inside
zerogpu.on_gpu). In every call graph mode captures anew inside the call, says what that cost, gives
eager's tokens, and leaves no buffer or graph behind. What it costs against eager on the default target: python -m demo.bench.tools.zerogpu.

CUDA only (skipped without a CUDA device)."""

import sys

import pytest
import torch

from demo.bench.tools.zerogpu import stand_in
from demo.config import TreeShape
from demo.service import zerogpu
from demo.service.model_cache import Models
from demo.service.request import Request
from demo.service.session import Session
from demo.target import Target
from tests.tiny import tiny_drafter, tiny_target
from tests.tiny_chat import byte_tokenizer

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("k, tree", [(3, None), (4, TreeShape(2, 8))], ids=["chain3", "tree4x2-8"])
def test_graph_mode_captured_inside_each_zerogpu_call_gives_eager_tokens_and_leaves_nothing(monkeypatch, k, tree):
    hf, _ = tiny_target("llama", vocab_size=258, max_position_embeddings=512)
    hf.to("cuda")
    target = Target(hf)
    drafter = tiny_drafter("eagle3", target)
    spaces = stand_in([hf, drafter])
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    session = Session(Models(hf, byte_tokenizer(), {"eagle3": drafter}, name="tiny", target_spec="tiny",
                             max_context=512))
    assert session.cudagraph_unavailable() is None

    def reply(request):
        yield from session.generate(request)

    on_gpu = zerogpu.on_gpu(reply)
    for call in range(2):  # the second call captures anew, over the weights' new memory
        replies = {}
        for mode in ("eager", "cudagraph"):
            request = Request.of("Tell me about the sea.", method="eagle3", mode=mode, max_new_tokens=96,
                                 num_spec_tokens=k, tree=tree, compare=True)
            final = list(on_gpu(request))[-1]
            replies[mode] = [p.token_id for p in final.chat.turns[-1].pieces]
            if mode == "cudagraph":
                assert "CUDA graphs captured for this request in" in final.status, final.status
            assert final.chat.comparison.identical  # and the comparison's runs, in the same call
            assert not any(engine._buffers for engine in list(zerogpu._PER_CALL))  # nothing outlives the call
        assert replies["cudagraph"] == replies["eager"], call
    assert spaces.calls == 4
