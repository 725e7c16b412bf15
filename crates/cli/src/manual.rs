//! `bucketfs man` and `bucketfs completions SHELL`: the man page (roff, through
//! `clap_mangen`) and shell completion scripts (`clap_complete`), both generated from the
//! same clap definitions the binary parses, so they never fall behind its options.
//! `bucketfs man --dir DIR` writes one page per subcommand as well (`bucketfs-mount.1`, as
//! git and cargo ship theirs), and `bucketfs man SUBCOMMAND` prints one of them.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// The man page of `cmd` in roff: the top-level page with its SUBCOMMANDS section, then
/// one section per subcommand with its options.
pub fn man(cmd: Command) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out).map_err(|e| format!("man page: {e}"))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("{}-{}", cmd.get_name(), sub.get_name());
        let page = clap_mangen::Man::new(sub.clone());
        writeln!(out, ".SH \"{}\"", name.to_uppercase()).map_err(|e| e.to_string())?;
        page.render_description_section(&mut out).map_err(|e| format!("man page: {e}"))?;
        page.render_options_section(&mut out).map_err(|e| format!("man page: {e}"))?;
    }
    Ok(out)
}

/// Write `bucketfs.1` and one page per visible subcommand, nested ones included
/// (`bucketfs-auth-gdrive.1`), into `dir`; returns the files written, sorted.
pub fn write_pages(cmd: Command, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    clap_mangen::generate_to(cmd.clone(), dir).map_err(|e| format!("writing man pages to {}: {e}", dir.display()))?;
    let mut names = Vec::new();
    page_names(&built(cmd), &mut names);
    let mut written: Vec<PathBuf> = names.into_iter().map(|n| dir.join(format!("{n}.1"))).collect();
    written.sort();
    Ok(written)
}

/// The page of one subcommand (`mount`, `cp`, or `auth-gdrive` for a nested one), as
/// [`write_pages`] writes it.
pub fn subcommand_page(cmd: Command, name: &str) -> Result<Vec<u8>, String> {
    let cmd = built(cmd);
    let mut sub = &cmd;
    for part in name.split(['-', ' ']) {
        sub = sub.get_subcommands().find(|s| s.get_name() == part && !s.is_hide_set()).ok_or_else(|| {
            let names: Vec<&str> = cmd.get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name()).collect();
            format!("no subcommand {name:?}; pages exist for: {}", names.join(", "))
        })?;
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(sub.clone()).render(&mut out).map_err(|e| format!("man page: {e}"))?;
    Ok(out)
}

/// `cmd` built as `clap_mangen::generate_to` builds it, so subcommands carry their
/// `bucketfs-NAME` display names.
fn built(cmd: Command) -> Command {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn page_names(cmd: &Command, out: &mut Vec<String>) {
    out.push(cmd.get_display_name().unwrap_or(cmd.get_name()).to_string());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        page_names(sub, out);
    }
}

/// The completion script of `cmd` for `shell`.
pub fn completions(shell: Shell, mut cmd: Command) -> Vec<u8> {
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut out);
    out
}

/// Print `bytes` to stdout.
pub fn print(bytes: &[u8]) -> Result<(), String> {
    std::io::stdout().lock().write_all(bytes).map_err(|e| format!("stdout: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn man_page_names_the_subcommands_and_their_options() {
        let page = text(man(crate::Cli::command()).unwrap());
        assert!(page.starts_with(".ie") || page.contains(".TH bucketfs"), "{}", &page[..200.min(page.len())]);
        for want in ["mount", "cp", "BUCKETFS-CP", "\\-\\-parallel", "\\-\\-metadata\\-ttl"] {
            assert!(page.contains(want), "man page lacks {want}");
        }
    }

    #[test]
    fn one_page_per_subcommand() {
        let dir = std::env::temp_dir().join(format!("bucketfs-man-{}", std::process::id()));
        let written = write_pages(crate::Cli::command(), &dir).unwrap();
        for name in ["bucketfs.1", "bucketfs-mount.1", "bucketfs-cp.1", "bucketfs-auth-gdrive.1", "bucketfs-man.1"] {
            assert!(written.contains(&dir.join(name)), "{name} not in {written:?}");
        }
        for p in &written {
            let page = std::fs::read_to_string(p).unwrap();
            let stem = p.file_stem().unwrap().to_str().unwrap();
            assert!(page.contains(&format!(".TH {stem} 1")), "{} has no .TH {stem}", p.display());
        }
        let cp = std::fs::read_to_string(dir.join("bucketfs-cp.1")).unwrap();
        assert!(cp.contains("\\-\\-parallel") && !cp.contains("\\-\\-metadata\\-ttl"), "cp's page has mount's flags");
        assert_eq!(text(subcommand_page(crate::Cli::command(), "cp").unwrap()), cp);
        assert!(subcommand_page(crate::Cli::command(), "auth-gdrive").unwrap().len() > 100);
        assert!(subcommand_page(crate::Cli::command(), "nope").unwrap_err().contains("mount"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_for_every_shell_name_mount_and_cp() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish, Shell::Elvish, Shell::PowerShell] {
            let script = text(completions(shell, crate::Cli::command()));
            assert!(!script.is_empty(), "{shell}");
            assert!(script.contains("mount") && script.contains("cp"), "{shell} script lacks mount or cp");
            assert!(script.contains("parallel"), "{shell} script lacks cp's --parallel");
        }
    }
}
