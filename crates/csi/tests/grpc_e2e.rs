//! `bucketfs csi` end to end through its gRPC API, on MinIO with real FUSE mounts:
//! provision a volume, stage it, publish it at two target paths (one read-only), write
//! through one and read through the other, restart the plugin in the middle (the mount
//! keeps serving and is adopted), check that no process holds the secret in its argv or
//! environment, kill the mount's daemon (reported, then staged again), unpublish,
//! unstage (the upload is in the bucket), delete (the keys are gone).
//!
//! Needs root, FUSE, MinIO (`BUCKETFS_TEST_S3_ENDPOINT`, its keys in `AWS_ACCESS_KEY_ID` /
//! `AWS_SECRET_ACCESS_KEY`, bucket `BUCKETFS_TEST_S3_BUCKET`) and `BUCKETFS_BIN`: what
//! scripts/test sets up. Under CI a missing one fails; elsewhere the test is skipped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bucketfs_csi::pb::{self, controller_client::ControllerClient, node_client::NodeClient, volume_capability as vc};
use tonic::transport::Channel;

fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ if std::env::var_os("CI").is_some() => panic!("{var} must be set under CI (scripts/test sets it)"),
        _ => {
            eprintln!("skipping: {var} is not set (scripts/test sets it)");
            None
        }
    }
}

struct Env {
    bin: PathBuf,
    endpoint: String,
    key: String,
    secret: String,
    bucket: String,
}

impl Env {
    /// What scripts/test sets; `None` (the test skips) outside CI when something is missing.
    fn from_env() -> Option<Env> {
        let (Some(bin), Some(endpoint), Some(key), Some(secret), Some(bucket)) = (
            required("BUCKETFS_BIN"),
            required("BUCKETFS_TEST_S3_ENDPOINT"),
            required("AWS_ACCESS_KEY_ID"),
            required("AWS_SECRET_ACCESS_KEY"),
            required("BUCKETFS_TEST_S3_BUCKET"),
        ) else {
            return None;
        };
        Some(Env { bin: bin.into(), endpoint, key, secret, bucket })
    }

    /// The store at `url` (a volume's), as another client sees it.
    fn store(&self, url: &str) -> std::sync::Arc<dyn bucketfs_store::Store> {
        let keys = bucketfs_store::location::Keys::S3 {
            access_key_id: self.key.clone(),
            secret_access_key: self.secret.clone(),
            session_token: None,
        };
        let opts = bucketfs_store::location::StoreOptions {
            endpoint: Some(self.endpoint.clone()),
            keys: Some(keys),
            ..Default::default()
        };
        bucketfs_store::location::open(&bucketfs_store::location::Location::parse(url).unwrap(), &opts).unwrap()
    }

    /// A volume's secret: the keys and the endpoint.
    fn secrets(&self) -> HashMap<String, String> {
        HashMap::from([
            ("awsAccessKeyId".to_string(), self.key.clone()),
            ("awsSecretAccessKey".to_string(), self.secret.clone()),
            ("endpoint".to_string(), self.endpoint.clone()),
        ])
    }
}

fn start_plugin(env: &Env, dir: &Path) -> Child {
    let sock = dir.join("csi.sock");
    let _ = std::fs::remove_file(&sock);
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("plugin.log")).unwrap();
    let child = Command::new(&env.bin)
        .args(["csi", "--node-id", "e2e-node", "--endpoint"])
        .arg(format!("unix://{}", sock.display()))
        .arg("--state-dir")
        .arg(dir.join("state"))
        // The plumbing a host-scoped mount uses (docs/KUBERNETES.md), with a prefix that
        // runs here: the mount runs a copy of the binary, through another command.
        .arg("--host-binary")
        .arg(dir.join("host/bucketfs"))
        .args(["--mount-prefix", "env --"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "the plugin did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn stop_plugin(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the plugin did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    // A plugin killed by the signal's default action (no handler yet) exits without a code.
    assert!(status.success(), "the plugin did not stop cleanly on SIGTERM: {status}");
}

async fn channel(sock: PathBuf) -> Channel {
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(sock).await?))
            }
        }))
        .await
        .unwrap()
}

