//! One logger for `mount` and `cp`: text (the default) or one JSON object a line
//! (`--log-format json`, tracing-subscriber's JSON layer, for journald or a log shipper),
//! written to stderr or a file. `BUCKETFS_LOG`, in `tracing`'s EnvFilter syntax
//! (`warn,bucketfs_store=debug`), replaces the default filter that `-v` picks.
//!
//! The text format escapes every control character in field values and messages
//! ([`EscapedFields`]): object keys come from other clients and may hold a newline, and a
//! key logged with `%key` must not start a forged line of its own. JSON escapes by itself.

use std::fmt;
use std::path::Path;

use clap::{Args, ValueEnum};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::FormatFields;

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

/// tracing-subscriber's own field formatter, its output passed through [`Escaping`]. Only
/// fields (the message among them) carry text from outside: the rest of a line (time,
/// level, target, span names) is ours, and the line's closing newline is written by the
/// event formatter, not here, so each record stays one line. Colours are off (`init`), and
/// the fields are formatted without them, so no escape code of ours is ever escaped.
struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        DefaultFields::new().format_fields(Writer::new(&mut Escaping(&mut writer)), fields)
    }
}

/// Writes text through to `W` with each control character (U+0000-U+001F, U+007F,
/// U+0080-U+009F) escaped: `\n`, `\r`, `\t`, `\x1b`, `\u{85}`.
struct Escaping<'a, W>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, c) in s.char_indices().filter(|(_, c)| c.is_control()) {
            self.0.write_str(&s[start..i])?;
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                c if c < '\u{80}' => write!(self.0, "\\x{:02x}", c as u32)?,
                c => write!(self.0, "\\u{{{:x}}}", c as u32)?,
            }
            start = i + c.len_utf8();
        }
        self.0.write_str(&s[start..])
    }
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
        (LogFormat::Text, Some(f)) => {
            builder.fmt_fields(EscapedFields).with_writer(std::sync::Mutex::new(f)).try_init()
        }
        (LogFormat::Text, None) => builder.fmt_fields(EscapedFields).with_writer(std::io::stderr).try_init(),
        (LogFormat::Json, Some(f)) => builder.json().with_writer(std::sync::Mutex::new(f)).try_init(),
        (LogFormat::Json, None) => builder.json().with_writer(std::io::stderr).try_init(),
    };
    if let Err(e) = result {
        say!("bucketfs: logging not set up: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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

    /// What the text logger writes for the events `emit` sends, with `init`'s settings
    /// (no colours, [`super::EscapedFields`]) and no timestamps.
    fn logged(emit: impl FnOnce()) -> String {
        logged_with(super::EscapedFields, emit)
    }

    /// The same, with the field formatter `fields`.
    fn logged_with<N>(fields: N, emit: impl FnOnce()) -> String
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_newline_in_a_key_cannot_forge_a_log_line() {
        let key = "a\nFORGED";
        let line = logged(|| tracing::warn!(key = %key, "directory holds a key with no file name"));
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.ends_with(" key=a\\nFORGED\n"), "{line:?}");

        let forged = "x\n2026-12-06T00:00:00.000000Z ERROR bucketfs::mount: FORGED LINE";
        let line = logged(|| tracing::warn!("listed {forged}"));
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.contains("listed x\\n2026-12-06T00:00:00.000000Z ERROR"), "{line:?}");

        // Span fields go through the same formatter.
        let line = logged(|| tracing::warn_span!("list", prefix = %key).in_scope(|| tracing::warn!("listed")));
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.contains(" list{prefix=a\\nFORGED}: "), "{line:?}");
    }

    #[test]
    fn every_control_character_is_escaped() {
        let value = "\r\t\0\x1b[31m\x7f\u{85}\u{9f}é";
        let line = logged(|| tracing::warn!(value = %value, "{value}"));
        let escaped = "\\r\\t\\x00\\x1b[31m\\x7f\\u{85}\\u{9f}é";
        assert!(line.ends_with(&format!(": {escaped} value={escaped}\n")), "{line:?}");
        assert!(!line[..line.len() - 1].chars().any(char::is_control), "{line:?}");
    }

    #[test]
    fn a_plain_event_is_logged_as_before() {
        let emit = || tracing::warn!(key = %"dir/a b.txt", size = 3, path = ?"dir", "listed");
        let line = logged(emit);
        assert_eq!(line, " WARN bucketfs::logging::tests: listed key=dir/a b.txt size=3 path=\"dir\"\n");
        assert_eq!(line, logged_with(tracing_subscriber::fmt::format::DefaultFields::new(), emit));
    }
}
