//! `bucketbench-mount-s3`: mounts an S3 bucket the way `mount-s3` (mountpoint-s3's CLI)
//! does, built only from mountpoint-s3's published library crates (`mountpoint-s3-fs`,
//! `mountpoint-s3-client`), for the benchmark in `bench/`.
//!
//! The defaults are mount-s3's: 8 MiB parts for GET and PUT, 16 FUSE threads, a 10 Gbps
//! throughput target off EC2, a memory target of 95% of the machine's (or cgroup's) memory,
//! the "minimal" metadata TTL, no data cache, CRC32C upload checksums where the store's
//! personality supports them, deletes and overwrites refused unless `--allow-delete` /
//! `--allow-overwrite` are given, jemalloc as the allocator with mount-s3's settings.
//! Region and throughput are resolved as mount-s3 resolves them (`--region`, then
//! `AWS_REGION`, then the EC2 instance's, then us-east-1; IMDS is not asked when
//! `AWS_EC2_METADATA_DISABLED` is set). Credentials come from the AWS default chain
//! (environment variables first).
//!
//! It always runs in the foreground (`-f` is accepted and changes nothing) and stops when
//! the mount is unmounted (`fusermount3 -u`) or on SIGINT/SIGTERM. Flags it lacks compared
//! with mount-s3 are listed in bench/README.md.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use mountpoint_s3_client::config::{AWSCRT_LOG_TARGET, AddressingStyle, S3ClientAuthConfig};
use mountpoint_s3_client::instance_info::InstanceInfo;
use mountpoint_s3_client::user_agent::UserAgent;
use mountpoint_s3_fs::autoconfigure;
use mountpoint_s3_fs::data_cache::DataCacheConfig;
use mountpoint_s3_fs::fs::{CacheConfig, TimeToLive, UploadChecksumAlgorithm};
use mountpoint_s3_fs::fuse::config::{FuseOptions, FuseSessionConfig, MountPoint};
use mountpoint_s3_fs::logging::{LoggingConfig, init_logging};
use mountpoint_s3_fs::memory::{CandidateSize, MINIMUM_MEM_LIMIT, PagedPool, effective_total_memory};
use mountpoint_s3_fs::s3::config::{ClientConfig, MemoryLimitSetting, PartConfig, TargetThroughputSetting};
use mountpoint_s3_fs::s3::{Bucket, Prefix, S3Path, S3Personality};
use mountpoint_s3_fs::{MountpointConfig, Runtime, S3FilesystemConfig, Superblock, SuperblockConfig, metrics};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (its `malloc_conf` symbol, `_rjem_`-prefixed by
/// tikv-jemalloc-sys), set to what mount-s3's binary sets: purge pages on a background
/// thread, at most 32 arenas, refuse a malformed option string.
#[repr(transparent)]
pub struct JemallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a static, immutable, NUL-terminated string.
unsafe impl Sync for JemallocConf {}

#[unsafe(export_name = "_rjem_malloc_conf")]
pub static JEMALLOC_CONF: JemallocConf = JemallocConf(c"abort_conf:true,background_thread:true,narenas:32".as_ptr());

/// mount-s3's default part size for GETs and PUTs.
const PART_SIZE: u64 = 8 * 1024 * 1024;
/// mount-s3's block size for its data cache, which also sizes one class of the memory pool.
const CACHE_BLOCK_SIZE: usize = 1024 * 1024;

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Checksums {
    Crc32c,
    Crc64nvme,
    Off,
}

#[derive(Parser, Debug)]
#[command(
    name = "bucketbench-mount-s3",
    version,
    about = "mount-s3's defaults over the published mountpoint-s3-fs crate (bench/ only)"
)]
struct Args {
    /// Bucket to mount
    bucket: String,
    /// Directory to mount it on
    mount_point: PathBuf,

    /// Mount only the keys under this prefix (must end with '/')
    #[arg(long)]
    prefix: Option<String>,
    /// S3 endpoint URL (e.g. a MinIO server)
    #[arg(long)]
    endpoint_url: Option<String>,
    /// Path-style addressing (bucket in the path, not the host name)
    #[arg(long)]
    force_path_style: bool,
    /// Signing region [default: AWS_REGION, the EC2 instance's, else us-east-1]
    #[arg(long)]
    region: Option<String>,

