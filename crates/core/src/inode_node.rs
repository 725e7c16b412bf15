//! One node of the inode table ([`Node`]), the version of a file it stands for
//! ([`Version`]), and a child as the store reported it ([`ChildMeta`]).

use std::time::{Instant, SystemTime};

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A symbolic link (see [`crate::links`]).
    Symlink,
}

/// What we know of one file or directory.
#[derive(Debug, Clone)]
pub struct Node {
    pub ino: u64,
    pub parent: u64,
    pub name: String,
    pub kind: Kind,
    /// Full key relative to the store root; directories end with `/`, the root is `""`.
    pub key: String,
    pub size: u64,
    pub mtime: SystemTime,
    /// Which version of the object this node is: a cached byte is only valid for it.
    pub version: Version,
    /// When size/mtime/etag were last confirmed by the store.
    pub validated: Instant,
    pub lookups: u64,
    /// chmod/chown set here or carried by the object (SEMANTICS.md: persisted as object
    /// metadata where the store keeps it).
    pub perm: Option<u16>,
    pub owner: Option<(u32, u32)>,
    /// Identity of the version whose pages the kernel may still cache (set at open).
    pub kernel_cached: Option<String>,
    /// Opens answered without `FOPEN_KEEP_CACHE` whose first read or release has not come
    /// yet: the kernel drops its cached pages as it finishes such an open, so until then
    /// it may still hold an older version's, and no other open may keep them.
    pub kernel_dropping: u32,
    /// An mtime set by utimens here or carried by the object; shown instead of the
    /// object's Last-Modified until the object is changed by someone else.
    pub mtime_set: Option<SystemTime>,
    /// `perm`, `owner` or `mtime_set` was set here (chmod, chown, utimens, a create's or
    /// mkdir's mode other than the default): kept with the node for the life of the mount,
    /// where the store's listings, which carry no attributes, could not bring it back.
    /// Attributes a HEAD found on the object are not: they go with the node and the next
    /// HEAD finds them again (until then the parent's cached entry keeps them).
    pub attrs_here: bool,
    /// Whether a path still leads here; false once unlinked, replaced or deleted behind the
    /// mount while the kernel still holds the inode (it then shows `st_nlink` 0).
    pub linked: bool,
    /// The mount owns this file's size, mtime and identity: it has staged bytes (open for
    /// writing, or written and not yet closed). What a listing or HEAD says of the object
    /// then is older than what the mount holds, so [`super::InodeTable::upsert`] never lays it over
    /// this node (SEMANTICS.md, "The mount's own state wins"). Set and cleared by the staging
    /// code with the staged map's entry.
    pub local: bool,
    /// File handles open on it here ([`crate::Fs`] counts them at open and release).
    pub opens: u32,
    /// Split off when another client replaced the file while handles were open on it
    /// ([`Node::replaced_by`]): the name leads to a newer inode, and an open of this one
    /// (through a kernel entry not yet looked up again) is answered `ESTALE`.
    pub replaced: bool,
    /// When chmod, chown or utimens last changed it here (Linux moves ctime on every
    /// attribute change); `None`: ctime is shown equal to mtime.
    pub ctime: Option<SystemTime>,
    /// The store could not tell the size without reading the object: `size` is a
    /// placeholder until a HEAD answers it (see `Fs::open`, which opens such a file direct).
    pub size_unknown: bool,
    /// The ticket ([`super::InodeTable::ask`]) of the newest store answer recorded here: one sent
    /// earlier and answered later is older news, and `upsert` does not lay it over this.
    pub answered: u64,
    /// [`Node::version_mark`] of the version whose attributes are known: a HEAD found
    /// them (or none), or this mount uploaded it with them (`Fs::open` does not ask again
    /// for it); 0: none asked.
    pub attrs_asked: u32,
    /// What another client stored with the object (headers, user metadata: a HEAD found
    /// them), sent again with each upload of the file.
    pub foreign: Option<std::sync::Arc<bucketfs_store::attrs::Foreign>>,
}

