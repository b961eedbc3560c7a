"""demo/service/downloads.py: a public app writes a file after every reply; the folder stays bounded."""

import os
from pathlib import Path

import demo.service.downloads as downloads


def _use(tmp_path, monkeypatch):
    monkeypatch.setattr(downloads.tempfile, "gettempdir", lambda: str(tmp_path))


def test_each_download_keeps_its_name_in_a_folder_of_its_own(tmp_path, monkeypatch):
    _use(tmp_path, monkeypatch)
    a, b = (downloads.write_download("trace.json", text) for text in ("one", "two"))
    assert Path(a).name == Path(b).name == "trace.json" and a != b
    assert Path(a).read_text() == "one" and Path(b).read_text() == "two"
    assert Path(a).parent.parent == tmp_path / downloads.FOLDER


def test_the_folder_never_holds_more_than_its_limit_and_drops_the_oldest_first(tmp_path, monkeypatch):
    _use(tmp_path, monkeypatch)
    monkeypatch.setattr(downloads, "KEEP_FILES", 5)
    paths = []
    for i in range(12):
        paths.append(downloads.write_download(f"r{i}.json", str(i), now=1000.0 + i))
        os.utime(Path(paths[-1]).parent, (1000.0 + i, 1000.0 + i))  # mtimes in write order
    left = sorted(p.name for p in (tmp_path / downloads.FOLDER).glob("*/*.json"))
    assert left == sorted(f"r{i}.json" for i in range(7, 12))


def test_downloads_older_than_an_hour_are_removed_by_the_next_write(tmp_path, monkeypatch):
    _use(tmp_path, monkeypatch)
    old = downloads.write_download("old.json", "x")
    os.utime(Path(old).parent, (0, 0))
    new = downloads.write_download("new.json", "y", now=downloads.KEEP_S + 10.0)
    assert not Path(old).exists() and Path(new).exists()
