"""The Drive changes feed keeps flowing (issue 28, item 3): a change with changeType "drive"
(a shared drive renamed, say) has a driveId and no fileId; the mount must skip it and keep
seeing the changes after it, against the Drive emulator."""

from __future__ import annotations

import os

from conftest import mounted, wait_until
import drive_seed as ds
import test_gdrive
from test_gdrive import args, drive_env

folder = test_gdrive.folder  # a fixture


def test_drive_change_does_not_stop_the_feed(folder, tmp_path):
    ds.create("before.txt", folder, b"b")
    env = drive_env(tmp_path, BUCKETFS_GDRIVE_POLL_SECS="0.3")
    with mounted(args(folder, "--metadata-ttl", "0.3"), env=env) as mp:
        assert os.listdir(mp) == ["before.txt"]
        ds.control("drive_change", {"driveId": "0AsomeSharedDriveUk9PVA"})
        ds.create("after.txt", folder, b"seen after the drive change")
        assert wait_until(lambda: sorted(os.listdir(mp)) == ["after.txt", "before.txt"], 10), os.listdir(mp)
        # And the next poll goes on from the token after the page that held it.
        ds.control("drive_change", {})
        ds.create("later.txt", folder, b"l")
        assert wait_until(lambda: "later.txt" in os.listdir(mp), 10), os.listdir(mp)
        assert open(os.path.join(mp, "after.txt"), "rb").read() == b"seen after the drive change"
