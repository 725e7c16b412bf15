//! Mount options as FUSE filesystems take them: `-o ro,allow_other,uid=1000,umask=022`.
//!
//! `bucketfs mount -o OPTS` and the mount(8) helper ([`crate::fstab`]) share one translation,
//! [`option_flags`]: each `key=value` becomes `--key value` and `key` becomes `--key`
//! (underscores turn into dashes, so every `bucketfs mount` flag is also an option), `ro`
//! means `--read-only`, and the generic options of mount(8), fstab and systemd are dropped.
//! [`expand_argv`] does it for `bucketfs mount` before clap sees the arguments, so an option
//! and its flag are one thing and cannot disagree.
//!
//! [`AccessArgs`] are the ownership and permission flags (`--uid`, `--gid`, `--file-mode`,
//! `--dir-mode`, `--umask`, as mountpoint-s3, gcsfuse, s3fs and rclone have them) and the
//! FUSE access options `--allow-root` and `--auto-unmount`.

use std::ffi::OsString;

use clap::Args;

/// Options of mount(8), fstab, systemd and FUSE that mean nothing to bucketfs: the kernel
/// mount is always nodev, nosuid, noatime, and always checks permissions itself
/// (`default_permissions`).
const IGNORED: [&str; 23] = [
    "defaults",
    "auto",
    "noauto",
    "_netdev",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "nofail",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "async",
    "sync",
    "atime",
    "noatime",
    "relatime",
    "default_permissions",
    "nonempty",
];

/// Ownership and permissions shown for every file and directory, and who may use the mount.
#[derive(Args, Clone, Debug, Default)]
pub struct AccessArgs {
    /// Mount options, comma-separated, as fstab takes them: ro, rw, allow_other, allow_root,
    /// auto_unmount, uid=N, gid=N, umask=022, file_mode=0644, dir_mode=0755, and any
    /// bucketfs flag as key=value (metadata_ttl=5). x-systemd.*, _netdev, noauto, nofail,
    /// user, users and default_permissions are accepted and ignored.
    #[arg(short = 'o', value_name = "OPTIONS")]
    #[allow(dead_code)] // expanded into flags by `expand_argv` before clap parses
    pub options: Vec<String>,
    /// Owner of every file and directory (default: the user who mounts).
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,
    /// Group of every file and directory (default: the mounting user's group).
    #[arg(long, value_name = "GID")]
    pub gid: Option<u32>,
    /// Permission bits of files, octal (default 0644, or 0666 minus --umask).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub file_mode: Option<u16>,
    /// Permission bits of directories, octal (default 0755, or 0777 minus --umask).
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub dir_mode: Option<u16>,
    /// Bits taken away from the default file (0666) and directory (0777) modes, octal.
    #[arg(long, value_name = "MASK", value_parser = parse_mode)]
    pub umask: Option<u16>,
    /// Let root use the mount too (FUSE's allow_root).
    #[arg(long)]
    pub allow_root: bool,
    /// Unmount when the mount process dies, even by SIGKILL (FUSE's auto_unmount, done by
    /// fusermount3); needs --allow-root or --allow-other.
    #[arg(long)]
    pub auto_unmount: bool,
}

impl AccessArgs {
    /// (file mode, directory mode): explicit modes win, then the umask, then 0644/0755.
    pub fn modes(&self) -> (u16, u16) {
        let (file, dir) = match self.umask {
            Some(m) => (0o666 & !m, 0o777 & !m),
            None => (0o644, 0o755),
        };
        (self.file_mode.unwrap_or(file), self.dir_mode.unwrap_or(dir))
    }

    /// (uid, gid) shown as every entry's owner.
    pub fn owner(&self) -> (u32, u32) {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        (self.uid.unwrap_or(uid), self.gid.unwrap_or(gid))
    }

    /// auto_unmount is done by fusermount3, which needs allow_root or allow_other for it.
    pub fn check(&self, allow_other: bool) -> Result<(), String> {
        if self.auto_unmount && !self.allow_root && !allow_other {
            return Err("auto_unmount needs allow_root or allow_other as well (-o auto_unmount,allow_root)".into());
        }
        Ok(())
    }
}

/// An octal mode: `0644`, `644` or `0o644`, at most 07777.
pub fn parse_mode(s: &str) -> Result<u16, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    u16::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode (for example 0644)"))
}

/// The `bucketfs mount` flags for one comma-separated `-o` list.
pub fn option_flags(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for opt in list.split(',').filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        if IGNORED.contains(&key) || key.starts_with("x-") || key == "comment" {
            continue;
        }
        if key == "ro" || key == "read_only" {
            out.push("--read-only".into());
            continue;
        }
        if key == "rw" {
            // The last of `ro` and `rw` wins, as in mount(8) (`mount -o rw` over an fstab
            // `ro` passes `ro,rw`).
            out.retain(|f| f != "--read-only");
            continue;
        }
        if key.is_empty() || key.starts_with('-') {
            return Err(format!("mount option {opt:?} is not key or key=value"));
        }
        out.push(format!("--{}", key.replace('_', "-")));
        if let Some(v) = value {
            out.push(v.to_string());
        }
    }
    Ok(out)
}

