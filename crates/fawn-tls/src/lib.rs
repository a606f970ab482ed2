//! Authenticated, encrypted connections between the processes of one FAWN cluster.
//!
//! - [`ca`]: the cluster's certificate authority, and the certificate and key it issues to each
//!   process, on disk with private keys readable by their owner only.
//! - [`identity`]: who a certificate speaks for (cluster, role, node id), carried as the URI
//!   `fawn://<cluster>/<role>/<node>` in the certificate.
//! - [`config`]: one process's mutual-TLS acceptor and connector (rustls with the ring provider),
//!   trusting the cluster's CA only, and the identity of a connected peer.
//!
//! - [`clients`]: TLS on the memcached port, for clients outside the cluster (memcached's
//!   `-Z`): a server certificate, and client certificates only if a CA for them is given.
//!
//! Layering: `identity` is a leaf; `ca` and `config` use it, `clients` uses those; nothing here knows the wire
//! protocol, which decides what each role may ask for.

pub mod ca;
pub mod clients;
pub mod config;
pub mod identity;

pub use ca::{ClusterCa, Credentials};
pub use clients::{ClientTls, ClientTlsFiles};
pub use config::TlsSetup;
pub use identity::{Identity, Role};

/// Why a certificate could not be made, stored or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("identity: {0}")]
    Identity(String),
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("TLS: {0}")]
    Rustls(#[from] tokio_rustls::rustls::Error),
    #[error("{0}")]
    Io(String),
    #[error("the peer presented no certificate")]
    NoPeerCertificate,
}
