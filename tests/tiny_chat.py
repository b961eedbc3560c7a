"""A tiny chat model for app tests: a byte-level tokenizer with a chat template, a tiny random
target and drafters, wrapped in a Session. No downloads, no weights, no GPU.

    session = tiny_session()                    # random target: drafts are mostly rejected
    session = tiny_session(predictable=True)    # every next token is "a": every EAGLE draft is accepted

One token per byte (so multi-byte characters span several tokens); ids are shifted so that id 0 is
"a" (a zeroed lm_head makes every logit equal, and argmax then picks id 0).
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from demo.service.model_cache import Models
from demo.service.session import Session
from demo.target import Target
from tests.tiny import tiny_drafter, tiny_target

SPECIALS = ("<|im_start|>", "<|im_end|>")
SHIFT = ord("a")  # id i <-> byte (i + SHIFT) % 256
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def byte_tokenizer():
    """One token per UTF-8 byte plus two specials (ids 256, 257); ChatML-like chat template."""
    table = _bytes_to_unicode()
    vocab = {table[(i + SHIFT) % 256]: i for i in range(256)}
    vocab.update({s: 256 + j for j, s in enumerate(SPECIALS)})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=SPECIALS[1])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_session(*, predictable: bool = False, max_context: int = 512, name: str = "tiny",
                 dtype: torch.dtype = torch.float32) -> Session:
    """A Session over a tiny random Llama (vocabulary 258) with random EAGLE and EAGLE-3 drafters.
    With `predictable`, the target's lm_head is zero: it always emits id 0 ("a"), and EAGLE-1,
    which shares that lm_head, always drafts it."""
    hf, target = tiny_target("llama", vocab_size=258, max_position_embeddings=max_context)
    if dtype != torch.float32:
        hf.to(dtype)
        target = Target(hf)
    if predictable:
        with torch.no_grad():
            hf.lm_head.weight.zero_()
    drafters = {m: tiny_drafter(m, target) for m in ("eagle", "eagle3")}
    return Session(Models(hf, byte_tokenizer(), drafters, name=name, target_spec=name, max_context=max_context))


def feature_session(prompt: str = "Say a", max_new_tokens: int = 32, max_context: int = 512) -> Session:
    """A Session over a tiny random Llama whose EAGLE drafter is a FeatureOracle (tests/tiny.py) along
    the target's greedy answer to `prompt`: it drafts from the target's features, so that answer's
    drafts pass (but every 4th) while the features are fresh, and few pass from stale ones."""
    from demo.engine import Engine
    from demo.models.prompts import chat_ids
    from tests.tiny import FeatureOracle, run

    hf, target = tiny_target("llama", vocab_size=258, max_position_embeddings=max_context)
    tok = byte_tokenizer()
    ids = chat_ids(tok, [{"role": "user", "content": prompt}])
    answer, _ = run(Engine(target, None, max_context=max_context), ids, max_new_tokens=max_new_tokens,
                    stop_token_ids=())
    oracle = FeatureOracle(target, ids + answer, every=4)
    return Session(Models(hf, tok, {"eagle": oracle}, name="tiny", target_spec="tiny", max_context=max_context))
