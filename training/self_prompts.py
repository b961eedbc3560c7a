"""Prompts the target writes itself: more and more varied training prompts without a dataset.

An instruction-tuned model that is given its chat template up to where a user's text begins
(the system turn and ``<|im_start|>user\\n``) writes a user's turn: a question or a task of the
kind it was tuned to answer (Magpie's observation, Xu et al. 2024). Sampled many times at T = 1
that is a prompt set as varied as the target's own idea of its users, in any number, on a machine
with no dataset and no network; the target's answers to them (``training.data regen``) are then
training data like its answers to ShareGPT's prompts.

A sampled turn is kept when it ended at the stop token (a turn cut at --max-new-tokens is not a
whole question), has at least --min-chars characters once stripped, was not kept before (compared
case- and whitespace-folded) and is none of the validation prompts: the ShareGPT hold-out
(--holdout, an exported prompt directory) and every turn of the question files given with
--exclude-questions (the project's bundled question sets: the caller names them, as this
pipeline never reads a validation set otherwise). Kept turns are written as single-turn
chat prompts, the format of ``training.data prompts``, so ``regen --prompts`` answers them as it is;
their source index is -1 (from no ShareGPT record) and their meta records the hold-out's fingerprint.

    python -m training.self_prompts --out artifacts/self-prompts --num 120000 --cuda-graph \\
        --holdout artifacts/prompts/holdout --exclude-questions QUESTION_FILES...
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from training.data import ShardWriter, dtype_label, load_shards, prompt_ids, read_meta, write_meta

SENTINEL = "\x00user text\x00"


def around_user_text(tokenizer) -> tuple[str, str]:
    """(head, tail): a single user turn as the chat template renders it is head + text + tail."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False,
                                         add_generation_prompt=True)
    if text.count(SENTINEL) != 1:
        raise ValueError("the chat template does not place the user's text verbatim, once")
    head, tail = text.split(SENTINEL)
    return head, tail