/// Unpublish `volume` from `target`, which must succeed and remove the target directory.
async fn unpublish(node: &mut NodeClient<Channel>, volume: &str, target: &Path) {
    node.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: volume.to_string(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!target.exists(), "unpublish removes the target directory");
}

fn capability(mode: vc::access_mode::Mode) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(vc::AccessMode { mode: mode as i32 }),
        access_type: Some(vc::AccessType::Mount(vc::MountVolume::default())),
    }
}

/// `kill -9` the mount daemons this test started through the plugin.
fn kill_9(pids: &[u32]) {
    for pid in pids {
        // SAFETY: kill(2) of a process this test started.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
}

/// The pids whose command line names `needle`.
fn pids_with(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}

/// On the way out (a failed assertion included): detach every mount left under the test's
/// directory, so removing it never walks into a bucket.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let mut left: Vec<_> =
            bucketfs_csi::mounts::table().into_iter().filter(|m| m.target.starts_with(&self.0)).collect();
        left.sort_by_key(|m| std::cmp::Reverse(m.target.as_os_str().len()));
        for m in left {
            let _ = bucketfs_csi::mounts::detach(&m.target);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_through_its_whole_life_survives_a_plugin_restart() {
    let Some(env) = Env::from_env() else { return };
    let work = tempfile::Builder::new().prefix("bfs-csi-e2e-").tempdir().unwrap();
    let dir = work.path().to_path_buf();
    let _unmount = Unmount(dir.clone());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let base = format!("s3://{}/csi-e2e-{nanos}", env.bucket);
    let secrets = env.secrets();
    let mut plugin = start_plugin(&env, &dir);
    let ch = channel(dir.join("csi.sock")).await;
    let (mut ctl, mut node) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));

    // Provision: twice with one name is one volume.
    let create = pb::CreateVolumeRequest {
        name: "pvc-e2e".into(),
        capacity_range: Some(pb::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
        volume_capabilities: vec![capability(vc::access_mode::Mode::MultiNodeMultiWriter)],
        parameters: HashMap::from([
            ("url".to_string(), base.clone()),
            ("onDelete".to_string(), "delete".to_string()),
            ("mountOptions".to_string(), "metadata-ttl=1".to_string()),
        ]),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let vol = ctl.create_volume(create.clone()).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(vol.volume_id, format!("{base}/pvc-e2e"));
    let again = ctl.create_volume(create).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(again.volume_id, vol.volume_id);

    // Stage once, publish twice: read-write at t1, read-only at t2.
    let staging = dir.join("staging");
    let (t1, t2) = (dir.join("pods/a/t1"), dir.join("pods/b/t2"));
    let cap = capability(vc::access_mode::Mode::MultiNodeMultiWriter);
    let stage = pb::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets: secrets.clone(),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_stage_volume(stage.clone()).await.expect("staged again the same way: done already");
    // Another volume at the staged path answered OK and changed nothing (tester R).
    let other = pb::NodeStageVolumeRequest {
        volume_id: format!("{base}/another"),
        volume_context: HashMap::new(),
        ..stage.clone()
    };
    let taken = node.node_stage_volume(other).await.unwrap_err();
    assert_eq!(taken.code(), tonic::Code::AlreadyExists, "{taken:?}");
    let ro = capability(vc::access_mode::Mode::MultiNodeReaderOnly);
    let taken = node.node_stage_volume(pb::NodeStageVolumeRequest { volume_capability: Some(ro), ..stage }).await;
    assert_eq!(taken.unwrap_err().code(), tonic::Code::AlreadyExists, "read-only over a read-write stage");
    for (t, ro) in [(&t1, false), (&t2, true)] {
        node.node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: t.display().to_string(),
            volume_capability: Some(cap.clone()),
            readonly: ro,
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(t1.join("model.bin"), &data).unwrap();
    assert_eq!(std::fs::read(t2.join("model.bin")).unwrap(), data, "read through the other target");
    let e = std::fs::write(t2.join("nope"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "a read-only publish refuses writes: {e}");
    // Published again: the same way is done already; read-only over read-write is refused
    // (it answered OK and left the target writable: tester R), as is a symbolic link as
    // the target (the bind landed where it points, and no unpublish removed it).
    let publish = |t: &Path, readonly: bool| pb::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: t.display().to_string(),
        volume_capability: Some(cap.clone()),
        readonly,
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    node.node_publish_volume(publish(&t1, false)).await.unwrap();
    let differs = node.node_publish_volume(publish(&t1, true)).await.unwrap_err();
    assert_eq!(differs.code(), tonic::Code::AlreadyExists, "{differs:?}");
    std::fs::write(t1.join("still-writable.txt"), b"x").unwrap();
    std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("pods/link")).unwrap();
    let linked = node.node_publish_volume(publish(&dir.join("pods/link"), false)).await.unwrap_err();
    assert_eq!(linked.code(), tonic::Code::InvalidArgument, "{linked:?}");
    assert!(bucketfs_csi::mounts::mounted_at(&dir.join("elsewhere")).is_none(), "nothing bound through the link");
    // A pod running as another user reads it too (allow_other; the file's mode says who).
    let other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(t2.join("model.bin"))
        .output()
        .unwrap();
    assert!(other.status.success(), "uid 65534: {}", String::from_utf8_lossy(&other.stderr));
    assert_eq!(other.stdout.len(), data.len());
    // Unstage while published is refused: pods still use the volume.
    let busy = node
        .node_unstage_volume(pb::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition, "{busy:?}");

    // No process holds the secret in its argv or environment; the file holding it is 0600.
    let daemons = pids_with(&staging.display().to_string());
    assert!(!daemons.is_empty(), "the mount's daemon runs");
    for pid in &daemons {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert_eq!(exe, dir.join("host/bucketfs"), "the mount runs the installed copy");
    }
    for pid in daemons.iter().chain([plugin.id()].iter()) {
        for f in ["cmdline", "environ"] {
            let text = std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            assert!(!String::from_utf8_lossy(&text).contains(&env.secret), "the secret is in /proc/{pid}/{f}");
        }
    }

    // A restart of the plugin: the mount keeps serving, and the new plugin adopts it.
    stop_plugin(plugin);
    assert_eq!(std::fs::read(t2.join("model.bin")).unwrap(), data, "served while the plugin is down");
    std::fs::write(t1.join("after-restart.txt"), b"still here").unwrap();
    plugin = start_plugin(&env, &dir);
    let log = std::fs::read_to_string(dir.join("plugin.log")).unwrap();
    assert!(log.contains("adopted a running mount"), "{log}");
    let ch = channel(dir.join("csi.sock")).await;
    let (mut ctl, mut node) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let stats = node
        .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: t1.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage.len(), 2);

    // A daemon that dies is reported, and a new stage mounts the volume again.
    kill_9(&daemons);
    let t = Instant::now();
    let err = loop {
        let r = node
            .node_get_volume_stats(pb::NodeGetVolumeStatsRequest {
                volume_id: vol.volume_id.clone(),
                volume_path: t1.display().to_string(),
                ..Default::default()
            })
            .await;
        match r {
            Err(e) => break e,
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(10), "a dead mount still reported as fine"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("gone"), "{}", err.message());
    unpublish(&mut node, &vol.volume_id, &t2).await;
    let stage = pb::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets: secrets.clone(),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    node.node_stage_volume(stage).await.unwrap();
    assert_eq!(std::fs::read(staging.join("model.bin")).unwrap(), data, "what was closed before the kill");
    assert_eq!(std::fs::read(staging.join("after-restart.txt")).unwrap(), b"still here");
    // t1 still holds a bind of the dead mount: publishing it again binds the new one (it
    // answered OK and left the pod ENOTCONN for good).
    node.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: t1.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(std::fs::read(t1.join("model.bin")).unwrap(), data, "the republished bind is dead");
    unpublish(&mut node, &vol.volume_id, &t1).await;
    std::fs::write(staging.join("last.txt"), b"unstage uploads me").unwrap();
    node.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(bucketfs_csi::mounts::mounted_at(&staging).is_none(), "unstaged");

    // The bucket holds the volume's files; DeleteVolume (onDelete: delete) removes them.
    let store = env.store(&vol.volume_id);
    use bucketfs_store::StoreExt;
    assert_eq!(store.read("last.txt").await.unwrap().as_ref(), b"unstage uploads me");
    assert_eq!(store.read("model.bin").await.unwrap().len(), data.len());
    ctl.delete_volume(pb::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), secrets: secrets.clone() })
        .await
        .unwrap();
    use futures::StreamExt;
    let left: Vec<_> = store.list("", true).collect().await;
    assert!(left.iter().all(|m| m.is_err()) || left.is_empty(), "keys left after delete: {left:?}");
    ctl.delete_volume(pb::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), secrets })
        .await
        .expect("deleting twice succeeds");
    stop_plugin(plugin);
}