impl Node {
    /// This node as an entry of its parent's listing.
    pub fn entry(&self) -> ChildMeta {
        ChildMeta {
            name: self.name.clone(),
            kind: self.kind,
            size: self.size,
            mtime: self.mtime,
            etag: self.version.tag().map(str::to_owned),
            attrs: self.has_attrs().then(|| self.attrs()),
            size_unknown: self.size_unknown,
            asked: 0,
        }
    }

    /// Whether `meta` describes another version of this file than the one the node holds
    /// (the object was replaced by another client) while handles are open on it. Then the
    /// new version gets a new inode (`upsert`): the kernel keeps one page cache per inode,
    /// so a reader still open on the old version read the new version's pages once another
    /// process had read them (a mix of two files), and its `fstat` showed the new size. As
    /// on a local disk when a file is replaced by a rename, the old inode stays with its
    /// handles (`st_nlink` 0) and the name leads to the new one. With no handle open the
    /// node takes the new version (the next open drops the kernel's cached pages). Files
    /// staged here never split (`local`: their attributes are the mount's own), nor a
    /// version whose identity is not known (a file this mount just moved: `Fs::rename`).
    pub fn replaced_by(&self, meta: &ChildMeta) -> bool {
        self.kind == Kind::File
            && self.opens > 0
            && !self.local
            && self.version.tag().is_some()
            && meta.etag.is_some()
            && self.version.tag() != meta.etag.as_deref()
    }

    /// Whether an answer to a request sent at ticket `asked` (0: not ticketed) is older
    /// news than the one this node holds (`answered`): the one rule `upsert` and a HEAD's
    /// revalidation both apply.
    pub fn holds_newer_than(&self, asked: u64) -> bool {
        asked != 0 && asked < self.answered
    }

    /// The object was replaced by someone else: drop what we knew of its attributes.
    pub fn forget_attrs(&mut self) {
        self.attrs_here = false;
        self.perm = None;
        self.owner = None;
        self.mtime_set = None;
        self.foreign = None;
    }

    /// Take the attributes the object carries, where none is known here yet. Not its mtime
    /// while the mount owns the file's (`local`: written here since, the object's is older).
    pub fn fill_attrs(&mut self, a: &bucketfs_store::FileAttrs) {
        if self.perm.is_none() {
            self.perm = a.mode.map(|m| (m & 0o7777) as u16);
        }
        if self.owner.is_none() {
            self.owner = a.uid.zip(a.gid);
        }
        if self.mtime_set.is_none() && !self.local {
            self.mtime_set = a.mtime;
        }
        if a.foreign.is_some() {
            self.foreign = a.foreign.clone();
        }
    }

    /// The bytes changed here (a write, a truncate): the mtime is now's, also where one was
    /// set (`touch`, `cp -p`, `tar x`) or carried by the object, and the upload carries it
    /// (Drive keeps an old `mtime` property an upload without one leaves). Before, a set
    /// mtime stayed for good: an edit after `rsync -a` was never backed up, `make` built
    /// stale outputs.
    pub fn written_at(&mut self, now: SystemTime) {
        self.mtime = now;
        if self.mtime_set.is_some() {
            self.mtime_set = Some(now);
        }
    }

    /// Whether a store's answer (`etag`, `size`) is of the version this node holds: its
    /// ETag, or on a store without ETags (a local folder) its size.
    pub fn holds_version(&self, etag: Option<&str>, size: u64) -> bool {
        self.version.tag() == etag && (etag.is_some() || self.size == size)
    }

    /// Whether `etag` is the ETag of the version held. The mtime known of that version is
    /// then kept: a listing's is the upload's time (S3: to the millisecond), not the last
    /// write's here (vim then refused to save: "changed since reading it").
    pub fn same_tag(&self, etag: Option<&str>) -> bool {
        etag.is_some() && self.version.tag() == etag
    }

