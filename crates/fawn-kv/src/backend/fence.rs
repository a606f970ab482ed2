//! The cluster a back-end's data directory belongs to.
//!
//! A back-end records the cluster id of the first configuration it installs in its data
//! directory. Pointed later at another cluster's managers (a wrong `--manager`, or a manager
//! group formed anew after every manager's disk was lost), it would otherwise register there,
//! install that cluster's configuration, find none of its ranges in it and delete their
//! directories. It refuses instead: before it registers and at every install.

use std::path::Path;

use super::boot::write_durably;

/// The file in a back-end's data directory naming its cluster (16 hex digits).
pub const CLUSTER_ID_FILE: &str = "CLUSTER_ID";

/// The cluster id recorded in `data_dir`, if any. A garbled file is an error, not a fresh
/// start: guessing could hand the directory's data to another cluster.
pub fn recorded(data_dir: &Path) -> anyhow::Result<Option<u64>> {
    let path = data_dir.join(CLUSTER_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => u64::from_str_radix(text.trim(), 16)
            .ok()
            .filter(|id| *id != 0)
            .map(Some)
            .ok_or_else(|| anyhow::anyhow!("{} does not hold a cluster id: {text:?}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
    }
}

/// Records `id` as the cluster `data_dir` belongs to (synced before it counts).
pub fn record(data_dir: &Path, id: u64) -> std::io::Result<()> {
    write_durably(data_dir, CLUSTER_ID_FILE, &format!("{id:016x}\n"))
}

/// Whether a configuration of cluster `offered` may be used by a back-end whose directory
/// belongs to `recorded`. An `offered` of 0 (a manager group not yet formed) names no
/// cluster and passes: the check is repeated once it has formed.
pub fn check(recorded: Option<u64>, offered: u64) -> Result<(), String> {
    match recorded {
        Some(ours) if offered != 0 && offered != ours => Err(format!(
            "this data directory belongs to cluster {ours:016x}, but the managers serve cluster \
             {offered:016x}: point --manager at its own cluster's managers, or give this node an \
             empty --data-dir to join this cluster as a new node"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_the_cluster_it_first_joined() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(recorded(d).unwrap(), None);
        assert!(check(None, 7).is_ok(), "nothing recorded: any cluster");
        record(d, 0xabc).unwrap();
        assert_eq!(recorded(d).unwrap(), Some(0xabc));
        assert!(check(Some(0xabc), 0xabc).is_ok());
        assert!(check(Some(0xabc), 0).is_ok(), "an unformed group names no cluster");
        let refused = check(Some(0xabc), 0xdef).unwrap_err();
        assert!(refused.contains("0000000000000abc") && refused.contains("0000000000000def"), "{refused}");
    }

    #[test]
    fn a_garbled_record_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        for text in ["not hex\n", "0000000000000000\n", ""] {
            std::fs::write(dir.path().join(CLUSTER_ID_FILE), text).unwrap();
            assert!(recorded(dir.path()).is_err(), "{text:?}");
        }
    }
}
