//! Which region an S3 bucket is addressed in, found as the AWS CLI, mountpoint-s3 and rclone
//! find it. First of: the `--region` flag; `AWS_REGION` or `AWS_DEFAULT_REGION`; the
//! `region` of the profile in the AWS config file (`AWS_CONFIG_FILE`, else `~/.aws/config`;
//! the profile is `--profile`, else `AWS_PROFILE`, else `default`); the region the bucket
//! reports (`x-amz-bucket-region` of a HEAD of the bucket, OpenDAL's `detect_region`,
//! bounded by [`DETECT_TIMEOUT`]); and `us-east-1`.

use std::path::PathBuf;
use std::time::Duration;

/// A HEAD of the bucket answers within this on any working network; past it, `us-east-1`.
pub const DETECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the region came from, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    Profile,
    Detected,
    Default,
}

/// The region and where it came from; see the module doc. `detect` is called only when
/// nothing is configured.
pub fn resolve(
    flag: Option<&str>,
    profile: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
    config_text: impl FnOnce() -> Option<String>,
    detect: impl FnOnce() -> Option<String>,
) -> (String, Source) {
    let nonempty = |s: Option<String>| s.filter(|s| !s.trim().is_empty());
    if let Some(r) = nonempty(flag.map(str::to_string)) {
        return (r, Source::Flag);
    }
    if let Some(r) = nonempty(env("AWS_REGION")).or_else(|| nonempty(env("AWS_DEFAULT_REGION"))) {
        return (r, Source::Env);
    }
    let profile = profile.map(str::to_string).or_else(|| nonempty(env("AWS_PROFILE"))).unwrap_or("default".into());
    if let Some(r) = config_text().and_then(|t| profile_region(&t, &profile)) {
        return (r, Source::Profile);
    }
    match detect() {
        Some(r) if !r.is_empty() => (r, Source::Detected),
        _ => ("us-east-1".into(), Source::Default),
    }
}

/// The AWS config file's text, if there is one.
pub fn config_file_text() -> Option<String> {
    let path = std::env::var_os("AWS_CONFIG_FILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws/config")))?;
    std::fs::read_to_string(path).ok()
}

/// `region` in the section of `profile` (`[default]` or `[profile NAME]`) of an AWS config
/// file.
pub fn profile_region(text: &str, profile: &str) -> Option<String> {
    let mut in_section = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            let name = name.strip_prefix("profile ").map(str::trim).unwrap_or(name);
            in_section = name == profile;
            continue;
        }
        if in_section {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == "region" && !v.trim().is_empty() {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// The bucket's region as its server reports it, or `None`. Runs on its own small runtime
/// (callers are not async), bounded by [`DETECT_TIMEOUT`].
pub fn detect(endpoint: Option<&str>, bucket: &str) -> Option<String> {
    // OpenDAL answers `us-east-1` for `https://s3.amazonaws.com` without asking; the same
    // host with its port spelled out is asked (HEAD), and AWS answers with the region.
    let endpoint = endpoint.unwrap_or("https://s3.amazonaws.com:443").to_string();
    let bucket = bucket.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            tokio::time::timeout(DETECT_TIMEOUT, opendal::services::S3::detect_region(&endpoint, &bucket))
                .await
                .ok()
                .flatten()
        })
    })
    .join()
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "
[default]
region = eu-west-1
[profile backup]
output = json
region=ap-south-1
[profile noregion]
output = json
";

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn flag_then_env_then_profile_then_detected_then_default() {
        let cfg = || Some(CONFIG.to_string());
        let never = || -> Option<String> { panic!("detect must not run when a region is configured") };
        assert_eq!(
            resolve(Some("us-west-2"), None, env(&[("AWS_REGION", "x")]), cfg, never),
            ("us-west-2".into(), Source::Flag)
        );
        assert_eq!(resolve(None, None, env(&[("AWS_DEFAULT_REGION", "eu-north-1")]), cfg, never).1, Source::Env);
        assert_eq!(resolve(None, None, env(&[]), cfg, never), ("eu-west-1".into(), Source::Profile));
        assert_eq!(resolve(None, Some("backup"), env(&[]), cfg, never), ("ap-south-1".into(), Source::Profile));
        assert_eq!(resolve(None, None, env(&[("AWS_PROFILE", "backup")]), cfg, never).0, "ap-south-1");
        let found = || Some("eu-central-1".to_string());
        assert_eq!(resolve(None, Some("noregion"), env(&[]), cfg, found), ("eu-central-1".into(), Source::Detected));
        assert_eq!(
            resolve(None, Some("noregion"), env(&[("AWS_REGION", "")]), || None, || None),
            ("us-east-1".into(), Source::Default)
        );
    }

    #[test]
    fn reads_profile_sections() {
        assert_eq!(profile_region(CONFIG, "default").as_deref(), Some("eu-west-1"));
        assert_eq!(profile_region(CONFIG, "backup").as_deref(), Some("ap-south-1"));
        assert_eq!(profile_region(CONFIG, "noregion"), None);
        assert_eq!(profile_region(CONFIG, "missing"), None);
    }
}
