//! One logger for `mount` and `cp`: text (the default) or one JSON object a line
//! (`--log-format json`, tracing-subscriber's JSON layer, for journald or a log shipper),
//! written to stderr or a file. `BUCKETFS_LOG`, in `tracing`'s EnvFilter syntax
//! (`warn,bucketfs_store=debug`), replaces the default filter that `-v` picks.

use std::path::Path;

use clap::{Args, ValueEnum};

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Args, Clone, Debug, Default)]
pub struct LogArgs {
    /// Log lines as text, or as one JSON object each (fields: timestamp, level, fields,
    /// target). BUCKETFS_LOG (EnvFilter syntax, like warn,bucketfs_store=debug) sets what is
    /// logged.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub log_format: LogFormat,
}

/// Crates whose debug lines can carry credentials: the signing library's credential chain
/// logs each provider with `Debug`, and its static providers print their keys (a service
/// account's JSON, with its private key). Held at `info` whatever the filter asks for.
const SECRET_BEARING: [&str; 4] =
    ["reqsign_core=info", "reqsign_aws_v4=info", "reqsign_google=info", "reqsign_aws_core=info"];

/// `BUCKETFS_LOG`'s filter, or `default_filter`, with [`SECRET_BEARING`] capped.
fn filter(default_filter: &str) -> tracing_subscriber::EnvFilter {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BUCKETFS_LOG").unwrap_or_else(|_| default_filter.into());
    SECRET_BEARING.iter().fold(filter, |f, d| f.add_directive(d.parse().expect("a valid directive")))
}

/// Open a log file the user named (`--log-file`), appending. A new one is made readable
/// by its owner only (0600), as the mount's own log is: a debug log names every key read.
/// An existing file keeps the mode it has.
pub fn open_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// Install the process's logger: `default_filter` unless `BUCKETFS_LOG` is set; to `file`
/// (appended) if given and it opens, else stderr.
pub fn init(default_filter: &str, format: LogFormat, file: Option<&Path>) {
    let filter = filter(default_filter);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false);
    let file = file.and_then(|p| {
        open_file(p).map_err(|e| say!("bucketfs: cannot open log file {}: {e}; logging to stderr", p.display())).ok()
    });
    let result = match (format, file) {
        (LogFormat::Text, Some(f)) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        (LogFormat::Text, None) => builder.with_writer(std::io::stderr).try_init(),
        (LogFormat::Json, Some(f)) => builder.json().with_writer(std::sync::Mutex::new(f)).try_init(),
        (LogFormat::Json, None) => builder.json().with_writer(std::io::stderr).try_init(),
    };
    if let Err(e) = result {
        say!("bucketfs: logging not set up: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_new_log_file_is_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bucketfs-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("new.log");
        let _ = std::fs::remove_file(&p);
        super::open_file(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(mode, 0o600, "{mode:o}");
    }

    #[test]
    fn credential_chains_are_never_logged_at_debug() {
        // `bucketfs csi --verbose` logs at debug: the signing library's "Trying credential
        // provider: {provider:?}" printed static keys.
        for asked in ["debug", "trace,reqsign_core=trace"] {
            let f = super::filter(asked).to_string();
            assert!(f.contains("reqsign_core=info") && !f.contains("reqsign_core=trace"), "{asked}: {f}");
        }
    }
}
