//! File attributes kept with an object as user metadata: `mode` (octal, file type bits
//! included, as rclone writes it), `uid`, `gid` (decimal) and `mtime` (seconds since the
//! epoch with a fraction, the form rclone's S3 backend writes and s3fs reads). Stores that
//! have no user metadata keep none ([`crate::Capabilities::keeps_attrs`] is false).
//! Beside them, `bucketfs-create`: the tag of a create-only upload ([`FileAttrs::created_by`]),
//! and what other clients stored with the object ([`Foreign`]), so an upload here keeps it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a filesystem wants to keep beside an object's bytes. `None`: not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileAttrs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    /// A create-only upload's tag ([`new_create_tag`], hex), the same on every try of one
    /// `O_EXCL` file: an upload refused because the key holds an object tells by it whether
    /// that object is one of its own earlier tries, landed though its answer was lost, or
    /// another writer's (which no other client can give this tag).
    pub created_by: Option<u128>,
    /// What another client stored with the object beside these: sent again with every
    /// upload of the file, as a HEAD found it.
    pub foreign: Option<Arc<Foreign>>,
}

/// The user-metadata names bucketfs itself reads and writes.
const OURS: [&str; 5] = ["mode", "uid", "gid", "mtime", "bucketfs-create"];

/// What an object carries that bucketfs does not set itself: headers another client gave
/// it (`aws s3 cp --cache-control`, a web site's `Content-Type`) and user metadata under
/// other names. A HEAD finds them and uploads of the file send them again: before, a
/// `chmod` (which uploads the file again) or an edit dropped them all (tester W).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Foreign {
    /// Not the generic `application/octet-stream` (or S3's `binary/octet-stream`) a client
    /// that sent none gets: then a guess from the name serves better, as for a new file.
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    /// Not on GCS uploads, whose insert call takes none.
    pub content_disposition: Option<String>,
    pub content_encoding: Option<String>,
    /// User metadata under names other than bucketfs's, sorted by name.
    pub user: Vec<(String, String)>,
}

impl Foreign {
    /// `None` when there is nothing to keep.
    pub fn new(mut self) -> Option<Arc<Self>> {
        self.content_type = self
            .content_type
            .filter(|c| !matches!(c.as_str(), "" | "application/octet-stream" | "binary/octet-stream"));
        // `aws-chunked` names how a client sent its bytes, not how they are stored (S3 drops
        // it; a store that kept it would make our plain upload's body be decoded as chunks).
        let coding = self.content_encoding.take().unwrap_or_default();
        let kept: Vec<&str> = coding
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        self.content_encoding = (!kept.is_empty()).then(|| kept.join(","));
        self.user.sort();
        (self != Self::default()).then(|| Arc::new(self))
    }

    /// One header per line (`header:cache-control=...`), for the staged file's `.attrs`
    /// sidecar beside [`FileAttrs::to_metadata`]'s names; a `%` or line break in a value
    /// is written `%25`, `%0A` or `%0D`.
    fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("content-type", &self.content_type),
            ("cache-control", &self.cache_control),
            ("content-disposition", &self.content_disposition),
            ("content-encoding", &self.content_encoding),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_deref()?)))
    }
}

