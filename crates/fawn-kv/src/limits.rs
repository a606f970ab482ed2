//! Process-wide bounds: the file-descriptor limit (`RLIMIT_NOFILE`), raised at start-up, and
//! the connection caps derived from it, so that a full set of connections can never make a
//! node fail to open a data file or a connection to a peer; and the allocator's threshold for
//! giving large blocks back ([`return_large_frees`]).

use tracing::{info, warn};

/// File descriptors kept out of the connection caps: data files and their directories, log
/// files, the connections a node opens itself (pool, chain links, manager), the listeners.
pub const FDS_RESERVED: u64 = 512;

/// Raises the soft `RLIMIT_NOFILE` to `wanted` descriptors, or as near as the hard limit
/// allows. Returns the soft limit now in force.
pub fn raise_nofile(wanted: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // rlim_t is u64 on Linux.
    let target = wanted.min(lim.rlim_max);
    if target > lim.rlim_cur {
        let raised = libc::rlimit { rlim_cur: target, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = target;
    }
    Ok(lim.rlim_cur)
}

/// Blocks of at least this many bytes are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD_BYTES: usize = 128 << 10;

/// Makes glibc's malloc give every block of at least [`MMAP_THRESHOLD_BYTES`] back to the
/// system when it is freed. By default glibc raises that threshold to the size of each large
/// block freed (up to 32 MiB): from then on blocks that size (a checkpoint's image, a range's
/// ring of outcome tags, a sync batch) come from the heap, and once freed among live small
/// blocks their pages stay resident, so a back-end's memory grows with every such buffer it
/// ever used. A fixed threshold keeps it at what is live. True if set (glibc only).
pub fn return_large_frees() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a parameter of the allocator; it takes its own lock.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The connection caps that fit in `nofile` descriptors beside [`FDS_RESERVED`]: the caps
/// asked for if they fit, else each lowered in proportion (at least one each).
pub fn fit_caps(nofile: u64, asked: &[usize]) -> Vec<usize> {
    let total: u64 = asked.iter().map(|&c| c as u64).sum();
    let room = nofile.saturating_sub(FDS_RESERVED);
    if total <= room {
        return asked.to_vec();
    }
    asked.iter().map(|&c| ((c as u64 * room / total.max(1)) as usize).max(1)).collect()
}

/// Raises the descriptor limit for connection caps `asked` (named by `what`, for the log) and
/// returns the caps that fit; says clearly when they were lowered.
pub fn connection_caps(asked: &[(&str, usize)]) -> Vec<usize> {
    let caps: Vec<usize> = asked.iter().map(|&(_, c)| c).collect();
    let wanted = caps.iter().map(|&c| c as u64).sum::<u64>() + FDS_RESERVED;
    let nofile = match raise_nofile(wanted) {
        Ok(n) => n,
        Err(e) => {
            warn!(error = %e, "cannot read or raise RLIMIT_NOFILE; keeping the connection caps asked for");
            return caps;
        }
    };
    let fitted = fit_caps(nofile, &caps);
    for ((what, asked), got) in asked.iter().zip(&fitted) {
        if got < asked {
            warn!(
                listener = what,
                asked,
                cap = got,
                nofile,
                wanted,
                "RLIMIT_NOFILE is lower than the connection caps need; lowering this cap (raise the hard limit, e.g. `ulimit -Hn`, to serve more)"
            );
        }
    }
    info!(nofile, caps = ?fitted, "file-descriptor limit and connection caps");
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_that_fit_are_kept() {
        assert_eq!(fit_caps(10_000, &[4096, 1024]), vec![4096, 1024]);
    }

    #[test]
    fn caps_that_do_not_fit_shrink_in_proportion() {
        let caps = fit_caps(1024, &[4096, 1024]);
        assert!(caps.iter().map(|&c| c as u64).sum::<u64>() <= 1024 - FDS_RESERVED, "{caps:?}");
        assert!(caps[0] > caps[1] && caps[1] >= 1, "{caps:?}");
        assert_eq!(fit_caps(0, &[5]), vec![1]);
    }
}
