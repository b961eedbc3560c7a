"""Files the page offers for download (a reply's trace, a benchmark's CSV).

They go to one folder of the app's own under the system's temp directory (Gradio serves files from
there), each in a subfolder of its own so that its name stays readable. The chat offers a trace
after every reply, so a public app writes a file per reply: each new file first prunes the folder,
dropping files older than KEEP_S and the oldest beyond KEEP_FILES, so the disk never fills. Gradio's
own copies are pruned by the Blocks' ``delete_cache`` (demo/views.py).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

FOLDER = "speclens-downloads"
KEEP_S = 3600  # a download stays available for an hour
KEEP_FILES = 200  # and at most this many are kept


def download_folder() -> Path:
    folder = Path(tempfile.gettempdir()) / FOLDER
    folder.mkdir(exist_ok=True)
    return folder


def write_download(name: str, text: str, now: float | None = None) -> str:
    """Write `text` as a file called `name` (after pruning the folder); returns its path."""
    folder = download_folder()
    prune(folder, time.time() if now is None else now)
    path = Path(tempfile.mkdtemp(dir=folder)) / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def prune(folder: Path, now: float) -> None:
    """Remove the subfolders older than KEEP_S, then the oldest beyond KEEP_FILES - 1 (room for one more)."""
    entries = []
    for sub in folder.iterdir():
        try:
            entries.append((sub.stat().st_mtime, sub))
        except FileNotFoundError:  # another request pruned it meanwhile
            continue
    entries.sort()
    stale = [sub for mtime, sub in entries if now - mtime > KEEP_S]
    kept = [sub for mtime, sub in entries if now - mtime <= KEEP_S]
    stale += kept[: max(0, len(kept) - (KEEP_FILES - 1))]
    for sub in stale:
        shutil.rmtree(sub, ignore_errors=True)
