//! The whole Drive tree in memory: files by ID, and the path each is shown at.
//!
//! Drive is ID-based: a folder may hold several items with one name, names may contain
//! `/`, and Google Docs have no bytes of their own. The mapping to paths (the contract is
//! in docs/SEMANTICS.md):
//! - `/` in a name is shown as `／` (U+FF0F), and mapped back when creating;
//! - items sharing a name in one folder are ordered by (createdTime, ID): the first keeps
//!   the plain name, the others are shown as `stem~ID8.ext` (the first 8 characters of the
//!   ID), so each keeps its path while the others come and go;
//! - Google Docs/Sheets/Slides are shown with the extension of their export format
//!   (`.docx`, `.xlsx`, `.pptx`), or hidden; other Google types (forms, shortcuts...) are
//!   hidden;
//! - trashed items are never in the tree.

use std::collections::HashMap;
use std::time::SystemTime;

use serde::Deserialize;

pub const FOLDER: &str = "application/vnd.google-apps.folder";
const GOOGLE_APPS: &str = "application/vnd.google-apps.";

/// Export format of each Google Docs editors type: (Drive type, export MIME type, extension).
pub const EXPORTS: [(&str, &str, &str); 3] = [
    (
        "application/vnd.google-apps.document",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        ".docx",
    ),
    (
        "application/vnd.google-apps.spreadsheet",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        ".xlsx",
    ),
    (
        "application/vnd.google-apps.presentation",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        ".pptx",
    ),
];

/// A Drive file resource, with the fields we ask for.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct File {
    pub id: String,
    pub name: String,
    pub mime_type: String,
    pub parents: Vec<String>,
    pub size: Option<String>,
    pub md5_checksum: Option<String>,
    pub modified_time: Option<String>,
    pub created_time: Option<String>,
    pub version: Option<String>,
    pub trashed: bool,
    /// The shared drive the item is in (None: My Drive).
    pub drive_id: Option<String>,
    /// Public key-value pairs; bucketfs keeps file attributes here (`mode`, `uid`, `gid`,
    /// `mtime`: the names of [`crate::FileAttrs`]).
    pub properties: HashMap<String, String>,
}

/// The `fields` selector matching [`File`].
pub const FILE_FIELDS: &str =
    "id,name,mimeType,parents,size,md5Checksum,modifiedTime,createdTime,version,trashed,properties,driveId";

impl File {
    pub fn is_folder(&self) -> bool {
        self.mime_type == FOLDER
    }

    /// `(export MIME type, extension)` for a Google Docs editors file.
    pub fn export(&self) -> Option<(&'static str, &'static str)> {
        EXPORTS.iter().find(|(t, _, _)| *t == self.mime_type).map(|(_, m, e)| (*m, *e))
    }

    pub fn is_google_type(&self) -> bool {
        self.mime_type.starts_with(GOOGLE_APPS) && !self.is_folder()
    }