def pre_query_ids(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a single user turn's text begins."""
    return [int(i) for i in tokenizer(around_user_text(tokenizer)[0], add_special_tokens=False)["input_ids"]]


def fold(text: str) -> str:
    """What two prompts that are the same question share: case and whitespace folded."""
    return " ".join(text.split()).casefold()


@dataclass
class Tally:
    """What happened to every sampled turn."""

    sampled: int = 0
    kept: int = 0
    unfinished: int = 0  # cut at --max-new-tokens
    short: int = 0  # fewer than --min-chars characters
    repeated: int = 0  # a turn kept before
    excluded: int = 0  # a validation prompt


class PromptFilter:
    """Decides which sampled user turns become prompts (see the module docstring)."""

    def __init__(self, stop_ids: tuple[int, ...], min_chars: int, excluded: set[str]):
        self.stop_ids, self.min_chars = set(stop_ids), min_chars
        self.excluded = {fold(t) for t in excluded}
        self.seen: set[str] = set()
        self.tally = Tally()

    def take(self, tokenizer, generated: list[int]) -> str | None:
        """The user text to keep from one sampled turn (ids ending at the stop token when one was
        generated), or None."""
        self.tally.sampled += 1
        if not generated or generated[-1] not in self.stop_ids:
            self.tally.unfinished += 1
            return None
        text = tokenizer.decode(generated[:-1], skip_special_tokens=True).strip()
        key = fold(text)
        if len(text) < self.min_chars:
            self.tally.short += 1
        elif key in self.excluded:
            self.tally.excluded += 1
        elif key in self.seen:
            self.tally.repeated += 1
        else:
            self.seen.add(key)
            self.tally.kept += 1
            return text
        return None


def excluded_texts(tokenizer, holdout: str | Path | None, question_files: list[str]) -> tuple[set[str], str | None]:
    """(texts no kept prompt may equal, the hold-out's fingerprint): the user text of every prompt
    in an exported hold-out directory and every turn of the question files."""
    texts: set[str] = set()
    fingerprint = None
    if holdout is not None:
        data = load_shards(holdout)
        fingerprint = read_meta(holdout).get("holdout_fingerprint")
        around = around_user_text(tokenizer)
        for i in range(len(data)):
            texts.add(user_text(around, tokenizer.decode(data.get(i)[0].tolist(), skip_special_tokens=False)))
    for path in question_files:
        from demo.models.prompts import read_questions

        for row in read_questions(path):
            texts.update(str(t) for t in row["turns"])
    return texts, fingerprint


def user_text(around: tuple[str, str], rendered: str) -> str:
    """The user's text of a rendered single-turn prompt (the inverse of prompt_ids); `around` is
    around_user_text's (head, tail)."""
    head, tail = around
    if not (rendered.startswith(head) and rendered.endswith(tail)):
        raise ValueError("a hold-out prompt that is not a single user turn of this chat template")
    return rendered[len(head): len(rendered) - len(tail)]


def write_self_prompts(target, tokenizer, out_dir: str | Path, *, num: int, batch_size: int, max_new_tokens: int,
                       temperature: float, seed: int, min_chars: int, cuda_graph: bool, excluded: set[str],
                       fingerprint: str | None, time_budget_min: float | None = None) -> dict:
    """Sample `num` user turns from the target and write the kept ones as prompt shards under
    out_dir (which must hold none yet); returns the run's record, also in out_dir/meta.json."""
    import torch

    from training.generate import BatchGenConfig, BatchGenerator

    if temperature <= 0:
        raise ValueError("self-prompts are sampled: a temperature > 0 (greedy would write one prompt)")
    writer = ShardWriter(out_dir)
    if writer.next_part:
        raise FileExistsError(f"{out_dir} already holds shards")
    t0 = time.perf_counter()
    deadline = None if time_budget_min is None else t0 + 60 * time_budget_min
    torch.manual_seed(seed)
    pre = pre_query_ids(tokenizer)
    gen = BatchGenerator(target, target.eos_token_ids, BatchGenConfig(
        batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, cuda_graph=cuda_graph))
    keep = PromptFilter(gen.stop_ids_list, min_chars, excluded)
    sampled_tokens = 0
    for _, turn in gen.generate([pre] * num, should_stop=(lambda: time.perf_counter() > deadline) if deadline else None):
        sampled_tokens += len(turn)
        text = keep.take(tokenizer, turn)
        if text is not None:
            ids = prompt_ids(tokenizer, text)
            writer.add(ids, [0] * len(ids), -1)
    writer.flush()
    seconds = time.perf_counter() - t0
    run = {**asdict(keep.tally), "asked": num, "sampled_tokens": sampled_tokens,
           "tokens_per_s": round(sampled_tokens / max(seconds, 1e-9)), "seconds": round(seconds, 1),
           "temperature": temperature, "seed": seed, "max_new_tokens": max_new_tokens, "min_chars": min_chars,
           "excluded_texts": len(excluded), "cuda_graph": gen.uses_graphs, "device": str(target.device),
           "dtype": dtype_label(target.dtype)}
    write_meta(out_dir, {"recipe": "prompts-train-self", "sequences": writer.written,
                         "holdout_fingerprint": fingerprint, "runs": [run]})
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.self_prompts", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="default")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num", type=int, default=100_000, help="user turns to sample (fewer are kept)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=160, help="a turn cut here is dropped")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-chars", type=int, default=12)
    p.add_argument("--holdout", default=None, metavar="DIR",
                   help="the exported hold-out prompts (OUT/holdout of `training.data prompts`): never written, "
                        "and their fingerprint is recorded")
    p.add_argument("--exclude-questions", nargs="*", default=[], metavar="FILE",
                   help="question files (MT-bench format) none of whose turns may be written")
    p.add_argument("--cuda-graph", action="store_true", help="replay the decode step from a CUDA graph")
    p.add_argument("--time-budget-min", type=float, default=None, help="stop sampling after this long")
    args = p.parse_args(argv)

    from demo.models.loading import load_target
    from demo.target import Target

    hf, tok = load_target(args.target, args.device, args.dtype)
    excluded, fingerprint = excluded_texts(tok, args.holdout, args.exclude_questions)
    run = write_self_prompts(Target(hf), tok, args.out, num=args.num, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                             min_chars=args.min_chars, cuda_graph=args.cuda_graph, excluded=excluded,
                             fingerprint=fingerprint, time_budget_min=args.time_budget_min)
    print(json.dumps(run, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