    /// Part size for multipart GET and PUT, bytes
    #[arg(long, default_value_t = PART_SIZE, value_parser = clap::value_parser!(u64).range(1..))]
    part_size: u64,
    /// Maximum number of FUSE threads
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    max_threads: u64,
    /// Target throughput, Gbps [default: the EC2 instance's, else 10]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    maximum_throughput_gbps: Option<u64>,
    /// Memory target, MiB [default: 95% of total or cgroup memory, at least 512]
    #[arg(long, value_parser = clap::value_parser!(u64).range(512..))]
    memory_target: Option<u64>,
    /// Metadata TTL: seconds, "minimal" or "indefinite" [default: minimal]
    #[arg(long, value_parser = TimeToLive::new_from_str)]
    metadata_ttl: Option<TimeToLive>,
    /// TTL of negative (not found) entries [default: the metadata TTL]
    #[arg(long, value_parser = TimeToLive::new_from_str)]
    negative_metadata_ttl: Option<TimeToLive>,
    /// Checksum sent with uploads [default: crc32c where the store supports it]
    #[arg(long, value_enum)]
    upload_checksums: Option<Checksums>,

    /// Allow deleting files and empty directories
    #[arg(long)]
    allow_delete: bool,
    /// Allow replacing existing files (opened with O_TRUNC)
    #[arg(long)]
    allow_overwrite: bool,
    /// Incremental uploads and appends (S3 Express One Zone only)
    #[arg(long)]
    incremental_upload: bool,
    /// Mount read-only
    #[arg(long)]
    read_only: bool,
    /// Accepted for mount-s3 compatibility: this binary always runs in the foreground
    #[arg(short, long)]
    foreground: bool,
    /// Debug logging
    #[arg(short, long)]
    debug: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // mount-s3's filter: warnings, mountpoint's own info lines; CRT and metrics silent.
    let filter = if args.debug {
        "debug".to_string()
    } else {
        format!("warn,mountpoint_s3=info,{AWSCRT_LOG_TARGET}=off,{}=off", metrics::TARGET_NAME)
    };
    let _logging = init_logging(LoggingConfig { log_file: None, log_to_stdout: true, default_filter: filter })
        .context("failed to initialize logging")?;
    let _metrics = metrics::install(None).context("failed to initialize metrics")?;

    let mount_point = args.mount_point.clone();
    let session = mount(args)?;
    println!("mounted at {}", mount_point.display());
    session.join().context("FUSE session ended with an error")
}

fn memory_limit(args: &Args) -> MemoryLimitSetting {
    match args.memory_target {
        Some(mib) => MemoryLimitSetting::User(mib as usize * 1024 * 1024),
        None => {
            let share = (effective_total_memory() as f64 * 0.95) as usize;
            MemoryLimitSetting::Default(share.max(MINIMUM_MEM_LIMIT))
        }
    }
}

fn throughput(args: &Args, instance: &InstanceInfo) -> TargetThroughputSetting {
    if let Some(gbps) = args.maximum_throughput_gbps {
        return TargetThroughputSetting::User { gbps: gbps as f64 };
    }
    match autoconfigure::network_throughput(instance) {
        Ok(gbps) => TargetThroughputSetting::Instance { gbps },
        Err(e) => {
            tracing::debug!("no instance throughput ({e:#}); using the default target");
            TargetThroughputSetting::Default
        }
    }
}

fn s3_path(args: &Args) -> anyhow::Result<S3Path> {
    let bucket = Bucket::new(args.bucket.clone()).context("invalid bucket name")?;
    let prefix = match &args.prefix {
        Some(p) => Prefix::new(p).context("invalid prefix")?,
        None => Prefix::empty(),
    };
    Ok(S3Path::new(bucket, prefix))
}

fn checksum(args: &Args, personality: S3Personality) -> Option<UploadChecksumAlgorithm> {
    match args.upload_checksums {
        Some(Checksums::Crc32c) => Some(UploadChecksumAlgorithm::Crc32c),
        Some(Checksums::Crc64nvme) => Some(UploadChecksumAlgorithm::Crc64nvme),
        Some(Checksums::Off) => None,
        None if personality.supports_additional_checksums() => Some(UploadChecksumAlgorithm::Crc32c),
        None => None,
    }
}

