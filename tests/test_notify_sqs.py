"""`bucketfs mount --notify sqs://QUEUE-URL`: S3 event notifications read from an SQS queue
(goaws, a local SQS-compatible server that scripts/test installs), fed the event JSON AWS
documents: creates, overwrites and deletes reach the mount with no LIST or HEAD; duplicate,
out-of-order and pre-mount deliveries never show a stale version; a queue that goes away is
reported and the mount recovers when it is back (docs/SEMANTICS.md, "Freshness from store
events")."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import seed
from conftest import mount, new_mountpoint, run_cli, unmount, wait_until

WAIT = 10  # seconds for an event to arrive (SQS long-polls; goaws checks every 0.1 s)
# Events from before the queue first answered, or within 5 s after, are checked with the
# store rather than believed (a quick remount may find older ones): tests that count
# requests make their changes after this.
SETTLE = 5.5
ACCOUNT = "100010001000"


def goaws_binary() -> str:
    for c in (os.environ.get("BUCKETFS_TEST_GOAWS"), shutil.which("goaws"), str(Path.home() / "go/bin/goaws")):
        if c and os.access(c, os.X_OK):
            return c
    pytest.fail("goaws not found: scripts/test installs it (go install github.com/Admiral-Piett/goaws/app/cmd@v0.4.5, renamed goaws)")


class Goaws:
    """One goaws process on a free loopback port, killed and started again at will."""

    def __init__(self, tmp: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.config = tmp / "goaws.yaml"
        self.config.write_text(
            f'Local:\n  Host: 127.0.0.1\n  Port: {self.port}\n  Region: us-east-1\n  AccountId: "{ACCOUNT}"\n'
            "  LogToFile: false\n  QueueAttributeDefaults:\n    VisibilityTimeout: 30\n"
            "    ReceiveMessageWaitTimeSeconds: 0\n  Queues: []\n"
        )
        self.log = tmp / "goaws.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([goaws_binary(), "-config", str(self.config), "Local"], stdout=log, stderr=log)
        assert wait_until(self.healthy, 15), self.log.read_text()[-2000:]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def call(self, path: str, **form: str) -> str:
        data = urllib.parse.urlencode({**form, "Version": "2012-11-05"}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", data=data, timeout=10) as r:
            return r.read().decode()

    def create_queue(self, name: str) -> str:
        self.call("/", Action="CreateQueue", QueueName=name)
        return f"sqs://http://127.0.0.1:{self.port}/{ACCOUNT}/{name}"

    def send(self, queue: str, body: str) -> None:
        self.call(f"/{ACCOUNT}/{queue}", Action="SendMessage", MessageBody=body)


@pytest.fixture
def goaws(tmp_path):
    g = Goaws(tmp_path)
    yield g
    g.kill()


def s3_event(bucket: str, name: str, key: str, seq: int, size: int = 0, etag: str = "", at: datetime | None = None) -> str:
    """One event as S3 sends it to SQS (key URL-encoded as a form value)."""
    at = at or datetime.now(timezone.utc)
    obj = {"key": urllib.parse.quote_plus(key, safe="/"), "sequencer": f"{seq:018X}"}
    if name.startswith("ObjectCreated"):
        obj.update(size=size, eTag=etag)
    rec = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        "eventName": name,
        "s3": {"s3SchemaVersion": "1.0", "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"}, "object": obj},
    }
    return json.dumps({"Records": [rec]})


def put_and_tell(g: Goaws, queue: str, bucket: str, key: str, data: bytes, seq: int) -> str:
    """Put through boto3 and send the event S3 would have sent; the event's body."""
    seed.put("s3", bucket, key, data)
    etag = seed.s3_client().head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
    body = s3_event(bucket, "ObjectCreated:Put", key, seq, len(data), etag)
    g.send(queue, body)
    return body


def status(mp: str) -> dict:
    p = run_cli(["status", "--json", mp])
    assert p.returncode == 0, p.err
    return json.loads(p.stdout)


def sqs_mount(bucket: str, source: str, settle: bool = True) -> str:
    mp = mount([seed.mount_url("s3", bucket), "--endpoint", seed.S3_ENDPOINT, "--notify", source, "--metadata-ttl", "3600"])
    assert wait_until(lambda: status(mp)["notify_up"], 10), status(mp)
    if settle:
        time.sleep(SETTLE)
    return mp