    pub fn size(&self) -> u64 {
        self.size.as_deref().and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    pub fn mtime(&self) -> Option<SystemTime> {
        let t: jiff::Timestamp = self.modified_time.as_deref()?.parse().ok()?;
        Some(t.into())
    }

    /// Our identity for the content. A file with binary content: its id and MD5, so a
    /// rename, `chmod` or `touch` (which raise Drive's `version`, as every change does)
    /// keeps what is cached of it; otherwise (Google Docs have no MD5) its `version`.
    pub fn etag(&self) -> String {
        match self.md5_checksum.as_deref() {
            Some(md5) => format!("{}.md5-{md5}", self.id),
            None => format!("{}.{}", self.id, self.version.as_deref().unwrap_or("0")),
        }
    }
}

/// A Drive name as a path segment (see the module docs).
pub fn shown_name(name: &str) -> String {
    let n = name.replace('/', "／");
    match n.as_str() {
        "" => "_".into(),
        "." | ".." => n.replace('.', "．"),
        _ => n,
    }
}

/// A path segment back to a Drive name.
pub fn drive_name(segment: &str) -> String {
    segment.replace('／', "/")
}

fn with_suffix(name: &str, id: &str) -> String {
    let tag: String = id.chars().take(8).collect();
    match name.rfind('.') {
        Some(i) if i > 0 => format!("{}~{tag}{}", &name[..i], &name[i..]),
        _ => format!("{name}~{tag}"),
    }
}

/// The files of a Drive and the key (path under the mounted folder) of each visible one.
#[derive(Default)]
pub struct Tree {
    root: String,
    hide_docs: bool,
    files: HashMap<String, File>,
    by_key: HashMap<String, String>,
    /// Keys of each folder's children, in order, by folder key (`""` is the root).
    children: HashMap<String, Vec<String>>,
}

impl Tree {
    pub fn new(root: String, hide_docs: bool) -> Self {
        Self { root, hide_docs, ..Default::default() }
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// Record a file as Drive now reports it (trashed means gone). An answer older than
    /// what the tree holds (a changes page fetched before our own upload's answer was
    /// learned) is ignored: it would put the file back on an older version.
    pub fn upsert(&mut self, f: File) {
        let version = |f: &File| f.version.as_deref().and_then(|v| v.parse::<u64>().ok());
        if let (Some(new), Some(held)) = (version(&f), self.files.get(&f.id).and_then(version)) {
            if new < held {
                return;
            }
        }
        if f.trashed {
            self.files.remove(&f.id);
        } else {
            self.files.insert(f.id.clone(), f);
        }
    }

    pub fn remove(&mut self, id: &str) {
        self.files.remove(id);
    }

    pub fn lookup(&self, key: &str) -> Option<&File> {
        self.by_key.get(key).and_then(|id| self.files.get(id))
    }

    /// The key a file is shown at (folders end with `/`).
    pub fn key_of(&self, id: &str) -> Option<&str> {
        self.by_key.iter().find(|(_, v)| *v == id).map(|(k, _)| k.as_str())
    }

    /// Direct children keys of the folder at `dir_key`, or every descendant.
    pub fn list(&self, dir_key: &str, recursive: bool) -> Vec<(String, File)> {
        let mut out = Vec::new();
        let mut todo = vec![dir_key.to_string()];
        while let Some(d) = todo.pop() {
            for k in self.children.get(&d).into_iter().flatten() {
                let f = &self.files[&self.by_key[k]];
                out.push((k.clone(), f.clone()));
                if recursive && f.is_folder() {
                    todo.push(k.clone());
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Recompute every path from the files (after a load or a batch of changes).
    pub fn rebuild(&mut self) {
        let mut kids: HashMap<&str, Vec<&File>> = HashMap::new();
        for f in self.files.values() {
            if f.is_google_type() && (self.hide_docs || f.export().is_none()) {
                continue;
            }
            for p in &f.parents {
                kids.entry(p.as_str()).or_default().push(f);
            }
        }
        let (mut by_key, mut children) = (HashMap::new(), HashMap::new());
        let mut seen_folders = std::collections::HashSet::new();
        let mut todo = vec![(self.root.clone(), String::new())];
        while let Some((folder, key)) = todo.pop() {
            let mut named: Vec<(String, &File)> = kids
                .get(folder.as_str())
                .into_iter()
                .flatten()
                .map(|f| (shown_name(&format!("{}{}", f.name, f.export().map_or("", |e| e.1))), *f))
                .collect();
            named.sort_by(|a, b| (&a.0, &a.1.created_time, &a.1.id).cmp(&(&b.0, &b.1.created_time, &b.1.id)));
            let mut list = Vec::with_capacity(named.len());
            for (i, (name, f)) in named.iter().enumerate() {
                let dup = i > 0 && named[i - 1].0 == *name;
                let shown = if dup { with_suffix(name, &f.id) } else { name.clone() };
                let k = if f.is_folder() { format!("{key}{shown}/") } else { format!("{key}{shown}") };
                // A folder reachable twice (several parents, or a cycle) is shown once.
                if f.is_folder() {
                    if !seen_folders.insert(f.id.clone()) {
                        continue;
                    }
                    todo.push((f.id.clone(), k.clone()));
                }
                by_key.insert(k.clone(), f.id.clone());
                list.push(k);
            }
            children.insert(key, list);
        }
        self.by_key = by_key;
        self.children = children;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: &str, name: &str, parent: &str, created: &str, mime: &str) -> File {
        File {
            id: id.into(),
            name: name.into(),
            mime_type: mime.into(),
            parents: vec![parent.into()],
            created_time: Some(created.into()),
            ..Default::default()
        }
    }

    #[test]
    fn duplicates_docs_slashes_and_folders() {
        let mut t = Tree::new("R".into(), false);
        t.upsert(file("bbbbbbbbbb", "a.txt", "R", "2024-01-02T00:00:00Z", "text/plain"));
        t.upsert(file("aaaaaaaaaa", "a.txt", "R", "2024-01-01T00:00:00Z", "text/plain"));
        t.upsert(file("D1", "dir", "R", "2024-01-01T00:00:00Z", FOLDER));
        t.upsert(file("F1", "x/y", "D1", "2024-01-01T00:00:00Z", "text/plain"));
        t.upsert(file("G1", "Notes", "R", "2024-01-01T00:00:00Z", EXPORTS[0].0));
        t.upsert(file("S1", "form", "R", "2024-01-01T00:00:00Z", "application/vnd.google-apps.form"));
        let mut trashed = file("T1", "gone", "R", "2024-01-01T00:00:00Z", "text/plain");
        trashed.trashed = true;
        t.upsert(trashed);
        t.rebuild();
        let keys: Vec<String> = t.list("", true).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["Notes.docx", "a.txt", "a~bbbbbbbb.txt", "dir/", "dir/x／y"]);
        assert_eq!(t.lookup("a.txt").unwrap().id, "aaaaaaaaaa");
        assert_eq!(t.key_of("F1"), Some("dir/x／y"));

        let mut hidden = Tree::new("R".into(), true);
        hidden.upsert(file("G1", "Notes", "R", "2024-01-01T00:00:00Z", EXPORTS[0].0));
        hidden.rebuild();
        assert!(hidden.list("", true).is_empty());
    }

    #[test]
    fn an_older_answer_does_not_replace_a_newer_version() {
        let mut t = Tree::new("R".into(), false);
        let at = |v: &str, size: &str| File {
            version: Some(v.into()),
            size: Some(size.into()),
            ..file("F1", "f", "R", "2024-01-01T00:00:00Z", "text/plain")
        };
        t.upsert(at("6", "20"));
        t.upsert(at("5", "10")); // a changes page fetched before version 6 was learned
        t.rebuild();
        assert_eq!(t.lookup("f").map(|f| (f.etag(), f.size())), Some(("F1.6".into(), 20)));
        let md5 = |m: &str| File { md5_checksum: Some(m.into()), ..at("8", "30") };
        assert_eq!(md5("abc").etag(), "F1.md5-abc");
        assert_eq!(File { version: Some("9".into()), ..md5("abc") }.etag(), md5("abc").etag(), "same content");
        t.upsert(at("7", "30"));
        assert_eq!(t.lookup("f").map(|f| f.size()), Some(30));
    }
}