fn mount(args: Args) -> anyhow::Result<mountpoint_s3_fs::fuse::session::FuseSession> {
    let memory = memory_limit(&args);
    let instance = InstanceInfo::new();
    let part_size = usize::try_from(args.part_size).context("part size too large")?;
    let client_config = ClientConfig {
        region: autoconfigure::get_region(&instance, args.region.clone()),
        endpoint_url: args.endpoint_url.clone(),
        addressing_style: if args.force_path_style { AddressingStyle::Path } else { AddressingStyle::Automatic },
        dual_stack: false,
        transfer_acceleration: false,
        auth_config: S3ClientAuthConfig::Default,
        requester_pays: false,
        expected_bucket_owner: None,
        throughput_target: throughput(&args, &instance),
        bind: None,
        part_config: PartConfig::with_part_size(part_size).validate(memory)?,
        user_agent: UserAgent::new_with_instance_info(
            Some(format!("bucketbench-mount-s3/{}", env!("CARGO_PKG_VERSION"))),
            &instance,
        ),
        tls_config: None,
    };
    tracing::info!(
        "target throughput {} Gbps, parts {} / {} bytes, memory target {} bytes",
        client_config.throughput_target.value(),
        client_config.part_config.read_size_bytes,
        client_config.part_config.write_size_bytes,
        memory.bytes()
    );

    // One page size per buffer kind, as mount-s3 sizes its pool: cache blocks and GET parts
    // may be reclaimed under pressure, PUT parts may not.
    let pool = PagedPool::config()
        .with_candidate_sizes([
            CandidateSize::prunable(CACHE_BLOCK_SIZE),
            CandidateSize::prunable(client_config.part_config.read_size_bytes),
            CandidateSize::new(client_config.part_config.write_size_bytes),
        ])
        .with_memory_limit(memory.bytes())
        .with_maintenance_interval(Duration::from_secs(60))
        .build();

    let path = s3_path(&args)?;
    // Lists the bucket once: a wrong endpoint, bucket or credentials fail here, before mounting.
    let client = client_config.create_client(pool.clone(), Some(&path)).context("failed to create the S3 client")?;
    let runtime = Runtime::new(client.event_loop_group());
    let personality = S3Personality::infer_from_bucket(&path.bucket, &client.endpoint_config());

    let mut cache = CacheConfig::new(args.metadata_ttl.unwrap_or(TimeToLive::Minimal));
    if let Some(ttl) = args.negative_metadata_ttl {
        cache = cache.with_negative_metadata_ttl(ttl);
    }
    let mut fs_config = S3FilesystemConfig::default();
    fs_config.allow_delete = args.allow_delete;
    fs_config.allow_overwrite = args.allow_overwrite;
    fs_config.incremental_upload = args.incremental_upload;
    fs_config.read_only = args.read_only;
    fs_config.s3_personality = personality;
    fs_config.cache_config = cache;
    fs_config.upload_checksum_algorithm = checksum(&args, personality);

    let max_threads = usize::try_from(args.max_threads).context("too many threads")?;
    let fuse_options = FuseOptions {
        read_only: args.read_only,
        clone_fd: std::env::var("UNSTABLE_MOUNTPOINT_CLONE_FUSE_FD").is_ok_and(|v| v.eq_ignore_ascii_case("true")),
        ..Default::default()
    };
    let fuse_config = FuseSessionConfig::new(
        MountPoint::new(&args.mount_point).context("bad mount point")?,
        fuse_options,
        max_threads,
    )?;

    let superblock = Superblock::new(
        client.clone(),
        path.clone(),
        SuperblockConfig { cache_config: fs_config.cache_config.clone(), s3_personality: personality },
    );
    let session = MountpointConfig::new(fuse_config, fs_config, DataCacheConfig::default())?
        .create_fuse_session(superblock, client, runtime, pool)
        .context("failed to mount")?;
    tracing::info!("{} mounted at {}", path.bucket_description(), args.mount_point.display());
    Ok(session)
}
