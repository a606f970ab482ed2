//! Process-wide bounds: the file-descriptor limit (`RLIMIT_NOFILE`), raised at start-up, and
//! the connection caps derived from it, so that a full set of connections can never make a
//! node fail to open a data file or a connection to a peer.

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