/// `bucketfs mount ... -o OPTS ...` with every `-o OPTS` (or `-oOPTS`) replaced by its flags.
/// Arguments after `--` are left alone.
pub fn expand_argv(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if argv.get(1).is_none_or(|a| a != "mount") {
        return Ok(argv);
    }
    let mut out = Vec::with_capacity(argv.len());
    let mut it = argv.into_iter();
    out.extend(it.by_ref().take(2));
    while let Some(a) = it.next() {
        let list = match a.to_str() {
            Some("--") => {
                out.push(a);
                out.extend(it.by_ref());
                break;
            }
            Some("-o") => it.next().ok_or("-o needs a value, for example -o ro,allow_other")?,
            Some(s) if s.starts_with("-o") => OsString::from(&s[2..]),
            _ => {
                out.push(a);
                continue;
            }
        };
        let list = list.into_string().map_err(|l| format!("mount options {l:?} are not UTF-8"))?;
        let last_of =
            |keys: &[&str]| list.split(',').enumerate().filter(|(_, o)| keys.contains(o)).map(|(i, _)| i).last();
        if last_of(&["rw"]) > last_of(&["ro", "read_only"]) {
            // `rw` after an earlier `--read-only` or `-o ro` undoes it too (tester H).
            out.retain(|a| a != "--read-only");
        }
        out.extend(option_flags(&list)?.into_iter().map(OsString::from));
    }
    Ok(out)
}

/// The `-o` option of `argv` (before [`expand_argv`]) that became `flag`, if one did: a
/// flag bucketfs does not know is then named as the option the user wrote.
pub fn option_for_flag(argv: &[OsString], flag: &str) -> Option<String> {
    let mut lists = Vec::new();
    let mut it = argv.iter().map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        match a.as_ref() {
            "--" => break,
            "-o" => lists.extend(it.next().map(|l| l.into_owned())),
            s if s.starts_with("-o") => lists.push(s[2..].to_string()),
            _ => {}
        }
    }
    lists.iter().flat_map(|l| l.split(',').map(str::to_string).collect::<Vec<_>>()).find(|opt| {
        let key = opt.split_once('=').map_or(opt.as_str(), |(k, _)| k);
        option_flags(key).is_ok_and(|f| f.first().is_some_and(|f| f == flag))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(s: &str) -> Result<String, String> {
        let argv = s.split_whitespace().map(OsString::from).collect();
        Ok(expand_argv(argv)?.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" "))
    }

    #[test]
    fn dash_o_becomes_flags() {
        assert_eq!(
            expand("bucketfs mount -o ro,allow_other s3://b /m").unwrap(),
            "bucketfs mount --read-only --allow-other s3://b /m"
        );
        assert_eq!(
            expand("bucketfs mount s3://b /m -ouid=1000,gid=100,umask=022,file_mode=0640 -o dir_mode=750").unwrap(),
            "bucketfs mount s3://b /m --uid 1000 --gid 100 --umask 022 --file-mode 0640 --dir-mode 750"
        );
        assert_eq!(
            expand("bucketfs mount -o rw,_netdev,noauto,nofail,user,users,x-systemd.automount,default_permissions,allow_root,auto_unmount s3://b /m").unwrap(),
            "bucketfs mount --allow-root --auto-unmount s3://b /m"
        );
        // Other subcommands and what follows `--` are not touched.
        assert_eq!(expand("bucketfs cp -o a b").unwrap(), "bucketfs cp -o a b");
        assert_eq!(expand("bucketfs mount s3://b -- -o").unwrap(), "bucketfs mount s3://b -- -o");
        assert!(expand("bucketfs mount s3://b /m -o").unwrap_err().contains("needs a value"));
        assert!(expand("bucketfs mount s3://b /m -o =3").is_err());
        // The last of ro and rw wins.
        assert_eq!(expand("bucketfs mount -o ro,rw s3://b /m").unwrap(), "bucketfs mount s3://b /m");
        assert_eq!(expand("bucketfs mount -o rw,ro s3://b /m").unwrap(), "bucketfs mount --read-only s3://b /m");
        // Across flags and lists too (tester H: `--read-only -o rw` stayed read-only).
        assert_eq!(expand("bucketfs mount --read-only -o rw s3://b /m").unwrap(), "bucketfs mount s3://b /m");
        assert_eq!(expand("bucketfs mount -o ro -o uid=1,rw s3://b /m").unwrap(), "bucketfs mount --uid 1 s3://b /m");
        assert_eq!(
            expand("bucketfs mount -o rw --read-only s3://b /m").unwrap(),
            "bucketfs mount --read-only s3://b /m"
        );
    }

    #[test]
    fn modes_come_from_flags_then_umask_then_defaults() {
        let mut a = AccessArgs::default();
        assert_eq!(a.modes(), (0o644, 0o755));
        a.umask = Some(0o027);
        assert_eq!(a.modes(), (0o640, 0o750));
        a.file_mode = Some(0o600);
        assert_eq!(a.modes(), (0o600, 0o750));
        a.uid = Some(1234);
        assert_eq!(a.owner().0, 1234);
        assert_eq!(parse_mode("0o755"), Ok(0o755));
        assert_eq!(parse_mode("644"), Ok(0o644));
        assert!(parse_mode("0888").is_err() && parse_mode("17777").is_err());
    }

    #[test]
    fn auto_unmount_needs_an_acl() {
        let mut a = AccessArgs { auto_unmount: true, ..AccessArgs::default() };
        assert!(a.check(false).is_err());
        assert!(a.check(true).is_ok());
        a.allow_root = true;
        assert!(a.check(false).is_ok());
    }

    /// An option bucketfs does not know is named as written (tester E: `-o nonsense` was
    /// told to use `-- --nonsense`).
    #[test]
    fn an_unknown_flag_is_traced_to_its_option() {
        let argv = |s: &str| s.split_whitespace().map(OsString::from).collect::<Vec<_>>();
        let given = argv("bucketfs mount s3://b /m -o uid=1,no_such=3 -onothing");
        assert_eq!(option_for_flag(&given, "--no-such").as_deref(), Some("no_such=3"));
        assert_eq!(option_for_flag(&given, "--nothing").as_deref(), Some("nothing"));
        assert_eq!(option_for_flag(&given, "--bogus"), None, "a flag given as a flag");
    }
}