/// A fresh tag for a file's create-only uploads ([`FileAttrs::created_by`]): random, else
/// (no randomness from the OS) the time, the process and a counter.
pub fn new_create_tag() -> u128 {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_ok() {
        return u128::from_le_bytes(b);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u128;
    nanos ^ (u128::from(std::process::id()) << 64) ^ (n << 96)
}

impl FileAttrs {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The user-metadata map to send with an upload: ours, and another client's
    /// ([`Foreign::user`]).
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = self.foreign.iter().flat_map(|f| f.user.iter().cloned()).collect();
        if let Some(mode) = self.mode {
            m.insert("mode".into(), format!("{mode:o}"));
        }
        if let Some(uid) = self.uid {
            m.insert("uid".into(), uid.to_string());
        }
        if let Some(gid) = self.gid {
            m.insert("gid".into(), gid.to_string());
        }
        if let Some(t) = self.mtime {
            // Seconds as a decimal number, negative before 1970 (`touch -d 1960-...`).
            let (sign, d) = match t.duration_since(UNIX_EPOCH) {
                Ok(d) => ("", d),
                Err(e) => ("-", e.duration()),
            };
            m.insert("mtime".into(), format!("{sign}{}.{:09}", d.as_secs(), d.subsec_nanos()));
        }
        if let Some(tag) = self.created_by {
            m.insert("bucketfs-create".into(), format!("{tag:032x}"));
        }
        m
    }

    /// Parse what an object carries; values of ours that do not parse are ignored, the
    /// names of others are kept ([`Foreign::user`]; see [`FileAttrs::with_headers`]).
    pub fn from_metadata(m: &HashMap<String, String>) -> Self {
        let get = |k: &str| m.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v.trim());
        let mtime = get("mtime").and_then(|v| {
            let (before, v) = match v.strip_prefix('-') {
                Some(rest) => (true, rest),
                None => (false, v),
            };
            let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
            let secs: u64 = secs.parse().ok()?;
            let digits: String = frac.chars().take(9).collect();
            let nanos =
                if digits.is_empty() { 0 } else { digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32) };
            let d = Duration::new(secs, nanos);
            if before {
                UNIX_EPOCH.checked_sub(d)
            } else {
                UNIX_EPOCH.checked_add(d)
            }
        });
        Self {
            mode: get("mode").and_then(|v| u32::from_str_radix(v, 8).ok()).filter(|m| *m <= 0o177777),
            uid: get("uid").and_then(|v| v.parse().ok()),
            gid: get("gid").and_then(|v| v.parse().ok()),
            mtime,
            created_by: get("bucketfs-create").and_then(|v| u128::from_str_radix(v, 16).ok()),
            foreign: Foreign { user: others(m), ..Default::default() }.new(),
        }
    }

    /// With the headers a HEAD found (in a [`Foreign`] with the user metadata already there).
    pub fn with_headers(mut self, headers: Foreign) -> Self {
        let user = self.foreign.take().map(|f| f.user.clone()).unwrap_or_default();
        self.foreign = Foreign { user, ..headers }.new();
        self
    }

    /// The text of a staged file's `.attrs` sidecar: `name=value` lines, ours and another
    /// client's user metadata, then `header:name=value` for each kept header.
    pub fn to_lines(&self) -> String {
        let headers =
            self.foreign.iter().flat_map(|f| f.headers()).map(|(k, v)| (format!("header:{k}"), v.to_string()));
        let mut lines: Vec<String> =
            self.to_metadata().into_iter().chain(headers).map(|(k, v)| format!("{k}={}\n", escape(&v))).collect();
        lines.sort();
        lines.concat()
    }

    /// What [`FileAttrs::to_lines`] wrote (an older sidecar's lines too: ours only).
    pub fn from_lines(text: &str) -> Self {
        let (mut user, mut h) = (HashMap::new(), Foreign::default());
        for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
            let v = unescape(v);
            match k.strip_prefix("header:") {
                Some("content-type") => h.content_type = Some(v),
                Some("cache-control") => h.cache_control = Some(v),
                Some("content-disposition") => h.content_disposition = Some(v),
                Some("content-encoding") => h.content_encoding = Some(v),
                Some(_) => {}
                None => drop(user.insert(k.to_string(), v)),
            }
        }
        Self::from_metadata(&user).with_headers(h)
    }
}

