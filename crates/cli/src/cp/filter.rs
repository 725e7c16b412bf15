//! `--exclude`/`--include` and `--dry-run` of `bucketfs cp`.
//!
//! Patterns are globs (`globset`: `*`, `?`, `[a-z]`, `{a,b}`, `**`), as `aws s3 cp` and
//! `gcloud storage cp` take them. `*` matches across `/`, and a pattern is tried against
//! the source's path and each of its trailing parts at a `/` (so `*.tmp` and `logs/*`
//! need no leading `**/`). A file is skipped when an `--exclude` matches and no
//! `--include` does: `--exclude '*' --include '*.txt'` copies only `.txt` files.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::plan::{Dst, Job, Src};

/// The compiled patterns; `None` from [`Filter::new`] when there are no excludes.
pub struct Filter {
    exclude: GlobSet,
    include: GlobSet,
}

fn set(patterns: &[String]) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p).literal_separator(false).build().map_err(|e| format!("pattern {p:?}: {e}"))?;
        b.add(glob);
    }
    b.build().map_err(|e| e.to_string())
}

impl Filter {
    pub fn new(exclude: &[String], include: &[String]) -> Result<Option<Self>, String> {
        if exclude.is_empty() {
            // Includes alone select nothing away: everything is included already.
            return Ok(None);
        }
        Ok(Some(Self { exclude: set(exclude)?, include: set(include)? }))
    }

    /// Is `path` copied?
    pub fn keeps(&self, path: &str) -> bool {
        let tails = || std::iter::once(path).chain(path.match_indices('/').map(|(i, _)| &path[i + 1..]));
        let hit = |s: &GlobSet| tails().any(|t| !t.is_empty() && s.is_match(t));
        !hit(&self.exclude) || hit(&self.include)
    }
}

/// The path a job is filtered by: the source's (local path, or key), for a directory the
/// destination's.
fn job_path(job: &Job) -> String {
    match (&job.src, &job.dst) {
        (Src::Local { path, .. }, _) => path.to_string_lossy().into_owned(),
        (Src::Remote { remote, .. }, _) => remote.key.clone(),
        (_, Dst::Local(p)) => p.to_string_lossy().into_owned(),
        (_, Dst::Remote(r)) => r.key.clone(),
        (_, Dst::Stdout) => String::new(),
    }
}

/// The jobs the filter keeps. A directory that could not be read is always kept (its copy
/// fails, named): what it holds is unknown, so no pattern can say it holds nothing wanted.
pub fn apply(jobs: Vec<Job>, filter: Option<&Filter>) -> Vec<Job> {
    match filter {
        None => jobs,
        Some(f) => {
            jobs.into_iter().filter(|j| matches!(j.src, Src::Unreadable { .. }) || f.keeps(&job_path(j))).collect()
        }
    }
}

/// `SRC -> DST` for `--dry-run`.
pub fn describe(job: &Job) -> String {
    let src = match &job.src {
        Src::Local { path, size } => format!("{} ({size} bytes)", path.display()),
        Src::Remote { remote, size, .. } => format!("{} ({size} bytes)", remote.url()),
        Src::Stdin => "-".into(),
        Src::Dir => "(directory)".into(),
        Src::Unreadable { path, .. } => format!("{} (a directory not readable)", path.display()),
    };
    let dst = match &job.dst {
        Dst::Local(p) => p.display().to_string(),
        Dst::Remote(r) => r.url(),
        Dst::Stdout => "-".into(),
    };
    format!("{src} -> {dst}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(ex: &[&str], inc: &[&str]) -> Filter {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Filter::new(&v(ex), &v(inc)).unwrap().unwrap()
    }

    #[test]
    fn excludes_then_includes() {
        let tmp = f(&["*.tmp", "cache/*"], &[]);
        assert!(!tmp.keeps("/home/u/src/a.tmp"));
        assert!(!tmp.keeps("src/cache/x/y.bin"));
        assert!(tmp.keeps("/home/u/src/a.txt"));
        assert!(tmp.keeps("/home/u/mycache.txt"));
        let only_txt = f(&["*"], &["*.txt"]);
        assert!(only_txt.keeps("d/a.txt") && !only_txt.keeps("d/a.bin"));
        assert!(Filter::new(&[], &["*.txt".into()]).unwrap().is_none());
        assert!(Filter::new(&["a[".into()], &[]).is_err());
    }
}
