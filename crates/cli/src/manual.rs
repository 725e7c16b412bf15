//! `bucketfs man` and `bucketfs completions SHELL`: the man page (roff, through
//! `clap_mangen`) and shell completion scripts (`clap_complete`), both generated from the
//! same clap definitions the binary parses, so they never fall behind its options.

use std::io::Write;

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
    fn completions_for_every_shell_name_mount_and_cp() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish, Shell::Elvish, Shell::PowerShell] {
            let script = text(completions(shell, crate::Cli::command()));
            assert!(!script.is_empty(), "{shell}");
            assert!(script.contains("mount") && script.contains("cp"), "{shell} script lacks mount or cp");
            assert!(script.contains("parallel"), "{shell} script lacks cp's --parallel");
        }
    }
}
