//! The mount helper: `mount -t fuse.bucketfs URL DIR -o opts` and `/etc/fstab` lines.
//!
//! mount(8) runs `/sbin/mount.fuse.bucketfs URL DIR [-n] [-s] [-v] [-o OPTS]`. When the
//! binary is called by that name (a symlink to it), [`helper_args`] turns the call into
//! `bucketfs mount URL DIR --flags`, translating the options as `bucketfs mount -o` does
//! ([`mount_opts::option_flags`]: `uid=1000` becomes `--uid 1000`, `ro` `--read-only`, and
//! the generic options of mount(8), fstab and systemd are dropped).
//!
//! Under `x-systemd.automount` the mount point is already an autofs mount when this runs;
//! [`crate::checks::mountpoint`] lets bucketfs mount over autofs.

use crate::mount_opts;

/// Names the binary answers to as a mount helper.
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.bucketfs", "mount.bucketfs"];

/// Is this a call as the mount helper (by `argv[0]`)?
pub fn is_helper(argv0: &str) -> bool {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    HELPER_NAMES.contains(&base)
}

/// `argv` of a helper call (argv[0] included) as `bucketfs mount ...` arguments, or `None`
/// for a fake mount (`-f`: mount(8) wants only the mtab entry; nothing to do).
pub fn helper_args(argv: &[String]) -> Result<Option<Vec<String>>, String> {
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => opts.push(it.next().ok_or("-o needs a value")?.clone()),
            o if o.starts_with("-o") => opts.push(o[2..].to_string()),
            "-f" => return Ok(None),
            // no mtab, sloppy, verbose: nothing for bucketfs to do
            "-n" | "-s" | "-v" => {}
            "-t" => {
                it.next();
            }
            o if o.starts_with('-') => return Err(format!("unknown mount helper argument {o:?}")),
            _ => positional.push(a.clone()),
        }
    }
    let [url, dir] = positional.as_slice() else {
        return Err(format!("usage: {} URL MOUNTPOINT [-o key=value,...]", HELPER_NAMES[0]));
    };
    let mut out = vec!["bucketfs".to_string(), "mount".to_string(), url.clone(), dir.clone()];
    for list in &opts {
        for opt in list.split(',') {
            let key = opt.split_once('=').map_or(opt, |(k, _)| k);
            if matches!(key, "foreground" | "f" | "help" | "h" | "version" | "V") {
                return Err(format!("option {key:?} cannot be used from mount(8) or fstab"));
            }
        }
        out.extend(mount_opts::option_flags(list)?);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn translates_fstab_options() {
        let got = helper_args(&args(
            "/sbin/mount.fuse.bucketfs s3://b/p /mnt/b -o rw,endpoint=http://127.0.0.1:9000,anonymous,read_only,allow_other,metadata_ttl=2,noauto,_netdev,user,nofail,defaults",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            got.join(" "),
            "bucketfs mount s3://b/p /mnt/b --endpoint http://127.0.0.1:9000 --anonymous --read-only --allow-other --metadata-ttl 2"
        );
    }

    #[test]
    fn accepts_mount8_flags_and_joined_options() {
        let got = helper_args(&args(
            "mount.bucketfs mem:// /m -n -s -v -oro,x-systemd.automount,disk_cache_mib=0 -o comment=x",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(got.join(" "), "bucketfs mount mem:// /m --read-only --disk-cache-mib 0");
        assert_eq!(helper_args(&args("mount.fuse.bucketfs mem:// /m -f -o rw")).unwrap(), None);
        let got = helper_args(&args(
            "mount.fuse.bucketfs s3://b /m -o uid=1000,gid=1000,umask=027,allow_root,auto_unmount,default_permissions,x-systemd.requires=network-online.target",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            got.join(" "),
            "bucketfs mount s3://b /m --uid 1000 --gid 1000 --umask 027 --allow-root --auto-unmount"
        );
    }

    #[test]
    fn rejects_what_cannot_work() {
        assert!(helper_args(&args("mount.fuse.bucketfs mem://")).unwrap_err().contains("usage"));
        assert!(helper_args(&args("mount.fuse.bucketfs mem:// /m -o foreground")).is_err());
        assert!(helper_args(&args("mount.fuse.bucketfs mem:// /m -o")).is_err());
        assert!(helper_args(&args("mount.fuse.bucketfs mem:// /m -x")).is_err());
        assert!(helper_args(&args("mount.fuse.bucketfs mem:// /m -o ro,foreground")).is_err());
    }

    #[test]
    fn knows_its_names() {
        assert!(is_helper("/sbin/mount.fuse.bucketfs"));
        assert!(is_helper("mount.bucketfs"));
        assert!(!is_helper("/usr/bin/bucketfs"));
    }
}