/// Bad input gets an error that names what was wrong, and leaves nothing behind: wrong
/// keys, a missing bucket, an unknown mount option, an unknown attribute.
#[tokio::test(flavor = "multi_thread")]
async fn a_stage_that_cannot_mount_says_why_and_leaves_nothing() {
    let Some(env) = Env::from_env() else { return };
    let work = tempfile::Builder::new().prefix("bfs-csi-bad-").tempdir().unwrap();
    let dir = work.path().to_path_buf();
    let _unmount = Unmount(dir.clone());
    let plugin = start_plugin(&env, &dir);
    let mut node = NodeClient::new(channel(dir.join("csi.sock")).await);
    let good = env.secrets();
    let mut wrong = good.clone();
    wrong.insert("awsSecretAccessKey".into(), "not-the-secret".into());
    let url = format!("s3://{}/csi-bad", env.bucket);
    type Map = HashMap<String, String>;
    let with_url = |u: &str| HashMap::from([("url".to_string(), u.to_string())]);
    let with_options =
        |o: &str| HashMap::from([("url".to_string(), url.clone()), ("mountOptions".to_string(), o.to_string())]);
    use tonic::Code::{Internal, InvalidArgument};
    // The caller's mistakes are INVALID_ARGUMENT (tester R: a bad option was INTERNAL).
    let cases: Vec<(&str, Map, Map, &str, tonic::Code)> = vec![
        ("wrong keys", with_url(&url), wrong, "credential", Internal),
        ("missing bucket", with_url("s3://no-such-bucket-bfs/x"), good.clone(), "no-such-bucket-bfs", Internal),
        ("unknown option", with_options("no-such-flag"), good.clone(), "no-such-flag", InvalidArgument),
        ("bad option value", with_options("uid=abc"), good.clone(), "abc", InvalidArgument),
        (
            "unknown attribute",
            HashMap::from([("url".to_string(), url.clone()), ("bogus".to_string(), "1".to_string())]),
            good.clone(),
            "bogus",
            InvalidArgument,
        ),
        // A file:// volume would give pods a directory of the node.
        ("a node directory", with_url("file:///etc"), good.clone(), "file://", InvalidArgument),
        ("memory", with_url("mem://"), good, "mem://", InvalidArgument),
    ];
    for (what, context, secrets, says, code) in cases {
        let staging = dir.join("staging");
        let err = node
            .node_stage_volume(pb::NodeStageVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability(vc::access_mode::Mode::SingleNodeWriter)),
                secrets,
                volume_context: context,
                ..Default::default()
            })
            .await
            .expect_err(what);
        eprintln!("{what}: {}", err.message());
        assert!(err.message().to_lowercase().contains(says), "{what}: {:?}", err.message());
        assert_eq!(err.code(), code, "{what}: {:?}", err.message());
        assert!(!err.message().contains("not-the-secret"), "{what}: the secret in an error");
        assert!(bucketfs_csi::mounts::mounted_at(&staging).is_none(), "{what}: mounted");
        for sub in ["volumes", "secrets"] {
            let left: Vec<_> = std::fs::read_dir(dir.join("state").join(sub)).unwrap().collect();
            assert!(left.is_empty(), "{what}: state/{sub} keeps {left:?}");
        }
    }
    let log = std::fs::read_to_string(dir.join("plugin.log")).unwrap();
    assert!(!log.contains("not-the-secret") && !log.contains(&env.secret), "a secret in the plugin's log");
    stop_plugin(plugin);
}

