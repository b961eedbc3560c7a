"""What a prompt-lookup branch would add to a draft at T = 0, estimated by replaying recorded steps.

A prompt-lookup draft (prompt lookup decoding; vLLM's n-gram proposer) copies what
followed the latest earlier occurrence of the text's last few tokens. Beside the drafter's tree it
costs no drafter pass, so it can reach past the tree's depth where the text repeats itself (lists,
code, a small target's loops). This tool estimates it from one greedy run, for every branch length
at once; the engine drafts the branch itself with `--lookup` (``TreeShape.lookup``), which
``python -m demo.bench.sweep`` measures. The estimate:

    python -m demo.bench.lookup --branch 10 --branch 16 --branch 24 \
        --device cpu --hot-tokens off -k 7 --tree-topk 8 --num-draft-tokens 64 --max-new-tokens 256 \
        --prompts assets/prompts/categories.jsonl

It decodes every prompt's first turn with the bench's flags (greedy), records each step's start and
accepted drafts, then replays the same text with a branch of each length verified beside the
drafter's draft: a step accepts the longer of the two. Where a replayed step starts at a position
no recorded step started at, the drafter is credited only with the rest of the recorded run that
covers it (what the recorded step had already drafted past that position), never more, so the gain
is a conservative estimate of a branch grafted onto the tree. The text is the target's greedy text
either way: a branch changes how many forwards it takes, not what it says.
"""

from __future__ import annotations

import argparse
import sys
from bisect import bisect_right
from dataclasses import dataclass

from demo.config import LOOKUP_NGRAM


def continuation(context: list[int], length: int, max_ngram: int = LOOKUP_NGRAM) -> list[int]:
    """The `length` tokens a prompt lookup drafts after `context`: find the latest earlier occurrence
    of its longest suffix of at most max_ngram tokens, and copy what followed it; where the copy
    reaches the end of the context it goes on as the repeat it is (the span from the occurrence to
    the end, again). [] when no suffix occurred before."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for end in range(len(context) - 2, n - 2, -1):  # end of an earlier occurrence, before the last token
            if context[end - n + 1:end + 1] == suffix:
                start, period = end + 1, len(context) - end - 1
                return [context[start + t % period] for t in range(length)]
    return []


@dataclass(frozen=True)
class Recorded:
    """One decoded reply: its prompt, its tokens, and each decoding step after the prefill as
    (index in `tokens` of the step's first emitted token, drafts accepted)."""

    prompt: list[int]
    tokens: list[int]
    steps: list[tuple[int, int]]


def replay(r: Recorded, branch: int, max_ngram: int = LOOKUP_NGRAM) -> tuple[int, int]:
    """(accepted drafts, decoding steps) to emit r.tokens again with a lookup branch of `branch`
    tokens beside the drafter's draft (0: the drafter alone, which reproduces the record)."""
    starts = [s for s, _ in r.steps]
    accepted = [a for _, a in r.steps]
    text = r.prompt + r.tokens
    end, p = len(r.tokens), (starts[0] if starts else len(r.tokens))
    total = steps = 0
    while p < end:
        i = bisect_right(starts, p) - 1
        drafter = accepted[i] if starts[i] == p else max(0, starts[i] + accepted[i] - p)
        copied = 0
        if branch:
            for guess, token in zip(continuation(text[:len(r.prompt) + p], branch, max_ngram), r.tokens[p:]):
                if guess != token:
                    break
                copied += 1
        a = min(max(drafter, copied), end - p)  # drafts past the end of the reply are not counted
        total += a
        steps += 1
        p += min(a + 1, end - p)
    return total, steps


def mean_acceptance(records: list[Recorded], branch: int, max_ngram: int = LOOKUP_NGRAM) -> float:
    """1 + accepted drafts / decoding steps over every record (AcceptanceStats' definition)."""
    accepted = steps = 0
    for r in records:
        a, s = replay(r, branch, max_ngram)
        accepted, steps = accepted + a, steps + s
    return 1.0 + accepted / steps if steps else 1.0


def record(engine, tokenizer, questions: list[dict], gen) -> list[Recorded]:
    """Decode each question's first turn and keep its steps."""
    from demo.models.prompts import chat_ids

    out = []
    for q in questions:
        ids = chat_ids(tokenizer, [{"role": "user", "content": q["turns"][0]}])
        tokens, steps = [], []
        for event in engine.generate(ids, gen):
            if event.step:
                steps.append((len(tokens), event.num_accepted))
            tokens += event.token_ids
        out.append(Recorded(ids, tokens, steps))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.bench.lookup", description=__doc__.split("\n\n")[0],
                                add_help=False)
    p.add_argument("--branch", type=int, action="append", default=[], metavar="N",
                   help="a lookup branch of N tokens (repeatable)")
    p.add_argument("--max-ngram", type=int, default=LOOKUP_NGRAM, help="the longest suffix looked up")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE", help="a prompt set (repeatable)")
    own, rest = p.parse_known_args(argv)
    if {"-h", "--help"} & set(rest):
        p.print_help()
        print("\nEvery other flag is the bench's:")
    if any(n < 1 for n in own.branch) or own.max_ngram < 1:
        print("error: --branch and --max-ngram must be at least 1", file=sys.stderr)
        return 2
    from demo.bench.tools.cli import parse
    from demo.bench.measure import build_engine, load_questions

    try:
        config, _ = parse(rest)
    except SystemExit as e:  # argparse has printed its usage and reason
        return int(e.code or 0)
    if config.temperature > 0:
        print("error: a lookup branch is measured at T = 0 (greedy text)", file=sys.stderr)
        return 2
    engine = tokenizer = None
    print("| prompts | drafts | mean acceptance length | against the drafts alone |")
    print("|---|---|---|---|")
    for path in own.prompts or [None]:
        cfg = parse(rest + (["--prompts", path] if path else []))[0]
        if engine is None:
            engine, tokenizer = build_engine(cfg)
        records = record(engine, tokenizer, load_questions(cfg), cfg.generation())
        alone = mean_acceptance(records, 0)
        print(f"| {path or 'default'} ({len(records)}) | {cfg.drafts_label} | {alone:.3f} | |")
        for n in own.branch:
            m = mean_acceptance(records, n, own.max_ngram)
            print(f"| | + lookup branch of {n} | {m:.3f} | {100 * (m / alone - 1):+.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
