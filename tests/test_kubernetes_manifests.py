"""contrib/kubernetes/ against the binary: no cluster runs here, so every flag, parameter,
attribute, secret key and mount option the manifests use is checked to exist in what
`bucketfs` accepts, and the names that must agree (the driver's, the socket's) agree."""
import os
import re
import subprocess

import pytest
import yaml

from conftest import BIN, REPO

K8S = os.path.join(REPO, "contrib", "kubernetes")
PARAMS_RS = os.path.join(REPO, "crates", "csi", "src", "params.rs")
LIB_RS = os.path.join(REPO, "crates", "csi", "src", "lib.rs")


def docs():
    out = []
    for f in sorted(os.listdir(K8S)):
        if f.endswith(".yaml"):
            with open(os.path.join(K8S, f)) as fh:
                out += [(f, d) for d in yaml.safe_load_all(fh) if d]
    return out


def rust_list(path, name):
    text = open(path).read()
    m = re.search(rf"pub const {name}: \[&str; \d+\] =\s*\[([^\]]*)\]", text)
    assert m, f"{name} not found in {path}"
    return re.findall(r'"([^"]+)"', m.group(1))


def help_flags(*sub):
    out = subprocess.run([BIN, *sub, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out)), out


def containers(kind):
    for f, d in docs():
        if d["kind"] == kind:
            yield from ((f, c) for c in d["spec"]["template"]["spec"]["containers"])


def mount_option_flags(opts):
    """`bucketfs mount -o` options as the flags they stand for (mount_opts.rs's rule)."""
    flags = set()
    for o in opts:
        key = o.split("=", 1)[0]
        if key in ("ro", "rw"):
            continue
        flags.add("--" + key.replace("_", "-"))
    return flags


DRIVER = re.search(r'pub const DRIVER_NAME: &str = "([^"]+)"', open(LIB_RS).read()).group(1)


def test_every_flag_of_the_plugin_containers_exists():
    flags, text = help_flags("csi")
    seen = 0
    for kind in ("Deployment", "DaemonSet"):
        for f, c in containers(kind):
            if not c["image"].startswith("bucketfs"):
                continue
            seen += 1
            args = c["args"]
            assert args[0] == "csi", f"{f}: the bucketfs container runs `bucketfs csi`"
            used = {a for a in args if a.startswith("--")}
            assert used <= flags, f"{f}: flags bucketfs csi lacks: {used - flags}"
            mode = args[args.index("--mode") + 1]
            assert mode in ("node", "controller", "all") and mode in text
            sock = args[args.index("--endpoint") + 1].removeprefix("unix://")
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert os.path.dirname(sock) in mounts, f"{f}: the socket's directory is a volume"
    assert seen == 2, "one node and one controller container"


def test_sidecars_talk_to_the_socket_and_the_driver_name_agrees():
    names = {d["metadata"]["name"] for f, d in docs() if d["kind"] == "CSIDriver"}
    assert names == {DRIVER}
    for f, c in list(containers("Deployment")) + list(containers("DaemonSet")):
        if c["image"].startswith("bucketfs"):
            continue
        addr = [a for a in c["args"] if a.startswith("--csi-address=")]
        assert addr == ["--csi-address=/csi/csi.sock"], f"{f}: {c['name']}"
        for a in c["args"]:
            if a.startswith("--kubelet-registration-path="):
                assert f"/plugins/{DRIVER}/csi.sock" in a
    for f, d in docs():
        if d["kind"] == "StorageClass":
            assert d["provisioner"] == DRIVER
        if d["kind"] == "PersistentVolume":
            assert d["spec"]["csi"]["driver"] == DRIVER


def test_parameters_attributes_secrets_and_mount_options_exist():
    attributes = set(rust_list(PARAMS_RS, "ATTRIBUTES"))
    secret_keys = set(rust_list(PARAMS_RS, "SECRETS"))
    mount_flags, _ = help_flags("mount")
    checked = 0
    for f, d in docs():
        if d["kind"] == "StorageClass":
            params = {k: v for k, v in d["parameters"].items() if not k.startswith("csi.storage.k8s.io/")}
            assert set(params) <= attributes, f"{f}: unknown parameters {set(params) - attributes}"
            assert "url" in params
            opts = params.get("mountOptions", "").split(",")
            missing = mount_option_flags(o for o in opts if o) - mount_flags
            assert not missing, f"{f}: mount options bucketfs mount lacks: {missing}"
            checked += 1
        if d["kind"] == "PersistentVolume":
            attrs = d["spec"]["csi"].get("volumeAttributes", {})
            assert set(attrs) <= attributes, f"{f}: unknown attributes {set(attrs) - attributes}"
            missing = mount_option_flags(d["spec"].get("mountOptions", [])) - mount_flags
            assert not missing, f"{f}: PV mountOptions bucketfs mount lacks: {missing}"
            checked += 1
        if d["kind"] == "Secret":
            keys = set(d.get("stringData", {})) | set(d.get("data", {}))
            assert keys <= secret_keys, f"{f}: secret keys the driver does not read: {keys - secret_keys}"
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("opt", ["write-back", "metadata-ttl=60"])
def test_the_checker_itself_knows_a_flag_from_a_typo(opt):
    mount_flags, _ = help_flags("mount")
    assert mount_option_flags([opt]) <= mount_flags
    assert not mount_option_flags(["x" + opt]) <= mount_flags
