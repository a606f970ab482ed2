//! Running one role as a process: data-directory lock, listeners, signals, graceful shutdown.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

use crate::backend::{Backend, BackendOptions};
use crate::frontend::{Frontend, FrontendOptions};
use crate::lockfile::DirLock;
use crate::manager::{Manager, ManagerOptions};
use crate::server::{self, NativeLimits};

/// A shutdown flag that turns true on SIGINT or SIGTERM.
pub fn shutdown_on_signals() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

/// Raises the file-descriptor limit for this process's listeners and fixes the native
/// listeners' bounds (`native`, its connection cap lowered to fit if need be). Returns the
/// fitted memcached connection cap, if one was asked for. Call once, before serving.
pub fn apply_limits(mut native: NativeLimits, memcached_connections: Option<usize>) -> Option<usize> {
    let mut asked = vec![("native", native.connections_max)];
    asked.extend(memcached_connections.map(|c| ("memcached", c)));
    let caps = crate::limits::connection_caps(&asked);
    native.connections_max = caps[0];
    if !server::set_limits(native) {
        tracing::warn!("native listener bounds were set already; keeping them");
    }
    caps.get(1).copied()
}

/// Sets this process's native transport: mutual TLS with the credentials of `role` `node` in
/// `tls_dir` (its `ca.pem` names the cluster), or plain TCP when `tls_dir` is `None`. Call
/// once, before connecting or serving.
pub fn use_transport(tls_dir: Option<&Path>, role: fawn_tls::Role, node: u32) -> anyhow::Result<()> {
    let transport = match tls_dir {
        Some(dir) => {
            let setup = fawn_tls::TlsSetup::load_as(dir, role, node).with_context(|| {
                format!("loading the TLS credentials of {} {node} from {}", role.as_str(), dir.display())
            })?;
            info!(identity = %setup.identity(), "native connections use mutual TLS");
            if role != fawn_tls::Role::Admin {
                reload_transport_on_hangup(dir.to_path_buf(), setup.identity().clone());
            }
            fawn_client::transport::Transport::Tls(setup)
        }
        None => {
            tracing::warn!("native connections are plain TCP (--plaintext): peers are not authenticated");
            fawn_client::transport::Transport::Plain
        }
    };
    fawn_client::transport::set(transport);
    Ok(())
}

/// Re-reads this process's native TLS credentials from `dir` at each SIGHUP, so that a
/// certificate or a CA bundle (several CAs in `ca.pem` during a rotation) is replaced without
/// a restart: connections made or accepted from then on use them, open ones keep their
/// session. Credentials of another identity (another cluster's CA, another node's certificate)
/// are refused and the current ones kept.
fn reload_transport_on_hangup(dir: std::path::PathBuf, identity: fawn_tls::Identity) {
    on_hangup("native TLS credentials", move || {
        let setup = fawn_tls::TlsSetup::load(&dir, identity.clone())
            .with_context(|| format!("loading {identity}'s TLS credentials from {}", dir.display()))?;
        fawn_client::transport::set(fawn_client::transport::Transport::Tls(setup));
        Ok(())
    });
}

/// Calls `reload` at each SIGHUP (on this runtime, if there is one), logging what it did;
/// a failed reload keeps what was loaded before.
pub fn on_hangup(what: &'static str, reload: impl Fn() -> anyhow::Result<()> + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(what, error = %e, "cannot listen for SIGHUP: no reload without a restart");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match reload() {
                Ok(()) => info!(what, "SIGHUP: reloaded; new connections use them"),
                Err(e) => tracing::warn!(
                    what,
                    error = format!("{e:#}"),
                    "SIGHUP: reload failed; keeping the current ones"
                ),
            }
        }
    });
}

/// Starts the `/metrics` listener if an address was given.
async fn start_metrics(
    listen: Option<&str>,
    source: Arc<dyn crate::metrics::Exposition>,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if let Some(addr) = listen {
        let listener = bind(addr, "metrics").await?;
        info!(listen = %listener.local_addr()?, "metrics at /metrics");
        tokio::spawn(crate::metrics::serve(listener, source, shutdown.clone()));
    }
    Ok(())
}

async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.with_context(|| format!("binding the {what} listener to {addr}"))
}

/// Runs the manager until shutdown.
pub async fn manager(
    options: ManagerOptions,
    listen: &str,
    metrics: Option<&str>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let _lock = DirLock::acquire(&options.data_dir)?;
    let listener = bind(listen, "manager").await?;
    let manager = Manager::open(options).await.context("opening the manager state")?;
    info!(listen = %listener.local_addr()?, "manager listening");
    start_metrics(metrics, manager.clone(), &shutdown).await?;
    manager.serve(listener, shutdown).await;
    Ok(())
}

/// Runs a back-end until shutdown.
pub async fn backend(
    options: BackendOptions,
    listen: &str,
    metrics: Option<&str>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let _lock = DirLock::acquire(&options.data_dir)?;
    if !crate::limits::return_large_frees() {
        info!("cannot fix the allocator's mmap threshold; freed large buffers may stay resident");
    }
    // Listen before registering, so chain neighbours can connect as soon as the ring forms.
    let listener = bind(listen, "back-end").await?;
    info!(listen = %listener.local_addr()?, node = options.node, "back-end listening; registering");
    let backend = Backend::start(options).await?;
    info!("back-end serving");
    start_metrics(metrics, backend.clone(), &shutdown).await?;
    backend.serve(listener, shutdown).await;
    Ok(())
}

/// Runs a front-end (native and memcached listeners) until shutdown.
pub async fn frontend(
    options: FrontendOptions,
    data_dir: &Path,
    listen: &str,
    memcache_listen: &str,
    memcache_config: crate::memcache::MemcacheConfig,
    metrics: Option<&str>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let _lock = DirLock::acquire(data_dir)?;
    let native = bind(listen, "front-end native").await?;
    let memcache = bind(memcache_listen, "memcached").await?;
    let frontend: Arc<Frontend> = Frontend::start(options).await?;
    info!(native = %native.local_addr()?, memcached = %memcache.local_addr()?, "front-end serving");
    start_metrics(metrics, frontend.clone(), &shutdown).await?;
    // The listeners close only after the front-end gave its lease up (`Frontend::stopping`).
    let (stop, stopped) = watch::channel(false);
    let mut outer = shutdown.clone();
    let stopping = frontend.clone();
    tokio::spawn(async move {
        let _ = outer.wait_for(|v| *v).await;
        stopping.stopping();
        let _ = stop.send(true);
    });
    let mut memcache_shutdown = stopped.clone();
    let mc = tokio::spawn(crate::memcache::serve(memcache, frontend.clone(), memcache_config, async move {
        let _ = memcache_shutdown.wait_for(|v| *v).await;
    }));
    frontend.serve_native(native, stopped).await;
    let _ = mc.await;
    Ok(())
}