    /// A nonzero mark of the version held ([`Node::holds_version`]'s terms), small enough
    /// to keep on every node.
    pub fn version_mark(&self) -> u32 {
        let tag = self.version.tag().unwrap_or("");
        crc32c::crc32c_append(crc32c::crc32c(tag.as_bytes()), &self.size.to_le_bytes()) | 1
    }

    /// Whether it shows any attribute of its own (set here or carried by the object).
    pub fn has_attrs(&self) -> bool {
        self.perm.is_some() || self.owner.is_some() || self.mtime_set.is_some()
    }

    /// The attributes to keep with the object at its next upload.
    pub fn attrs(&self) -> bucketfs_store::FileAttrs {
        let type_bits = if self.kind == Kind::Dir { 0o040000 } else { 0o100000 };
        bucketfs_store::FileAttrs {
            mode: self.perm.map(|p| type_bits | p as u32),
            uid: self.owner.map(|o| o.0),
            gid: self.owner.map(|o| o.1),
            mtime: self.mtime_set,
            created_by: None,
            foreign: self.foreign.clone(),
        }
    }

    /// Names this version of the object for caches: the ETag/generation, or size and mtime
    /// on stores without one (local fs).
    pub fn identity(&self) -> String {
        match &self.version {
            Version::Tag(e) => e.clone(),
            Version::Untagged | Version::Unknown => {
                let t = self.mtime.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                format!("{}-{}.{}", self.size, t.as_secs(), t.subsec_nanos())
            }
        }
    }
}

/// Which version of a file's object a node is (issue 42: one meaning per state, where an
/// `Option` meant both "the store keeps no tag" and "not known yet").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// The store's ETag or generation: reads are pinned to it (`If-Match`).
    Tag(String),
    /// The store keeps no tag (a local folder): size and mtime stand in ([`Node::identity`]).
    Untagged,
    /// This mount moved the object and has not learned the copy's tag yet (`Fs::rename`):
    /// the next open asks the store before reading, so reads are pinned again.
    Unknown,
}

impl Version {
    /// What a store's answer says.
    pub fn from_store(etag: Option<&str>) -> Self {
        etag.map_or(Version::Untagged, |e| Version::Tag(e.to_string()))
    }

    /// The tag to pin reads to, if known.
    pub fn tag(&self) -> Option<&str> {
        match self {
            Version::Tag(t) => Some(t),
            Version::Untagged | Version::Unknown => None,
        }
    }

    /// Whether a store's answer with `etag` is another object than this version, one
    /// someone else put (so it carries its own attributes). Not after this mount's own move
    /// (`Unknown`): the copy carries the attributes.
    pub fn other_than(&self, etag: Option<&str>) -> bool {
        *self != Version::Unknown && self.tag() != etag
    }

    /// Merge a listing's entry (`etag`) in: a listing of a store that keeps tags shows one
    /// (so `Unknown` is learned), and an entry without one (this mount's own, relisted)
    /// says nothing new of a version not known yet.
    pub(super) fn merged(&self, etag: Option<&str>) -> Self {
        match (self, etag) {
            (Version::Unknown, None) => Version::Unknown,
            (_, e) => Version::from_store(e),
        }
    }
}

/// One child as a listing or lookup reported it, before it has an inode.
#[derive(Debug, Clone)]
pub struct ChildMeta {
    pub name: String,
    pub kind: Kind,
    pub size: u64,
    pub mtime: SystemTime,
    pub etag: Option<String>,
    /// Mode, owner and mtime the object carries (from a HEAD; listings have none).
    pub attrs: Option<bucketfs_store::FileAttrs>,
    /// `size` is a placeholder the store cannot tell without reading (a Drive Doc's export;
    /// `ObjectMeta::size_unknown`).
    pub size_unknown: bool,
    /// The ticket ([`super::InodeTable::ask`]) of the request this answer came from; 0: not the
    /// store's answer (the mount's own state, a store event), applied whatever came before.
    pub asked: u64,
}
