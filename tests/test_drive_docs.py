"""Google Docs on a Drive mount (issue 28, item 2), against the Drive emulator, which refuses
exports over 10 MB as Drive does (403 exportSizeLimitExceeded): one big Doc must not break its
folder's listing, and listing many Docs must not export them again and again."""

from __future__ import annotations

import os
import time

import pytest

from conftest import mounted
import drive_seed as ds
from test_gdrive import DOC, args, drive_env, folder  # noqa: F401 (a fixture)


def test_big_doc_does_not_break_the_folder(folder, tmp_path):
    ds.control("seed", {"name": "Huge", "parent": folder, "mimeType": DOC, "content_size": 11 * 1024 * 1024})
    ds.control("seed", {"name": "Notes", "parent": folder, "mimeType": DOC, "content": "PK small doc"})
    ds.control("seed", {"name": "plain.txt", "parent": folder, "content": "plain bytes"})
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        # The Doc Drive will not export is left out; the rest lists and reads.
        assert sorted(os.listdir(mp)) == ["Notes.docx", "plain.txt"]
        assert open(os.path.join(mp, "plain.txt"), "rb").read() == b"plain bytes"
        assert open(os.path.join(mp, "Notes.docx"), "rb").read() == b"PK small doc"
        with pytest.raises(OSError):
            open(os.path.join(mp, "Huge.docx"), "rb").read()
        assert sorted(os.listdir(mp)) == ["Notes.docx", "plain.txt"]


def test_many_docs_are_exported_once_per_version(folder, tmp_path):
    for i in range(10):
        ds.control("seed", {"name": f"doc{i}", "parent": folder, "mimeType": DOC, "content": f"PK doc {i}"})
    before = ds.control("stats").get("exports", 0)
    with mounted(args(folder, "--metadata-ttl", "0.2"), env=drive_env(tmp_path)) as mp:
        names = sorted(os.listdir(mp))
        assert names == [f"doc{i}.docx" for i in range(10)]
        assert ds.control("stats").get("exports", 0) - before == 10
        for _ in range(3):
            time.sleep(0.3)
            assert sorted(os.listdir(mp)) == names
            assert [os.stat(os.path.join(mp, n)).st_size for n in names] == [len(f"PK doc {i}") for i in range(10)]
        assert ds.control("stats").get("exports", 0) - before == 10  # sizes are remembered
        for i, n in enumerate(names):
            assert open(os.path.join(mp, n), "rb").read() == f"PK doc {i}".encode()
