"""What the training tests share: a byte-level ChatML tokenizer, tiny random targets and drafters,
a saved tiny target with synthetic chats, and the training CLI run on them. Tiny random models only:
no weights, no GPU. (tests/training has no __init__.py, so that a package named `training` here
cannot shadow the real one: import this as `from tests.training.helpers import ...`.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from demo.target import Target
from tests import tiny
from training.data import Record, ShardWriter, format_conversation

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 258  # 256 bytes + <|im_start|> + <|im_end|>
IM_END = 257


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (ids 0..255) plus <|im_start|> 256 and <|im_end|> 257, ChatML template."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", chat_template=CHATML)


def _byte_of(c: str) -> int:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    return ord(c) if ord(c) in keep else [b for b in range(256) if b not in keep][ord(c) - 256]


def tiny_hf(seed: int = 0, **kw) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                initializer_range=0.2, bos_token_id=None, eos_token_id=IM_END, pad_token_id=None,
                                tie_word_embeddings=True), **kw})
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


def tiny_pair(method: str, vocab: int, device: str = "cpu"):
    """A tiny random target of `vocab` tokens, a random drafter for it (EAGLE-3: a quarter of the
    tokens outside its draft vocabulary; "eagle3-shared": drafting through the target's lm_head;
    "eagle3-hot": through three quarters of its rows, as on a CPU) and three prompts."""
    target = Target(tiny.tiny_hf("llama", seed=5, vocab_size=vocab).to(device))
    if method in ("eagle3-shared", "eagle3-hot"):
        drafter = tiny.tiny_drafter("eagle3", target, own_lm_head=False)
    else:
        drafter = tiny.tiny_drafter(method, target, draft_vocab_size=vocab // 4 * 3 if method == "eagle3" else 0)
    drafter.to(device).share_target(target)
    if method == "eagle3-hot":
        drafter.limit_vocab(torch.randperm(vocab, generator=torch.Generator().manual_seed(3))[: vocab // 4 * 3])
    g = torch.Generator().manual_seed(7)
    return target, drafter, [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in (5, 11, 17)]


def records(ids: list[str], prompts: list[str]) -> list[Record]:
    """ShareGPT records: record i has conversation id ids[i], user turn prompts[i] and a one-letter answer."""
    return [Record(i, rid, [{"role": "user", "content": p}, {"role": "assistant", "content": "a"}])
            for i, (rid, p) in enumerate(zip(ids, prompts))]


def tiny_run_inputs(tmp_path):
    """A saved tiny target (with tokenizer) and a shard directory of synthetic chats."""
    tok = byte_tokenizer()
    hf = tiny_hf(seed=5)
    hf.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    writer = ShardWriter(tmp_path / "data")
    rng = np.random.default_rng(0)
    for _ in range(12):
        msgs = [{"role": "user", "content": "q" * int(rng.integers(1, 30))},
                {"role": "assistant", "content": "".join(rng.choice(list("abcd "), int(rng.integers(5, 80))))}]
        ids, mask = format_conversation(tok, msgs)
        writer.add(ids, mask, -1)  # synthetic: from no ShareGPT record
    writer.flush()
    return tmp_path / "target", tmp_path / "data"


def train_cli(target_dir, data_dir, out, method, *extra, device="cpu") -> dict:
    """`python -m training.train` on tiny_run_inputs at a tiny scale (512-token batches, 3 TTT steps,
    a log row every step); returns the run's log."""
    from training.train import main

    return main(["--method", method, "--target", str(target_dir), "--data", f"regen:{data_dir}", "--out", str(out),
                 "--device", device, "--batch-tokens", "512", "--max-len", "128", "--ttt-steps", "3",
                 "--log-every", "1", "--no-progress", *extra])


cuda = pytest.mark.cuda  # GPU-only tests (tests/conftest.py skips them without CUDA)
