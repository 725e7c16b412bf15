"""`bucketfs cp` into destinations that are not a plain file or a new name: a device, a
FIFO, symbolic links (one to no file, one to `/proc/self/fd/1` as `/dev/stdout` is).
Each was replaced by a regular file before, exit 0: `bucketfs cp s3://b/k /dev/null`
turned the machine's `/dev/null` into an 8 MB file (tester Q)."""

from __future__ import annotations

import os
import stat
import threading

from test_cp import SLICE, cp, cp_bucket, url  # noqa: F401 (cp_bucket: the fixture)


def test_a_download_onto_a_device_writes_into_it(cp_bucket, tmp_path):
    cp_bucket.put("obj", os.urandom(SLICE + 5))  # two slices, written in order
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    cp(cp_bucket, url(cp_bucket, "obj"), str(dev))
    assert stat.S_ISCHR(os.lstat(dev).st_mode), "the device is still a device"
    assert os.listdir(tmp_path) == ["null"], "no temporary left beside it"


def test_a_download_into_a_fifo_streams_the_object_in_order(cp_bucket, tmp_path):
    data = os.urandom(2 * SLICE + 7)
    cp_bucket.put("obj", data)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = bytearray()

    def drain():
        with open(fifo, "rb") as f:
            while chunk := f.read(1 << 20):
                got.extend(chunk)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    cp(cp_bucket, url(cp_bucket, "obj"), str(fifo))
    reader.join(60)
    assert bytes(got) == data
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_download_through_a_link_to_stdout_reaches_stdout(cp_bucket, tmp_path):
    data = os.urandom(SLICE + 3)
    cp_bucket.put("obj", data)
    link = tmp_path / "out"
    os.symlink("/proc/self/fd/1", link)
    p = cp(cp_bucket, url(cp_bucket, "obj"), str(link))
    assert p.stdout.startswith(data), "the object went to the copy's stdout"
    assert os.readlink(link) == "/proc/self/fd/1", "the link stays"


def test_a_download_onto_a_link_to_no_file_makes_its_target(cp_bucket, tmp_path):
    cp_bucket.put("obj", b"the object")
    (tmp_path / "d").mkdir()
    os.symlink("d/target.bin", tmp_path / "link")
    cp(cp_bucket, url(cp_bucket, "obj"), str(tmp_path / "link"))
    assert os.readlink(tmp_path / "link") == "d/target.bin", "the link stays, as cp(1) leaves it"
    assert (tmp_path / "d" / "target.bin").read_bytes() == b"the object"


def test_several_sources_with_one_destination_are_refused(cp_bucket, tmp_path):
    # Both copied, each over the last, "files": 2, one lost (tester Q).
    for d, body in (("d1", b"first"), ("d2", b"second")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x").write_bytes(body)
    p = cp(cp_bucket, str(tmp_path / "d1" / "x"), str(tmp_path / "d2" / "x"), url(cp_bucket, "p/"), expect_ok=False)
    assert p.returncode != 0 and "would both be copied to" in p.err, p.err
    (tmp_path / "other" / "d1").mkdir(parents=True)
    (tmp_path / "other" / "d1" / "x").write_bytes(b"third")
    p = cp(cp_bucket, "-r", str(tmp_path / "d1"), str(tmp_path / "other" / "d1"), url(cp_bucket, "q/"),
           expect_ok=False)
    assert p.returncode != 0 and "would both be copied to" in p.err, p.err
    from conftest import seed
    assert seed.list_keys(cp_bucket.store, cp_bucket.name) == [], "nothing copied"


def test_local_names_that_are_not_utf8_are_skipped_not_merged(cp_bucket, tmp_path):
    src = tmp_path / "inv"
    src.mkdir()
    for name, body in ((b"a\xff", b"first"), (b"a\xfe", b"second"), (b"ok", b"ok")):
        with open(os.path.join(os.fsencode(src), name), "wb") as f:
            f.write(body)
    p = cp(cp_bucket, "-r", str(src), url(cp_bucket, "t/"), expect_ok=False)
    assert p.returncode == 2, f"skipped paths: exit 2 ({p.returncode}): {p.err}"
    assert p.err.count("not UTF-8") == 2, p.err
    from conftest import seed
    assert seed.list_keys(cp_bucket.store, cp_bucket.name) == ["t/inv/ok"]


def test_preserve_leaves_a_device_written_into_as_it_was(cp_bucket, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"x")
    os.chmod(src, 0o600)
    os.utime(src, (2_000_000, 2_000_000))
    cp(cp_bucket, "--preserve", str(src), url(cp_bucket, "obj"))  # the object carries both
    dev = tmp_path / "null"
    os.mknod(dev, 0o640 | stat.S_IFCHR, os.makedev(1, 3))
    os.utime(dev, (1_000_000, 1_000_000))
    cp(cp_bucket, "--preserve", url(cp_bucket, "obj"), str(dev))
    st = os.lstat(dev)
    assert (stat.S_IMODE(st.st_mode), int(st.st_mtime)) == (0o640, 1_000_000), "mode and mtime untouched"
