"""Google Docs on a Drive mount (issue 28, item 2), against the Drive emulator, which refuses
exports over 10 MB as Drive does (403 exportSizeLimitExceeded): a listing never exports (a Doc
not opened yet shows size 0, as rclone shows it), one big Doc must not break its folder, and a
Doc is exported once per version, when it is opened."""

from __future__ import annotations

import os
import time

import pytest

from conftest import mounted, run_cli
import drive_seed as ds
import test_gdrive
from test_gdrive import DOC, args, drive_env

folder = test_gdrive.folder  # a fixture


def test_big_doc_does_not_break_the_folder(folder, tmp_path):
    ds.control("seed", {"name": "Huge", "parent": folder, "mimeType": DOC, "content_size": 11 * 1024 * 1024})
    ds.control("seed", {"name": "Notes", "parent": folder, "mimeType": DOC, "content": "PK small doc"})
    ds.control("seed", {"name": "plain.txt", "parent": folder, "content": "plain bytes"})
    with mounted(args(folder), env=drive_env(tmp_path)) as mp:
        # Every name lists; the Doc Drive will not export fails only when it is read.
        names = ["Huge.docx", "Notes.docx", "plain.txt"]
        assert sorted(os.listdir(mp)) == names
        assert open(os.path.join(mp, "plain.txt"), "rb").read() == b"plain bytes"
        assert open(os.path.join(mp, "Notes.docx"), "rb").read() == b"PK small doc"
        with pytest.raises(PermissionError):
            open(os.path.join(mp, "Huge.docx"), "rb").read()
        assert sorted(os.listdir(mp)) == names
        assert os.stat(os.path.join(mp, "Huge.docx")).st_size == 0


def test_docs_are_exported_on_open_once_per_version(folder, tmp_path):
    for i in range(10):
        ds.control("seed", {"name": f"doc{i}", "parent": folder, "mimeType": DOC, "content": f"PK doc {i}"})
    before = ds.control("stats").get("exports", 0)
    with mounted(args(folder, "--metadata-ttl", "0.2"), env=drive_env(tmp_path)) as mp:
        names = sorted(os.listdir(mp))
        assert names == [f"doc{i}.docx" for i in range(10)]
        paths = [os.path.join(mp, n) for n in names]
        # A listing (and a stat from it) exports nothing: sizes are not known yet.
        assert [os.stat(p).st_size for p in paths] == [0] * 10
        assert ds.control("stats").get("exports", 0) - before == 0
        # Opening exports: whole bytes although the kernel was told size 0, and the real
        # size shows at once after.
        for i, p in enumerate(paths[:5]):
            assert open(p, "rb").read() == f"PK doc {i}".encode()
            assert os.stat(p).st_size == len(f"PK doc {i}")
        assert ds.control("stats").get("exports", 0) - before == 5
        for _ in range(3):
            time.sleep(0.3)
            assert sorted(os.listdir(mp)) == names
            sizes = [os.stat(p).st_size for p in paths]
            assert sizes == [len(f"PK doc {i}") for i in range(5)] + [0] * 5  # remembered per version
        for i, p in enumerate(paths):
            assert open(p, "rb").read() == f"PK doc {i}".encode()
            with open(p, "rb") as f:  # ranged reads of an export
                f.seek(3)
                assert f.read(3) == f"PK doc {i}".encode()[3:6]
        assert ds.control("stats").get("exports", 0) - before == 10


def test_cp_of_a_folder_exports_its_docs_whole(folder, tmp_path):
    ds.control("seed", {"name": "Notes", "parent": folder, "mimeType": DOC, "content": "PK exported by cp"})
    ds.control("seed", {"name": "plain.txt", "parent": folder, "content": "plain"})
    out = tmp_path / "out"
    p = run_cli(["cp", "-r", f"gdrive://{folder}", str(out), "--endpoint", ds.ENDPOINT], env=drive_env(tmp_path))
    assert p.returncode == 0, p.err
    got = {f.name: f.read_bytes() for f in out.rglob("*") if f.is_file()}
    assert got == {"Notes.docx": b"PK exported by cp", "plain.txt": b"plain"}
