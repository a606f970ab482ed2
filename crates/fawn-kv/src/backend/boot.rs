//! Whether a restarted back-end's datastores still hold every update it acknowledged.
//!
//! A replica appends an update before it acknowledges it; under `--sync always` the append
//! is on disk first, under `interval` and `never` it may sit in the page cache. A process
//! crash keeps the page cache, so a back-end restarted on the same boot of its host has
//! everything it acknowledged. A host crash or power loss may drop the end of its logs, and
//! a replica that resumed its chain position from such a log could serve, as tail, an older
//! value than one the chain acknowledged. The back-end records the host's boot id in its
//! data directory; at start it compares, and a back-end that cannot prove its logs complete
//! tells the manager, which has it resync (a suffix sync) before it serves again.

use std::path::Path;

use fawn_ds::SyncPolicy;

/// The file in a back-end's data directory naming the boot of the host it last ran on.
pub const BOOT_ID_FILE: &str = "BOOT_ID";
/// Where Linux names the current boot.
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The current boot of this host, if the kernel tells it.
pub fn current_boot_id() -> Option<String> {
    let id = std::fs::read_to_string(KERNEL_BOOT_ID).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// Whether the datastores under `data_dir` hold every update this node acknowledged: they
/// sync every write, there are none, or the host has not restarted since they were last
/// written (`boot` is the current boot id).
pub fn logs_complete(data_dir: &Path, sync: SyncPolicy, boot: Option<&str>) -> bool {
    if sync == SyncPolicy::Always || !holds_datastores(data_dir) {
        return true;
    }
    let recorded = std::fs::read_to_string(data_dir.join(BOOT_ID_FILE)).ok();
    matches!((recorded.as_deref().map(str::trim), boot), (Some(was), Some(now)) if was == now)
}

/// Records `boot` as the boot the datastores were last written on (written to a temporary
/// file, synced, renamed, the directory synced).
pub fn record_boot(data_dir: &Path, boot: &str) -> std::io::Result<()> {
    write_durably(data_dir, BOOT_ID_FILE, &format!("{boot}\n"))
}

/// Replaces `data_dir/name` with `contents` so that a crash leaves the old file or the new
/// one, never a torn one: written to a temporary file, synced, renamed, the directory synced.
pub fn write_durably(data_dir: &Path, name: &str, contents: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    let tmp = data_dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, contents)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, data_dir.join(name))?;
    std::fs::File::open(data_dir)?.sync_all()
}

fn holds_datastores(data_dir: &Path) -> bool {
    std::fs::read_dir(data_dir.join("ranges")).is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const INTERVAL: SyncPolicy = SyncPolicy::Interval(Duration::from_millis(100));

    #[test]
    fn a_restart_is_proven_only_on_the_same_boot_or_under_always() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(logs_complete(d, INTERVAL, Some("b1")), "no datastore: nothing to lose");
        std::fs::create_dir_all(d.join("ranges").join("r1")).unwrap();
        assert!(!logs_complete(d, INTERVAL, Some("b1")), "datastores but no recorded boot");
        record_boot(d, "b1").unwrap();
        assert!(logs_complete(d, INTERVAL, Some("b1")));
        assert!(!logs_complete(d, INTERVAL, Some("b2")), "the host restarted");
        assert!(!logs_complete(d, SyncPolicy::Never, None), "boot unknown");
        assert!(logs_complete(d, SyncPolicy::Always, Some("b2")));
    }

    #[test]
    fn this_host_names_its_boot() {
        if Path::new(KERNEL_BOOT_ID).exists() {
            assert!(current_boot_id().is_some());
        }
    }
}