/// `provisioning: bucket`: each claim an S3 bucket of its own, made at CreateVolume and
/// (with `onDelete: delete`) emptied and removed at DeleteVolume.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_can_be_a_bucket_of_its_own() {
    let Some(env) = Env::from_env() else { return };
    let work = tempfile::Builder::new().prefix("bfs-csi-bkt-").tempdir().unwrap();
    let dir = work.path().to_path_buf();
    let _unmount = Unmount(dir.clone());
    let plugin = start_plugin(&env, &dir);
    let ch = channel(dir.join("csi.sock")).await;
    let (mut ctl, mut node) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let secrets = env.secrets();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("pvc-{nanos}");
    let create = pb::CreateVolumeRequest {
        name: name.clone(),
        volume_capabilities: vec![capability(vc::access_mode::Mode::SingleNodeWriter)],
        parameters: HashMap::from([
            ("url".to_string(), format!("s3://{}", env.bucket)),
            ("provisioning".to_string(), "bucket".to_string()),
            ("onDelete".to_string(), "delete".to_string()),
        ]),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let vol = ctl.create_volume(create.clone()).await.unwrap().into_inner().volume.unwrap();
    let url = vol.volume_context.get("url").cloned().unwrap();
    assert_eq!(url, format!("s3://{}-{name}", env.bucket), "the volume is a bucket of its own");
    assert_eq!(ctl.create_volume(create).await.unwrap().into_inner().volume.unwrap().volume_id, vol.volume_id);
    let staging = dir.join("staging");
    node.node_stage_volume(pb::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(vc::access_mode::Mode::SingleNodeWriter)),
        secrets: secrets.clone(),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    std::fs::write(staging.join("f.txt"), b"in its own bucket").unwrap();
    node.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    let store = env.store(&url);
    use bucketfs_store::StoreExt;
    assert_eq!(store.read("f.txt").await.unwrap().as_ref(), b"in its own bucket");
    ctl.delete_volume(pb::DeleteVolumeRequest { volume_id: vol.volume_id.clone(), secrets }).await.unwrap();
    let gone = store.check().await;
    assert!(gone.is_err(), "the bucket is deleted with the volume");
    stop_plugin(plugin);
}

