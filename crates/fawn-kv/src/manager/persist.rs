//! Durable storage of the manager's configuration: JSON, replaced atomically
//! (write temp, fsync, rename, fsync directory) before it is published.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use fawn_proto::native::ClusterConfig;

const CONFIG_FILE: &str = "cluster-config.json";

/// Where the configuration lives.
pub struct ConfigFile {
    dir: PathBuf,
}

impl ConfigFile {
    pub fn new(dir: &Path) -> ConfigFile {
        ConfigFile { dir: dir.to_path_buf() }
    }

    /// The saved configuration, or `None` on first start.
    pub fn load(&self) -> std::io::Result<Option<ClusterConfig>> {
        let path = self.dir.join(CONFIG_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Durably replaces the saved configuration.
    pub fn save(&self, config: &ClusterConfig) -> std::io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!("{CONFIG_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(config).map_err(std::io::Error::other)?;
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, self.dir.join(CONFIG_FILE))?;
        File::open(&self.dir)?.sync_all()
    }
}