def size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def test_s3_events_from_a_queue_reach_the_mount_with_no_request(s3_bucket, goaws):
    b = s3_bucket.name
    source = goaws.create_queue("watch")
    seed.put("s3", b, "old.txt", b"old")
    mp = sqs_mount(b, source)
    try:
        assert sorted(os.listdir(mp)) == ["old.txt"]
        assert os.stat(os.path.join(mp, "old.txt")).st_size == 3
        before = status(mp)["requests"]
        put_and_tell(goaws, "watch", b, "new file.txt", b"12345", 1)
        put_and_tell(goaws, "watch", b, "d/deep:x.txt", b"1", 2)
        put_and_tell(goaws, "watch", b, "old.txt", b"replaced, longer", 3)
        want = {"old.txt", "new file.txt", "d"}
        assert wait_until(lambda: set(os.listdir(mp)) == want, WAIT), sorted(os.listdir(mp))
        assert wait_until(lambda: size_of(os.path.join(mp, "old.txt")) == 16, WAIT)
        assert os.stat(os.path.join(mp, "new file.txt")).st_size == 5
        seed.delete("s3", b, "new file.txt")
        goaws.send("watch", s3_event(b, "ObjectRemoved:Delete", "new file.txt", 4))
        assert wait_until(lambda: not os.path.exists(os.path.join(mp, "new file.txt")), WAIT)
        st = status(mp)
        assert st["requests"] == before, f"{st['requests'] - before} store requests for freshness"
        assert st["notify_applied"] >= 4, st
        with open(os.path.join(mp, "old.txt"), "rb") as f:
            assert f.read() == b"replaced, longer"
        assert "store events:     sqs://" in run_cli(["status", mp]).out
    finally:
        unmount(mp)


def test_duplicate_late_and_pre_mount_events_never_show_a_stale_version(s3_bucket, goaws):
    b = s3_bucket.name
    source = goaws.create_queue("late")
    # In the queue before the mount: an event for a version the bucket no longer holds.
    seed.put("s3", b, "a.txt", b"version two")
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    goaws.send("late", s3_event(b, "ObjectCreated:Put", "a.txt", 5, 1, "stale-etag", at=hour_ago))
    goaws.send("late", s3_event(b, "ObjectRemoved:Delete", "gone-long-ago.txt", 1, at=hour_ago))
    seed.put("s3", b, "gone-long-ago.txt", b"back again")
    mp = sqs_mount(b, source)
    try:
        a = os.path.join(mp, "a.txt")
        assert sorted(os.listdir(mp)) == ["a.txt", "gone-long-ago.txt"]
        assert os.stat(a).st_size == 11
        # The same old events again, now that the mount holds a listing: checked, not believed.
        checked = status(mp)["notify_checked"]
        goaws.send("late", s3_event(b, "ObjectCreated:Put", "a.txt", 6, 1, "stale-etag", at=hour_ago))
        goaws.send("late", s3_event(b, "ObjectRemoved:Delete", "gone-long-ago.txt", 2, at=hour_ago))
        assert wait_until(lambda: status(mp)["notify_checked"] >= checked + 2, WAIT), status(mp)
        assert os.stat(a).st_size == 11, "an old event was believed over the bucket"
        assert os.path.exists(os.path.join(mp, "gone-long-ago.txt")), "an old removal hid a current file"
        assert sorted(os.listdir(mp)) == ["a.txt", "gone-long-ago.txt"]

        # Newer, then older (with a later marker as a barrier): the newest stays.
        newest = put_and_tell(goaws, "late", b, "a.txt", b"v3 is the longest of all", 20)
        assert wait_until(lambda: size_of(a) == 24, WAIT)
        goaws.send("late", s3_event(b, "ObjectCreated:Put", "a.txt", 10, 2, "older-etag"))
        goaws.send("late", newest)
        seed.put("s3", b, "barrier.txt", b"b")
        goaws.send("late", s3_event(b, "ObjectCreated:Put", "barrier.txt", 1, 1, "b"))
        assert wait_until(lambda: os.path.exists(os.path.join(mp, "barrier.txt")), WAIT)
        assert size_of(a) == 24, "an older event, delivered late, was believed"
        # A removal told twice around a later create: the file stays.
        seed.put("s3", b, "r.txt", b"r1")
        goaws.send("late", s3_event(b, "ObjectCreated:Put", "r.txt", 30, 2, "r1"))
        removal = s3_event(b, "ObjectRemoved:Delete", "r.txt", 31)
        goaws.send("late", removal)
        put_and_tell(goaws, "late", b, "r.txt", b"r2-new", 32)
        goaws.send("late", removal)
        goaws.send("late", s3_event(b, "ObjectCreated:Put", "marker.txt", 40, 1, "m"))
        seed.put("s3", b, "marker.txt", b"m")
        assert wait_until(lambda: os.path.exists(os.path.join(mp, "marker.txt")), WAIT)
        assert os.stat(a).st_size == 24
        with open(a, "rb") as f:
            assert f.read() == b"v3 is the longest of all"
        assert os.stat(os.path.join(mp, "r.txt")).st_size == 6
    finally:
        unmount(mp)


