"""The Hugging Face hub, looked at before anything large is downloaded: a repository's files with
their sizes at one commit, then single files fetched from that commit. Callers choose the files a
checkpoint needs and refuse a repository whose weights pass their limit before fetching any.

Every failure is a ``HubError`` with a one-line message; it names the repository as the user gave
it, never the local cache path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HUB_ID = r"[\w.-]+/[\w.-]+"  # owner/name
MAX_JSON_BYTES = 16_000_000  # config.json, an index, hot_tokens.json: an index of 100k tensors is a few MB


class HubError(ValueError):
    """A repository could not be listed, or one of its files fetched or read; one line."""


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


@dataclass
class HubRepo:
    """One repository at one commit: what it holds (top-level file name -> bytes) and a fetch per file."""

    repo_id: str
    revision: str  # the commit that was listed; every file is fetched from it
    sizes: dict[str, int | None]

    @classmethod
    def open(cls, repo_id: str) -> "HubRepo":
        """List the repository's files with their sizes (one API call, nothing downloaded)."""
        import huggingface_hub

        try:
            info = huggingface_hub.model_info(repo_id, files_metadata=True)
        except Exception as e:  # offline, unknown repo, gated repo, no token, a malformed id: all end here
            raise HubError(f"could not be listed on the Hugging Face hub ({type(e).__name__}: {_first_line(e)}); "
                           f"check the network (HF_HUB_OFFLINE must be unset) and run `huggingface-cli login` "
                           f"for gated repos") from None
        sizes = {s.rfilename: s.size for s in info.siblings or () if "/" not in s.rfilename}  # no subfolders
        return cls(repo_id, info.sha, sizes)

    def total_bytes(self, names: list[str]) -> int:
        unknown = [n for n in names if self.sizes.get(n) is None]
        if unknown:
            raise HubError(f"{unknown[0]}: the hub lists no size for it in {self.repo_id!r}, so it is not fetched")
        return sum(self.sizes[n] for n in names)

    def fetch(self, name: str, max_bytes: int | None = MAX_JSON_BYTES) -> Path:
        """Download one file (or find it in the hub cache); refused first when over `max_bytes`."""
        import huggingface_hub

        if name not in self.sizes:
            raise HubError(f"{name}: missing from {self.repo_id!r}")
        if max_bytes is not None and self.total_bytes([name]) > max_bytes:
            raise HubError(f"{name}: {self.sizes[name]} bytes in {self.repo_id!r}, over the {max_bytes} this "
                           f"file may have")
        try:
            return Path(huggingface_hub.hf_hub_download(self.repo_id, name, revision=self.revision))
        except Exception as e:
            raise HubError(f"{name}: could not be fetched from {self.repo_id!r} "
                           f"({type(e).__name__}: {_first_line(e)})") from None

    def read_json(self, name: str):
        """A small JSON file of the repository, parsed."""
        try:
            return json.loads(self.fetch(name).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HubError(f"{name}: not valid JSON in {self.repo_id!r} ({_first_line(e)})") from None


def cached_snapshot(repo_id: str) -> Path | None:
    """The hub cache's snapshot of a repository fetched before (nothing is downloaded), or None."""
    import huggingface_hub

    try:
        path = Path(huggingface_hub.snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached, or no hub at all
        return None
    return path if (path / "config.json").is_file() else None


def _first_line(e: Exception) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:200] if s else type(e).__name__
