"""`bucketfs mount --notify pubsub://projects/P/subscriptions/S`: Cloud Storage notifications
pulled from Pub/Sub. A fake-gcs-server of the test's own publishes GCS's notifications
(JSON_API_V1 payload) to Google's Pub/Sub fake (pstest, run by tests/pubsub-emulator, which
scripts/test builds): creates, overwrites and deletes by another client reach the mount with no
store request; duplicate, out-of-order and pre-mount deliveries never show a stale version; a
subscription that is missing or goes away is reported and the mount recovers
(docs/SEMANTICS.md, "Freshness from store events")."""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import bucketfs_env, mount, new_mountpoint, require_bin, run_cli, unmount, wait_until

WAIT = 10  # seconds for an event to arrive (the fake holds an empty pull 0.5 s)
SETTLE = 7  # events from within 5 s of the subscription's first answer are checked, not believed;
# fake-gcs-server dates its events to the whole second, so up to 1 s earlier than they were
PROJECT = "bucketfs-test"
TOPIC = "gcs-events"
SUBS = ["watch", "late", "flaky", "writer"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find(name: str, env: str) -> str:
    for c in (os.environ.get(env), shutil.which(name), str(Path.home() / "go/bin" / name)):
        if c and os.access(c, os.X_OK):
            return c
    pytest.fail(f"{name} not found: scripts/test builds it ({env} overrides)")


class PubSub:
    """The Pub/Sub fake (gRPC for the mount, an HTTP door for crafted messages) and a
    fake-gcs-server that publishes its notifications to it; both on free loopback ports."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.grpc, self.http, self.gcs_port = free_port(), free_port(), free_port()
        self.gcs = f"http://127.0.0.1:{self.gcs_port}"
        self.fake: subprocess.Popen | None = None
        self.start_fake()
        env = dict(os.environ, PUBSUB_EMULATOR_HOST=f"127.0.0.1:{self.grpc}")
        with open(tmp / "gcs.log", "ab") as log:
            self.gcs_proc = subprocess.Popen(
                [find("fake-gcs-server", "BUCKETFS_TEST_FAKE_GCS"), "-scheme", "http", "-host", "127.0.0.1",
                 "-port", str(self.gcs_port), "-public-host", f"127.0.0.1:{self.gcs_port}", "-backend", "memory",
                 "-log-level", "warn", "-event.pubsub-project-id", PROJECT, "-event.pubsub-topic", TOPIC,
                 "-event.list", "finalize,delete,metadataUpdate"],
                stdout=log, stderr=log, env=env)
        assert wait_until(lambda: self.gcs_req("GET", "/storage/v1/b?project=test")[0] == 200, 15), \
            (tmp / "gcs.log").read_text()[-2000:]

    def start_fake(self, subs: list[str] | None = None) -> None:
        with open(self.tmp / "pubsub.log", "ab") as log:
            self.fake = subprocess.Popen(
                [find("bucketfs-pubsub-emulator", "BUCKETFS_TEST_PUBSUB_EMULATOR"), "-addr", f"127.0.0.1:{self.grpc}",
                 "-http", f"127.0.0.1:{self.http}", "-project", PROJECT, "-topic", TOPIC,
                 "-subs", ",".join(SUBS if subs is None else subs)],
                stdout=log, stderr=log)
        assert wait_until(self.fake_up, 15), (self.tmp / "pubsub.log").read_text()[-2000:]

    def fake_up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.http), timeout=1):
                return True
        except OSError:
            return False

    def kill_fake(self) -> None:
        if self.fake:
            self.fake.send_signal(signal.SIGKILL)
            self.fake.wait()
            self.fake = None

    def close(self) -> None:
        self.kill_fake()
        self.gcs_proc.kill()
        self.gcs_proc.wait()

    def gcs_req(self, method: str, path: str, data: bytes | None = None, query: dict | None = None):
        url = self.gcs + path + ("?" + urllib.parse.urlencode(query) if query else "")
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json" if path == "/storage/v1/b" else "application/octet-stream")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError as e:
            return 0, str(e).encode()

    def make_bucket(self, name: str) -> None:
        st, body = self.gcs_req("POST", "/storage/v1/b", json.dumps({"name": name}).encode(), {"project": "test"})
        assert st == 200, body

    def put(self, bucket: str, key: str, data: bytes) -> int:
        """Upload; the new generation."""
        st, body = self.gcs_req("POST", f"/upload/storage/v1/b/{bucket}/o", data, {"uploadType": "media", "name": key})
        assert st == 200, body
        return int(json.loads(body)["generation"])

    def delete(self, bucket: str, key: str) -> None:
        st, body = self.gcs_req("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")
        assert st in (200, 204), body

    def publish(self, attrs: dict, payload: dict | None = None) -> None:
        """A crafted notification on the topic, as GCS would send it."""
        data = base64.b64encode(json.dumps(payload or {}).encode()).decode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/publish", json.dumps(
            {"data": data, "attributes": attrs}).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def mount(self, bucket: str, sub: str | None, settle: bool = True, ttl: str = "3600") -> str:
        args = [f"gs://{bucket}", "--endpoint", self.gcs, "--anonymous", "--metadata-ttl", ttl]
        if sub:
            args += ["--notify", f"pubsub://projects/{PROJECT}/subscriptions/{sub}"]
        mp = mount(args, env=bucketfs_env(PUBSUB_EMULATOR_HOST=f"127.0.0.1:{self.grpc}"))
        if sub:
            assert wait_until(lambda: status(mp)["notify_up"], 10), status(mp)
            if settle:
                time.sleep(SETTLE)
        return mp


@pytest.fixture
def pubsub(tmp_path):
    require_bin()
    p = PubSub(tmp_path)
    p.make_bucket("events")
    yield p
    p.close()


def notice(kind: str, key: str, gen: int, size: int = 0, at: datetime | None = None, **extra) -> tuple[dict, dict]:
    """GCS's attributes and JSON_API_V1 payload for one event."""
    at = at or datetime.now(timezone.utc)
    t = at.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
    attrs = {"bucketId": "events", "objectId": key, "eventType": kind, "objectGeneration": str(gen),
             "eventTime": t, "payloadFormat": "JSON_API_V1", **extra}
    payload = {"kind": "storage#object", "name": key, "bucket": "events", "generation": str(gen),
               "metageneration": "1", "size": str(size), "updated": t}
    return attrs, payload


def status(mp: str) -> dict:
    p = run_cli(["status", "--json", mp])
    assert p.returncode == 0, p.err
    return json.loads(p.stdout)


def size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def test_gcs_notifications_reach_the_mount_with_no_request(pubsub):
    pubsub.put("events", "old.txt", b"old")
    mp = pubsub.mount("events", "watch")
    writer = pubsub.mount("events", None)
    try:
        assert sorted(os.listdir(mp)) == ["old.txt"]
        assert os.stat(os.path.join(mp, "old.txt")).st_size == 3
        before = status(mp)["requests"]
        pubsub.put("events", "new file.txt", b"12345")
        pubsub.put("events", "d/deep:x.txt", b"1")
        pubsub.put("events", "old.txt", b"replaced, longer")
        with open(os.path.join(writer, "from-a-mount.txt"), "wb") as f:
            f.write(b"written through another mount")
        want = {"old.txt", "new file.txt", "d", "from-a-mount.txt"}
        assert wait_until(lambda: set(os.listdir(mp)) == want, WAIT), sorted(os.listdir(mp))
        assert wait_until(lambda: size_of(os.path.join(mp, "old.txt")) == 16, WAIT)
        assert os.stat(os.path.join(mp, "new file.txt")).st_size == 5
        assert os.stat(os.path.join(mp, "from-a-mount.txt")).st_size == 29
        pubsub.delete("events", "new file.txt")
        os.unlink(os.path.join(writer, "from-a-mount.txt"))
        assert wait_until(lambda: set(os.listdir(mp)) == {"old.txt", "d"}, WAIT), sorted(os.listdir(mp))
        st = status(mp)
        assert st["requests"] == before, f"{st['requests'] - before} store requests for freshness"
        assert st["notify_applied"] >= 6, st
        with open(os.path.join(mp, "old.txt"), "rb") as f:
            assert f.read() == b"replaced, longer"
        assert "store events:     pubsub://" in run_cli(["status", mp]).out
    finally:
        unmount(writer)
        unmount(mp)


def test_duplicate_late_and_pre_mount_notifications_never_show_a_stale_version(pubsub):
    b = "events"
    gen2 = pubsub.put(b, "a.txt", b"version two")
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    # Waiting before the mount: a create of a newer generation than the bucket holds, and
    # a delete of a file that is back, both an hour old.
    pubsub.publish(*notice("OBJECT_FINALIZE", "a.txt", gen2 + 10, 1, at=hour_ago))
    gen_back = pubsub.put(b, "back.txt", b"back again")
    pubsub.publish(*notice("OBJECT_DELETE", "back.txt", gen_back - 1, at=hour_ago))
    mp = pubsub.mount(b, "late")
    try:
        a = os.path.join(mp, "a.txt")
        assert sorted(os.listdir(mp)) == ["a.txt", "back.txt"]
        assert os.stat(a).st_size == 11
        checked = status(mp)["notify_checked"]
        pubsub.publish(*notice("OBJECT_FINALIZE", "a.txt", gen2 + 11, 1, at=hour_ago))
        pubsub.publish(*notice("OBJECT_DELETE", "back.txt", gen_back, at=hour_ago))
        assert wait_until(lambda: status(mp)["notify_checked"] >= checked + 2, WAIT), status(mp)
        assert os.stat(a).st_size == 11, "an old notification was believed over the bucket"
        assert os.path.exists(os.path.join(mp, "back.txt")), "an old delete hid a current file"

        # A noncurrent version deleted for good (versioned bucket): the live file stays. Its
        # generation is above any seen, so only the payload's `timeDeleted` tells. (The
        # listing is held first: a removal is then believed without asking the store.)
        assert "back.txt" in os.listdir(mp)
        attrs, _ = notice("OBJECT_DELETE", "back.txt", gen_back + 100)
        pubsub.publish(attrs, {"name": "back.txt", "timeDeleted": hour_ago.isoformat()})
        # Newest, then an older generation and a duplicate (a barrier orders the check).
        gen3 = pubsub.put(b, "a.txt", b"v3 is the longest of all")
        assert wait_until(lambda: size_of(a) == 24, WAIT)
        pubsub.publish(*notice("OBJECT_FINALIZE", "a.txt", gen3 - 1, 2))
        pubsub.publish(*notice("OBJECT_FINALIZE", "a.txt", gen3, 24))
        pubsub.put(b, "barrier.txt", b"b")
        assert wait_until(lambda: os.path.exists(os.path.join(mp, "barrier.txt")), WAIT)
        assert size_of(a) == 24, "an older generation, delivered late, was believed"
        assert os.path.exists(os.path.join(mp, "back.txt")), "a noncurrent version's delete hid the file"
        # A delete told again after a newer create: the file stays.
        g1 = pubsub.put(b, "r.txt", b"r1")
        pubsub.delete(b, "r.txt")
        pubsub.put(b, "r.txt", b"r2-new")
        pubsub.publish(*notice("OBJECT_DELETE", "r.txt", g1))
        pubsub.put(b, "marker.txt", b"m")
        assert wait_until(lambda: os.path.exists(os.path.join(mp, "marker.txt")), WAIT)
        assert wait_until(lambda: size_of(os.path.join(mp, "r.txt")) == 6, WAIT), size_of(os.path.join(mp, "r.txt"))
        with open(a, "rb") as f:
            assert f.read() == b"v3 is the longest of all"
        for name in ("a.txt", "back.txt", "barrier.txt", "marker.txt", "r.txt"):
            assert os.path.exists(os.path.join(mp, name)), name
    finally:
        unmount(mp)


def test_a_subscription_that_goes_away_is_reported_and_the_mount_recovers(pubsub):
    pubsub.put("events", "a.txt", b"a")
    mp = pubsub.mount("events", "flaky", settle=False)
    try:
        assert os.listdir(mp) == ["a.txt"]
        pubsub.kill_fake()
        assert wait_until(lambda: not status(mp)["notify_up"], 30), status(mp)
        assert status(mp)["notify_down_reason"]
        assert "DOWN for" in run_cli(["status", mp]).out
        assert os.listdir(mp) == ["a.txt"], "the mount answers from the store meanwhile"
        # Back without the subscription: still down, with Pub/Sub's own reason.
        pubsub.start_fake(subs=[])
        assert wait_until(lambda: "NotFound" in (status(mp)["notify_down_reason"] or ""), 30), status(mp)
        pubsub.kill_fake()
        pubsub.start_fake()
        assert wait_until(lambda: status(mp)["notify_up"], 30), status(mp)
        time.sleep(SETTLE)
        pubsub.put("events", "after.txt", b"after")
        assert wait_until(lambda: "after.txt" in os.listdir(mp), WAIT), os.listdir(mp)
        assert status(mp)["notify_downs"] >= 1
    finally:
        unmount(mp)


def test_a_bad_pubsub_source_is_refused_before_mounting(pubsub):
    target = new_mountpoint()
    for source, why in [("pubsub://projects/p/topics/t", "not a subscription"),
                        ("pubsub://p/s", "not a subscription")]:
        p = run_cli(["mount", "gs://events", target, "--endpoint", pubsub.gcs, "--anonymous", "--notify", source])
        assert p.returncode != 0
        assert why in p.err, p.err
    # A folder of its own: /tmp may hold the mount point (a checkout under /tmp), refused
    # for that first.
    folder = tempfile.mkdtemp(prefix="bucketfs-notify-folder-")
    try:
        p = run_cli(["mount", f"file://{folder}", target, "--notify", f"pubsub://projects/{PROJECT}/subscriptions/watch"])
    finally:
        os.rmdir(folder)
    assert p.returncode != 0 and "gs://" in p.err, p.err
    assert not os.path.ismount(target)
