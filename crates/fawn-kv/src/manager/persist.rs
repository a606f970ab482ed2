//! The configuration file of a manager from before the manager group: JSON, replaced
//! atomically. A new group's first leader starts from it when one is found in its data
//! directory, so upgrading keeps the cluster's configuration.

use std::path::{Path, PathBuf};

use fawn_proto::native::ClusterConfig;

use super::raft::files;

const CONFIG_FILE: &str = "cluster-config.json";

/// Where the configuration lives.
pub struct ConfigFile {
    dir: PathBuf,
}

impl ConfigFile {
    pub fn new(dir: &Path) -> ConfigFile {
        ConfigFile { dir: dir.to_path_buf() }
    }

    /// The saved configuration, or `None` if there is none.
    pub fn load(&self) -> std::io::Result<Option<ClusterConfig>> {
        let Some(bytes) = files::read(&self.dir, CONFIG_FILE)? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", self.dir.join(CONFIG_FILE).display()),
            )
        })
    }
}
