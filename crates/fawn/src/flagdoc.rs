//! The flag tables of docs/OPERATIONS.md, rendered from the command-line definitions so that
//! the document lists every flag with its real default.
//!
//! A table sits between `<!-- flags: SUBCOMMAND -->` and `<!-- /flags -->`. The test below fails
//! when a table differs from what the flags say; `FAWN_BLESS=1 cargo test -p fawn --bin fawn
//! flagdoc` rewrites the tables in place.

use std::fmt::Write as _;

use clap::CommandFactory;

use crate::args::Cli;

const BLOCK_START: &str = "<!-- flags:";
const BLOCK_END: &str = "<!-- /flags -->";

/// The table of one subcommand's flags (a nested one named by its path, `managers add`): name, default, help. Flags every subcommand takes
/// (logging) are listed once, under `fawn`.
pub fn render(subcommand: &str) -> Option<String> {
    let root = Cli::command();
    let mut command = root;
    if subcommand != "fawn" {
        for name in subcommand.split_whitespace() {
            command = command.find_subcommand(name)?.clone();
        }
    }
    let mut out = String::from("| flag | default | what it does |\n|---|---|---|\n");
    for arg in command.get_arguments() {
        let global = arg.is_global_set() && subcommand != "fawn";
        if arg.is_hide_set() || global || (arg.get_long().is_none() && !arg.is_positional()) {
            continue;
        }
        let value_name = arg.get_value_names().and_then(|names| names.first()).map(|name| name.to_string());
        let name = match arg.get_long() {
            Some(long) if arg.get_action().takes_values() => {
                format!("--{long} {}", value_name.unwrap_or_default())
            }
            Some(long) => format!("--{long}"),
            None => format!("<{}>", value_name.unwrap_or_else(|| arg.get_id().to_string().to_uppercase())),
        };
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|value| value.to_string_lossy().into_owned()).collect();
        let default = match defaults.join(",") {
            joined if joined.is_empty() => String::new(),
            joined => format!("`{joined}`"),
        };
        let mut help = arg.get_help().map(|help| help.to_string()).unwrap_or_default().replace('|', "\\|");
        if let Some(env) = arg.get_env() {
            let _ = write!(help, " (env `{}`)", env.to_string_lossy());
        }
        let _ = writeln!(out, "| `{}` | {default} | {help} |", name.trim_end());
    }
    Some(out)
}

/// The document with every flag table regenerated.
pub fn render_document(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.split_inclusive('\n');
    while let Some(line) = lines.next() {
        out.push_str(line);
        let Some(spec) = line.trim().strip_prefix(BLOCK_START) else { continue };
        let name = spec.trim().trim_end_matches("-->").trim();
        let end = loop {
            match lines.next() {
                Some(skipped) if skipped.trim() == BLOCK_END => break skipped,
                Some(_) => {}
                None => return Err(format!("flags block `{name}` has no `{BLOCK_END}`")),
            }
        };
        out.push_str(&render(name).ok_or_else(|| format!("no subcommand `{name}`"))?);
        out.push_str(end);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_md_lists_every_flag_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/OPERATIONS.md");
        let text = std::fs::read_to_string(path).expect("read docs/OPERATIONS.md");
        let rendered = render_document(&text).expect("render the flag tables");
        for subcommand in ["up", "manager", "backend", "frontend"] {
            assert!(
                text.contains(&format!("{BLOCK_START} {subcommand} -->")),
                "no flag table for `fawn {subcommand}`"
            );
        }
        if std::env::var_os("FAWN_BLESS").is_some() {
            std::fs::write(path, &rendered).expect("write docs/OPERATIONS.md");
            return;
        }
        assert!(
            rendered == text,
            "docs/OPERATIONS.md's flag tables are stale: run `FAWN_BLESS=1 cargo test -p fawn --bin fawn flagdoc`"
        );
    }

    #[test]
    fn a_table_has_one_row_per_visible_flag() {
        let table = render("frontend").expect("frontend exists");
        assert!(table.contains("| `--memcached MEMCACHED` | `127.0.0.1:11211` |"));
        assert!(!table.contains("--log-level"), "global flags belong to the `fawn` table");
        assert!(!table.contains("fault-"), "hidden test-only flags are not listed");
        assert!(render("fawn").expect("root").contains("--log-level"));
        assert!(render("nope").is_none());
    }
}