/// A write-back volume whose mount died with a pod's closed file not yet sent: unstage
/// mounts it again, which sends the file, before it answers. It answered OK with the file
/// only in the node's staging directory (tester R).
#[tokio::test(flavor = "multi_thread")]
async fn an_unstage_after_the_mount_died_sends_what_it_left() {
    let Some(env) = Env::from_env() else { return };
    let work = tempfile::Builder::new().prefix("bfs-csi-died-").tempdir().unwrap();
    let dir = work.path().to_path_buf();
    let _unmount = Unmount(dir.clone());
    let plugin = start_plugin(&env, &dir);
    let mut node = NodeClient::new(channel(dir.join("csi.sock")).await);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let url = format!("s3://{}/csi-died-{nanos}", env.bucket);
    let (staging, target) = (dir.join("staging"), dir.join("pods/p/vol"));
    let cap = capability(vc::access_mode::Mode::SingleNodeWriter);
    let context = HashMap::from([
        ("url".to_string(), url.clone()),
        // A long delay: the file is still pending when the mount dies.
        ("mountOptions".to_string(), "write-back,write-back-delay=600".to_string()),
    ]);
    node.node_stage_volume(pb::NodeStageVolumeRequest {
        volume_id: url.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets: env.secrets(),
        volume_context: context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    node.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: url.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        volume_context: context,
        ..Default::default()
    })
    .await
    .unwrap();
    std::fs::write(target.join("closed.txt"), b"closed before the mount died").unwrap();
    let daemons = pids_with(&staging.display().to_string());
    assert!(!daemons.is_empty(), "the mount's daemon runs");
    kill_9(&daemons);
    unpublish(&mut node, &url, &target).await;
    node.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: url.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(bucketfs_csi::mounts::mounted_at(&staging).is_none(), "unstaged");
    let store = env.store(&url);
    use bucketfs_store::StoreExt;
    assert_eq!(store.read("closed.txt").await.unwrap().as_ref(), b"closed before the mount died");
    stop_plugin(plugin);
}
