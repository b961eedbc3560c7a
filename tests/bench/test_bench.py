"""The benchmark CLI: losslessness check, report format, JSON records, multi-turn prompts, and
one-line failures. A tiny random target (byte-level tokenizer with a chat template) is saved to a
temporary directory so the CLI loads it exactly as it loads a real one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from demo.bench.tools import cli as bench
from demo.bench import measure
from demo.config import DraftShape, TreeShape
from demo.bench.report import category_rows, format_report, shape_label
from demo.metrics import AcceptanceStats
from demo.service.chat import first_difference

ROOT = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUESTIONS = [
    {"question_id": 7, "category": "math", "turns": ["What is two plus two?", "And times three?"]},
    {"question_id": 8, "category": "writing", "turns": ["Name a colour."]},
    {"question_id": 9, "category": "stem", "turns": ["Why is ice slippery?"]},
]
FAST = ["--max-new-tokens", "12", "--max-context", "256", "--warmup", "0"]


def _tiny_tokenizer():
    """Byte-level tokenizer (256 byte tokens, no merges) plus two chat tokens; <|im_end|> is eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHAT_TEMPLATE)


def _tiny_target_dir(path: Path, hidden_size: int = 64, seed: int = 0, memoryless: bool = False) -> Path:
    """A tiny random Llama saved with its tokenizer. `memoryless`: every layer's output projections
    are zero, so the next token is a fixed function of the current one (see _copy_head_drafter)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tiny_tokenizer()
    # initializer_range 0.2 makes logits peaked, so fp32 rounding never flips an argmax near-tie
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=memoryless,
                      bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if memoryless:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _drafter_dir(path: Path, method: str, target_dir: Path, copy_head: bool = False) -> Path:
    """A random drafter shaped like one layer of the target in target_dir, saved as a checkpoint."""
    from transformers import AutoConfig

    from demo.drafter_common import DrafterConfig
    from demo.drafters import DRAFTER_CLASSES
    from demo.models.checkpoints import save_drafter
    from demo.target import TargetConfig

    torch.manual_seed(1)
    cfg = DrafterConfig.for_target(method, TargetConfig.from_hf(AutoConfig.from_pretrained(target_dir)))
    drafter = DRAFTER_CLASSES[method](cfg)
    if copy_head:
        _copy_head_drafter(drafter)
    save_drafter(drafter, path)
    return path


def _copy_head_drafter(drafter) -> None:
    """Make an EAGLE-1 drafter predict exactly what a memoryless target will: fc passes the token's
    embedding through and the layer adds nothing, so the draft is argmax(lm_head(embed(token))), the
    target's argmax(lm_head(norm(embed(token)))) (an RMSNorm with unit weights only rescales)."""
    H = drafter.cfg.hidden_size
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :H] = torch.eye(H)  # fc input is concat(embedding, feature)
        drafter.layers[0].self_attn.o_proj.weight.zero_()
        drafter.layers[0].mlp.down_proj.weight.zero_()


def _drafter(models, method: str) -> str:
    pytest.importorskip("demo.models.checkpoints")
    path = models["root"] / f"drafter-{method}"
    if not path.exists():
        _drafter_dir(path, method, models["target"])
    return str(path)


def _argv(models, method: str, *extra: str) -> list[str]:
    argv = ["--target", str(models["target"]), "--prompts", str(models["prompts"]), "--method", method, *FAST]
    if method != "none":
        argv += ["--drafter", _drafter(models, method)]
    return argv + list(extra)