def test_hostile_messages_are_ignored_and_the_mount_keeps_answering(s3_bucket, goaws):
    b = s3_bucket.name
    source = goaws.create_queue("hostile")
    seed.put("s3", b, "p/ok.txt", b"ok")
    mp = mount([seed.mount_url("s3", b, "p"), "--endpoint", seed.S3_ENDPOINT, "--notify", source, "--metadata-ttl", "3600"])
    try:
        assert wait_until(lambda: status(mp)["notify_up"], 10)
        time.sleep(SETTLE)
        assert os.listdir(mp) == ["ok.txt"]
        for body in [
            "not json at all",
            json.dumps({"Records": "nope"}),
            json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": b}),
            s3_event("another-bucket", "ObjectCreated:Put", "p/x.txt", 1, 1, "e"),
            s3_event(b, "ObjectCreated:Put", "q/outside.txt", 1, 1, "e"),
            s3_event(b, "ObjectCreated:Put", "p/../escape.txt", 1, 1, "e"),
            s3_event(b, "ObjectCreated:Put", "p/a//b.txt", 1, 1, "e"),
        ]:
            goaws.send("hostile", body)
        # Wrapped as SNS and as EventBridge deliver them.
        seed.put("s3", b, "p/sns.txt", b"sns")
        sns = s3_event(b, "ObjectCreated:Put", "p/sns.txt", 2, 3, "e-sns")
        goaws.send("hostile", json.dumps({"Type": "Notification", "MessageId": "m", "Message": sns}))
        seed.put("s3", b, "p/eb:x.txt", b"eb!")
        goaws.send("hostile", json.dumps({
            "version": "0", "detail-type": "Object Created", "source": "aws.s3",
            "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "detail": {"bucket": {"name": b}, "object": {"key": "p/eb:x.txt", "size": 3, "etag": "e-eb", "sequencer": "01"}},
        }))
        assert wait_until(lambda: set(os.listdir(mp)) == {"ok.txt", "sns.txt", "eb:x.txt"}, WAIT), os.listdir(mp)
        assert os.stat(os.path.join(mp, "eb:x.txt")).st_size == 3
        assert status(mp)["notify_up"]
    finally:
        unmount(mp)


def test_a_queue_that_goes_away_is_reported_and_the_mount_recovers(s3_bucket, goaws):
    b = s3_bucket.name
    source = goaws.create_queue("flaky")
    seed.put("s3", b, "a.txt", b"a")
    mp = sqs_mount(b, source, settle=False)
    try:
        assert os.listdir(mp) == ["a.txt"]
        goaws.kill()
        assert wait_until(lambda: not status(mp)["notify_up"], 30), status(mp)
        st = status(mp)
        assert st["notify_down_reason"], st
        assert "DOWN for" in run_cli(["status", mp]).out
        # The mount still answers from the store meanwhile.
        assert os.listdir(mp) == ["a.txt"]
        # Back, but without its queue: still down, with SQS's own reason.
        goaws.start()
        assert wait_until(lambda: "NonExistentQueue" in (status(mp)["notify_down_reason"] or ""), 30), status(mp)
        goaws.create_queue("flaky")
        assert wait_until(lambda: status(mp)["notify_up"], 30), status(mp)
        put_and_tell(goaws, "flaky", b, "after.txt", b"after", 1)
        assert wait_until(lambda: "after.txt" in os.listdir(mp), WAIT), os.listdir(mp)
        assert status(mp)["notify_downs"] >= 1
    finally:
        unmount(mp)


def test_a_bad_queue_url_is_refused_before_mounting(s3_bucket):
    target = new_mountpoint()
    for source, why in [("sqs://example.invalid", "names no queue"), ("sqs://http://[::1/x", "not a queue URL")]:
        p = run_cli(["mount", seed.mount_url("s3", s3_bucket.name), target, "--endpoint", seed.S3_ENDPOINT,
                     "--notify", source])
        assert p.returncode != 0
        assert why in p.err, p.err
    assert not os.path.ismount(target)


def test_a_directory_implied_by_its_last_key_goes_when_the_key_is_removed(s3_bucket, goaws):
    b = s3_bucket.name
    source = goaws.create_queue("implied")
    seed.put("s3", b, "implied/x", b"x")
    seed.put("s3", b, "full/y", b"y")
    seed.put("s3", b, "full/z", b"z")
    mp = sqs_mount(b, source)
    try:
        assert sorted(os.listdir(mp)) == ["full", "implied"]
        assert os.listdir(os.path.join(mp, "implied")) == ["x"]
        assert sorted(os.listdir(os.path.join(mp, "full"))) == ["y", "z"]
        for seq, key in enumerate(["implied/x", "full/y"], 1):
            seed.delete("s3", b, key)
            goaws.send("implied", s3_event(b, "ObjectRemoved:Delete", key, seq))
        # The two events apply one after the other: wait for both.
        assert wait_until(lambda: sorted(os.listdir(mp)) == ["full"], WAIT), sorted(os.listdir(mp))
        full = os.path.join(mp, "full")
        assert wait_until(lambda: os.listdir(full) == ["z"], WAIT), os.listdir(full)
        assert not os.path.exists(os.path.join(mp, "implied"))
    finally:
        unmount(mp)