/// User metadata under names that are not bucketfs's, sorted.
fn others(m: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<_> = m
        .iter()
        .filter(|(k, _)| !OURS.iter().any(|o| o.eq_ignore_ascii_case(k)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    v.sort();
    v
}

fn escape(v: &str) -> String {
    v.replace('%', "%25").replace('\n', "%0A").replace('\r', "%0D")
}

fn unescape(v: &str) -> String {
    v.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_round_trip_through_metadata() {
        let a = FileAttrs {
            mode: Some(0o100755),
            uid: Some(1000),
            gid: Some(0),
            mtime: Some(UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789)),
            created_by: Some(new_create_tag()),
            foreign: None,
        };
        let m = a.to_metadata();
        assert_eq!(m["mode"], "100755");
        assert_eq!(m["mtime"], "1700000000.123456789");
        assert_eq!(FileAttrs::from_metadata(&m), a);
        // Integer seconds (s3fs), short fractions, junk.
        let m = HashMap::from([("Mtime".to_string(), "1700000000.5".to_string()), ("mode".into(), "99".into())]);
        let b = FileAttrs::from_metadata(&m);
        assert_eq!(b.mtime, Some(UNIX_EPOCH + Duration::new(1_700_000_000, 500_000_000)));
        assert_eq!(b.mode, None);
        assert!(FileAttrs::from_metadata(&HashMap::new()).is_empty());
    }

    #[test]
    fn another_clients_metadata_and_headers_round_trip_through_the_sidecar() {
        let m = HashMap::from([
            ("mode".to_string(), "100600".to_string()),
            ("Team".into(), "ml%0A\nx".into()),
            ("s3fs-atime".into(), "1".into()),
        ]);
        let headers = Foreign {
            content_type: Some("text/html; charset=utf-8".into()),
            cache_control: Some("max-age=60".into()),
            content_disposition: Some("attachment; filename=\"a=b.txt\"".into()),
            ..Default::default()
        };
        let a = FileAttrs::from_metadata(&m).with_headers(headers.clone());
        let f = a.foreign.as_deref().unwrap();
        assert_eq!(f.user, vec![("Team".to_string(), "ml%0A\nx".to_string()), ("s3fs-atime".into(), "1".into())]);
        assert_eq!((a.mode, &f.cache_control), (Some(0o100600), &headers.cache_control));
        // Sent again with an upload: ours and theirs.
        let sent = a.to_metadata();
        assert_eq!((sent["mode"].as_str(), sent["Team"].as_str(), sent.len()), ("100600", "ml%0A\nx", 3));
        assert_eq!(FileAttrs::from_lines(&a.to_lines()), a, "{}", a.to_lines());
        assert_eq!(a.to_lines().lines().count(), 6, "one line each, the line break escaped");
        // An older sidecar (ours only) still reads; nothing foreign: none kept.
        assert_eq!(FileAttrs::from_lines("mode=100644\n").mode, Some(0o100644));
        let generic = FileAttrs::default()
            .with_headers(Foreign { content_type: Some("binary/octet-stream".into()), ..Default::default() });
        assert!(generic.is_empty());
        let chunked = |c: &str| Foreign { content_encoding: Some(c.into()), ..Default::default() }.new();
        assert_eq!(chunked("aws-chunked"), None);
        assert_eq!(chunked("aws-chunked,gzip").unwrap().content_encoding.as_deref(), Some("gzip"));
    }

    #[test]
    fn mtimes_before_1970_round_trip() {
        for d in [Duration::new(304_776_000, 0), Duration::new(0, 500_000_000), Duration::new(2_208_988_800, 1)] {
            let a = FileAttrs { mtime: Some(UNIX_EPOCH - d), ..Default::default() };
            let m = a.to_metadata();
            assert!(m["mtime"].starts_with('-'), "{m:?}");
            assert_eq!(FileAttrs::from_metadata(&m), a, "{m:?}");
        }
        let m = HashMap::from([("mtime".to_string(), "-304776000".to_string())]); // another tool's
        assert_eq!(FileAttrs::from_metadata(&m).mtime, Some(UNIX_EPOCH - Duration::new(304_776_000, 0)));
    }
}