# each published layout, written as the hub has it (tests/models/test_checkpoints.py's writers)
LAYOUTS = {
    "eagle1-bin-fp16": ("eagle", "published_eagle", dict(fmt="bin", dtype=torch.float16)),
    "eagle3-bin-fp16": ("eagle3", "published_eagle3", dict(fmt="bin", dtype=torch.float16)),
    "specforge-sharded-bf16": ("eagle3", "specforge", dict(dtype=torch.bfloat16, shards=3)),
    "speculators-safetensors": ("eagle3", "speculators", dict()),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_published_layout_is_accepted_and_lossless(models, layout, capsys):
    from transformers import AutoModelForCausalLM

    from demo.target import Target
    from tests.models import test_checkpoints as ckpt
    from tests.tiny import tiny_drafter

    method, writer, fmt = LAYOUTS[layout]
    target = Target(AutoModelForCausalLM.from_pretrained(models["target"]))
    drafter = tiny_drafter(method, target, draft_vocab_size=64 if method == "eagle3" else 0,
                           **({"aux_layer_ids": (1, 3, 4)} if method == "eagle3" else {}))
    config, tensors = getattr(ckpt, writer)(drafter, target)
    path = ckpt.write(models["root"] / layout, config, tensors, **fmt)
    argv = ["--target", str(models["target"]), "--prompts", str(models["prompts"]), "--method", method,
            "--drafter", str(path), "--check-lossless", "-k", "3", *FAST]
    assert bench.main(argv) == 0
    assert "lossless: identical (3/3 prompts)" in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("method", ["none", "eagle", "eagle3"])
def test_check_lossless_reports_identical_for_every_method(models, method, capsys):
    assert bench.main(_argv(models, method, "--check-lossless", "--num-spec-tokens", "3")) == 0
    out = capsys.readouterr().out
    assert "lossless: identical (3/3 prompts)" in out.splitlines()


def test_lossless_check_holds_when_every_draft_is_accepted(tmp_path, capsys):
    pytest.importorskip("demo.models.checkpoints")
    target = _tiny_target_dir(tmp_path / "target", memoryless=True)
    drafter = _drafter_dir(tmp_path / "drafter", "eagle", target, copy_head=True)
    out_json = tmp_path / "out.json"
    argv = ["--target", str(target), "--method", "eagle", "--drafter", str(drafter), "--prompt", "Say something.",
            "--check-lossless", "--num-spec-tokens", "4", "--json", str(out_json), *FAST,
            "--max-new-tokens", "11"]  # 1 + 2 full steps of 5: no step cut by the budget
    assert bench.main(argv) == 0
    assert "lossless: identical (1/1 prompts)" in capsys.readouterr().out.splitlines()
    summary = json.loads(out_json.read_text())["totals"]["summary"]
    assert summary["acceptance_per_position"] == [1.0] * 4 and summary["mean_acceptance_length"] == 5.0


def test_report_ends_with_acceptance_table_then_speed():
    # 100 verified drafts of k=3: 74 had >= 1 accepted, 54 had >= 2, 41 had all 3 -> AL = 1 + 169/100
    stats = AcceptanceStats(reach=3, num_drafts=100, num_draft_tokens=300, num_accepted_tokens=169,
                            accepted_per_position=[74, 54, 41], num_steps=100, num_generated=270,
                            draft_ms_total=150.0, verify_ms_total=820.0, prefill_ms=40.0, elapsed_s=1.35,
                            steps_after_full=40, first_accepted_after_full=36, steps_after_rejection=58,
                            first_accepted_after_rejection=37)
    config = dict(target="default", target_name="SmolLM2-135M-Instruct", drafter="d", method="eagle3", k=3,
                  mode="eager", compile=False, device="cpu", dtype="float32", gpu=None, max_new_tokens=256,
                  temperature=0.0, warmup=1)
    report = {"records": [], "totals": {"config": config, "num_prompts": 2, "counts": stats.__dict__,
                                        "summary": stats.summary(), "warmup_s": 0.5, "capture_s": 0.0}}
    tail = format_report(report).splitlines()[-9:]
    assert tail == [
        "-" * 50,
        "mean acceptance length: 2.69",
        "-" * 50,
        "acceptance at draft 1: 0.74",
        "acceptance at draft 2: 0.54",
        "acceptance at draft 3: 0.41",
        "acceptance at draft 1 after a full step: 0.90 (40 steps), after a rejected step: 0.64 (58 steps)",
        "tokens/s: 200.0 (270 tokens in 1.35 s of engine time)",
        "propose: 1.50 ms/step, verify: 8.20 ms/step (100 steps; prefill 20.00 ms/prompt)",
    ]


def test_category_rows_count_acceptance_over_each_categorys_drafts():
    def rec(category, drafts, accepted, tokens, seconds):
        return {"category": category, "stats": {"num_drafts": drafts, "num_accepted_tokens": accepted,
                                                "num_generated": tokens, "elapsed_s": seconds}}
    rows = category_rows([rec("math", 10, 20, 31, 1.0), rec("coding", 4, 4, 9, 0.5), rec("math", 30, 20, 51, 1.0)])
    # math: 1 + (20 + 20) / (10 + 30) = 2.0 over both prompts, not the mean of 3.0 and 1.67
    assert rows == [{"category": "coding", "prompts": 1, "generated_tokens": 9, "mean_acceptance_length": 2.0,
                     "tokens_per_s": 18.0},
                    {"category": "math", "prompts": 2, "generated_tokens": 82, "mean_acceptance_length": 2.0,
                     "tokens_per_s": 41.0}]


def test_divergence_report_names_the_first_differing_prompt_and_position():
    records = [{"question_id": 81, "turn": 1, "lossless": {"identical": True, "first_difference": None}},
               {"question_id": 82, "turn": 2, "lossless": {"identical": False, "first_difference": 17}},
               {"question_id": 83, "turn": 1, "lossless": {"identical": False, "first_difference": 3}}]
    stats = AcceptanceStats(reach=0)
    config = dict(target="default", target_name="t", drafter=None, method="none", k=0, mode="eager", compile=False,
                  device="cpu", dtype="float32", gpu=None, max_new_tokens=8, temperature=0.0, warmup=0)
    report = {"records": records, "totals": {"config": config, "num_prompts": 3, "counts": stats.__dict__,
                                             "warmup_s": 0.0, "capture_s": 0.0,
                                             "lossless": measure.lossless_totals(records)}}
    assert ("lossless: diverged (2/3 prompts differ; first: question 82 turn 2 at generated token 17)"
            in format_report(report).splitlines())


def test_printed_table_matches_merged_totals(models, capsys, tmp_path):
    out_json = tmp_path / "out.json"
    assert bench.main(_argv(models, "eagle3", "--num-spec-tokens", "2", "--json", str(out_json))) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads(out_json.read_text())["totals"]["summary"]
    i = lines.index("-" * 50)
    assert lines[i:i + 5] == [
        "-" * 50,
        f"mean acceptance length: {summary['mean_acceptance_length']:.2f}",
        "-" * 50,
        f"acceptance at draft 1: {summary['acceptance_per_position'][0]:.2f}",
        f"acceptance at draft 2: {summary['acceptance_per_position'][1]:.2f}",
    ]
    c = json.loads(out_json.read_text())["totals"]["counts"]
    split = lines[i + 5]  # how acceptance at draft 1 depends on where the step starts
    assert split.startswith("acceptance at draft 1 after a full step: ")
    assert f"({c['steps_after_full']} steps), after a rejected step: " in split
    assert split.endswith(f"({c['steps_after_rejection']} steps)")
    prompts = json.loads(out_json.read_text())["totals"]["num_prompts"]  # each one's first step follows none
    assert c["steps_after_full"] + c["steps_after_rejection"] == c["num_drafts"] - prompts
    assert lines[i + 6].startswith("tokens/s: ") and lines[i + 7].startswith("propose: ")


def test_json_holds_per_prompt_records_and_totals(models, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    argv = _argv(models, "eagle", "-k", "3", "--check-lossless", "--num-prompts", "2", "--warmup", "1", "--json",
                 str(out_json))
    assert bench.main(argv) == 0
    report = json.loads(out_json.read_text())
    records, totals = report["records"], report["totals"]
    assert [(r["question_id"], r["category"], r["turn"]) for r in records] == [(7, "math", 1), (8, "writing", 1)]
    for r in records:
        assert r["prompt_tokens"] > 0 and 1 <= r["generated_tokens"] <= 12 and isinstance(r["text"], str)
        assert r["stats"]["num_generated"] == r["generated_tokens"]
        assert r["lossless"] == {"identical": True, "first_difference": None,
                                 "target_only_tokens": r["generated_tokens"]}
    # totals are the per-prompt stats merged
    assert totals["summary"]["num_generated"] == sum(r["generated_tokens"] for r in records)
    assert totals["summary"]["num_drafts"] == sum(r["stats"]["num_drafts"] for r in records)
    assert totals["lossless"] == {"identical": 2, "total": 2, "first_divergence": None,
                                  "target_only_width": 1}  # fp32: the reference runs 1 row wide
    config = totals["config"]
    assert {k: config[k] for k in ("method", "k", "mode", "compile", "device", "dtype", "gpu")} == dict(
        method="eagle", k=3, mode="eager", compile=False, device="cpu", dtype="float32", gpu=None)
    assert config["target"] == str(models["target"]) and config["drafter"].endswith("drafter-eagle")
    assert config["torch"] == torch.__version__ and config["transformers"]
    from demo.drafter_common import drafter_dtype  # --drafter-dtype auto: bf16 where this CPU multiplies it natively

    assert config["drafter_dtype"] == str(drafter_dtype(torch.float32, "cpu")).removeprefix("torch.")
    assert totals["warmup_s"] > 0


def test_all_turns_continue_with_the_models_own_answer(models, tmp_path, capsys):
    from transformers import AutoTokenizer

    from demo.models.prompts import chat_ids

    out_json = tmp_path / "out.json"
    assert bench.main(_argv(models, "none", "--all-turns", "--num-prompts", "1", "--json", str(out_json))) == 0
    first, second = json.loads(out_json.read_text())["records"]
    assert (first["turn"], second["turn"]) == (1, 2)
    # the second prompt is the whole conversation: question 1, the model's answer, question 2
    tok = AutoTokenizer.from_pretrained(models["target"])
    q = QUESTIONS[0]["turns"]
    conversation = [{"role": "user", "content": q[0]}, {"role": "assistant", "content": first["text"]},
                    {"role": "user", "content": q[1]}]
    assert second["prompt_tokens"] == len(chat_ids(tok, conversation))
    assert "lossless" not in first  # not asked for


def test_first_turn_only_by_default(models, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    assert bench.main(_argv(models, "none", "--json", str(out_json))) == 0
    assert [r["turn"] for r in json.loads(out_json.read_text())["records"]] == [1, 1, 1]


def test_mismatched_drafter_exits_with_one_line_reason_naming_the_size(models, tmp_path, capsys):
    pytest.importorskip("demo.models.checkpoints")
    other_target = _tiny_target_dir(tmp_path / "wide-target", hidden_size=96)
    drafter = _drafter_dir(tmp_path / "wide-drafter", "eagle", other_target)
    argv = ["--target", str(models["target"]), "--method", "eagle", "--drafter", str(drafter), *FAST]
    capsys.readouterr()  # drop what saving the models printed
    assert bench.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "96" in err and "64" in err


@pytest.mark.parametrize("config, field", [([], "config.json:"), ({"architectures": ["LlamaForCausalLM"],
                                                                    "hidden_size": 64, "num_attention_heads": 0},
                                                                   "num_attention_heads:")])
def test_a_malformed_drafter_config_exits_with_one_line_naming_the_field(models, tmp_path, capsys, config, field):
    drafter = tmp_path / "bad-drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps(config))
    save_file({"fc.weight": torch.zeros(64, 128)}, str(drafter / "model.safetensors"))
    argv = ["--target", str(models["target"]), "--method", "eagle", "--drafter", str(drafter), *FAST]
    assert bench.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {field}"), err


@pytest.mark.parametrize("argv", [
    ["--num-spec-tokens", "0"],
    ["--method", "medusa"],
    ["--temperature", "0.7", "--check-lossless"],
    ["--temperature", "-1"],
    ["--top-p", "0"],
    ["--compile"],  # compile only applies to captured graphs
    ["--prompt", "hi", "--prompts", "q.jsonl"],
    ["--method", "none", "--drafter", "somewhere"],
    ["--target", "owner/model", "--method", "eagle"],  # no bundled drafter for another target
    ["--num-prompts", "0"],
    ["--mode", "graph"],
])
def test_bad_arguments_exit_nonzero(argv, capsys):
    assert bench.main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_compile_defaults_to_the_drafter_scope_and_target_only_needs_all(capsys):
    args = bench.parse_args(["--mode", "cudagraph", "--compile"])
    assert args.compile == "drafter"  # as in the vLLM change: verification keeps eager's numerics
    assert bench.parse_args(["--mode", "cudagraph", "--compile", "all"]).compile == "all"
    assert bench.parse_args(["--method", "none", "--mode", "cudagraph", "--compile", "all"]).compile == "all"
    with pytest.raises(SystemExit):
        bench.parse_args(["--method", "none", "--mode", "cudagraph", "--compile"])
    assert "--compile all" in capsys.readouterr().err


def test_lossless_check_at_temperature_refused_with_a_reason(capsys):
    assert bench.main(["--temperature", "0.8", "--check-lossless"]) != 0
    assert "--check-lossless" in capsys.readouterr().err


@pytest.mark.parametrize("extra,reason", [
    (["--prompts", "no-such-file.jsonl"], "does not exist"),
    (["--target", "no-such-dir", "--method", "none"], "no-such-dir"),
])
def test_unloadable_inputs_exit_with_one_line_reason(models, extra, reason, capsys):
    argv = ["--target", str(models["target"]), "--method", "none", "--prompts", str(models["prompts"]), *FAST, *extra]
    assert bench.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and reason in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cudagraph_without_cuda_exits_with_clear_message(models):
    cmd = [sys.executable, "-m", "demo.bench", "--target", str(models["target"]), "--method", "none",
           "--mode", "cudagraph", *FAST]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: --mode cudagraph needs a CUDA device, but this machine has no CUDA "
                                   "device (use --mode eager)")


def test_first_difference_finds_the_first_differing_position():
    assert first_difference([5, 6, 7], [5, 6, 7]) is None
    assert first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert first_difference([5, 6], [5, 6, 7]) == 2  # one stopped early: they differ at index 2


def test_drafter_dtype_int8_quantizes_the_layer_and_head_and_int8_head_the_head_alone():
    assert bench.parse_args(["--drafter-dtype", "int8"]).drafter_dtype == "int8"
    cpu = type("T", (), {"dtype": torch.float32, "device": torch.device("cpu")})()
    gpu = type("T", (), {"dtype": torch.bfloat16, "device": torch.device("cuda")})()
    assert measure.chosen_drafter_int8("int8", cpu) is True and measure.chosen_drafter_int8("int8-head", cpu) == "head"
    assert measure.chosen_drafter_int8("float32", cpu) is False and measure.chosen_drafter_int8("auto", gpu) is False
    assert measure.chosen_drafter_dtype("int8", cpu) == measure.chosen_drafter_dtype("int8-head", cpu) == torch.float32
    drafter = type("D", (), {"layer_in_int8": True, "head_in_int8": True})()
    assert measure.int8_label(drafter) == ", layer and head int8"
    drafter.layer_in_int8 = False
    assert measure.int8_label(drafter) == ", head int8"
    oracle = type("O", (), {"layer_in_int8": False, "head_in_int8": False})()  # no weights of its own
    assert measure.int8_label(oracle) == ""


@pytest.mark.parametrize("tree, rule, want", [
    (None, "wor", "k=3, drafts sampled from q without replacement"),  # runs as a tree of top-1: still a chain
    (None, "pointmass", "k=3"),
    (TreeShape(2, 6), "wor", "tree depth 3 x top-2, 6 tokens verified per step, drafts sampled from q without "
                             "replacement")])
def test_a_report_names_a_sampled_chain_a_chain_and_a_tree_by_its_shape(tree, rule, want):
    from dataclasses import asdict

    shape = DraftShape.drawn(3, tree, rule, temperature=1.0)
    assert shape_label({"k": 3, "shape": asdict(shape)}) == want
