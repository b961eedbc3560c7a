"""Convert EAGLE-3 checkpoints with speculators' own converter: a script for
tests/models/test_exports.py, run in a subprocess whose PYTHONPATH holds speculators 0.9.0.

    python tests/models/loaders/run_speculators.py CASES.json OUT_DIR

What runs is speculators': Eagle3Converter.convert (convert/eagle/eagle3_converter.py, what
`speculators convert --algorithm eagle3` calls), with its validation (Eagle3Speculator.from_pretrained
of the result). speculators has no forward for that model (its `forward` raises), so the converted
checkpoint is what vLLM serves: the tests load it with vLLM's own loader for logits.

Each case: {"name", "target": HF dir, "drafter": dir, "kwargs": the converter's flags}. OUT_DIR/NAME/
is the converted checkpoint; OUT_DIR/NAME.json lists the input tensors found nowhere in it (thrown
away) and its tensors found nowhere in the input (made up: left at their initialisation), or "error".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from accounting import checkpoint_tensors, run_cases, unfound  # noqa: E402

from speculators.convert.eagle.eagle3_converter import Eagle3Converter  # noqa: E402


def run_case(case: dict, out: Path) -> dict:
    converted = out / case["name"]
    Eagle3Converter().convert(case["drafter"], converted, base_model=case["target"], validate=True,
                              **case.get("kwargs", {}))
    given, made = checkpoint_tensors(case["drafter"]), checkpoint_tensors(converted)
    return {"dropped": unfound(given, made), "made_up": unfound(made, given),
            "config": json.loads((converted / "config.json").read_text())}




if __name__ == "__main__":
    run_cases(run_case, *sys.argv[1:])
