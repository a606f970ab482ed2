//! TLS for the memcached port, as memcached's `-Z` offers it: the server presents a certificate
//! chain (`ssl_chain_cert`) and key (`ssl_key`); client certificates are asked for and required
//! only when a CA for clients is given (`ssl_ca_cert` with `ssl_verify_mode=2`), and then any
//! certificate that CA signed is accepted: memcached's clients have no roles.
//!
//! `fawn up --memcached-tls` issues the server certificate from the cluster's CA
//! ([`ClusterCa::issue_memcached`]). That certificate names the memcached host(s) only and is
//! for server authentication only, with no `fawn://` identity: a host that leaks it cannot use
//! it to speak the native protocol to the cluster.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::ca::{read, read_secret};
use crate::TlsError;

/// The file stem of the memcached server certificate `fawn up` issues in its TLS directory.
pub const MEMCACHED_CERT_STEM: &str = "memcached";

/// The memcached port's TLS acceptor. Clones share it, so [`ClientTls::reload`] (memcached's
/// `refresh_certs`) changes what every later handshake presents; connections already open keep
/// the session they negotiated.
#[derive(Clone)]
pub struct ClientTls {
    acceptor: Arc<RwLock<TlsAcceptor>>,
    /// Whether clients must present a certificate of the clients' CA.
    client_certs: bool,
    /// The files it was read from (`None`: built from PEM text), for `stats settings`.
    files: Option<ClientTlsFiles>,
}

/// The files a [`ClientTls`] was read from.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    pub chain: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").field("client_certs", &self.client_certs).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// From PEM text: the server's certificate chain (its own certificate first), its private
    /// key and, to require client certificates, the CA certificates that sign them.
    pub fn new(chain_pem: &str, key_pem: &str, client_ca_pem: Option<&str>) -> Result<Self, TlsError> {
        let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Config(format!("certificate chain PEM: {e}")))?;
        if chain.is_empty() {
            return Err(TlsError::Config("the certificate file holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Config(format!("private key PEM: {e}")))?;
        let provider = Arc::new(crate::config::provider());
        let builder =
            ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        let builder = match client_ca_pem {
            Some(ca_pem) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                    roots.add(cert.map_err(|e| TlsError::Config(format!("client CA PEM: {e}")))?)?;
                }
                if roots.is_empty() {
                    return Err(TlsError::Config("the client CA file holds no certificate".into()));
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder.with_single_cert(chain, key)?;
        let acceptor = Arc::new(RwLock::new(TlsAcceptor::from(Arc::new(config))));
        Ok(ClientTls { acceptor, client_certs: client_ca_pem.is_some(), files: None })
    }

    /// Reads the files of [`ClientTls::new`]; the key must be readable by its owner only.
    pub fn load(chain: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let client_ca_pem = client_ca.map(read).transpose()?;
        let mut tls = Self::new(&read(chain)?, &read_secret(key)?, client_ca_pem.as_deref())?;
        let (chain, key, client_ca) = (chain.to_owned(), key.to_owned(), client_ca.map(Path::to_owned));
        tls.files = Some(ClientTlsFiles { chain, key, client_ca });
        Ok(tls)
    }

    /// The files it was read from, if it was read from files.
    pub fn files(&self) -> Option<&ClientTlsFiles> {
        self.files.as_ref()
    }

    /// The acceptor for the next handshake (a cheap handle: the configuration is shared).
    pub fn acceptor(&self) -> TlsAcceptor {
        // A poisoned lock still holds a whole acceptor: the writer only swaps the value.
        self.acceptor.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the files it was loaded from again and, if they make a valid configuration, serves
    /// it to every later handshake; on any error the configuration in use is kept, so a
    /// half-written certificate never takes the port down. Whether client certificates are
    /// required is fixed at start (the client CA file is re-read, not added or removed).
    pub fn reload(&self) -> Result<(), TlsError> {
        let Some(files) = &self.files else {
            return Err(TlsError::Config("the TLS configuration was not read from files".into()));
        };
        let fresh = Self::load(&files.chain, &files.key, files.client_ca.as_deref())?;
        let acceptor = fresh.acceptor();
        *self.acceptor.write().unwrap_or_else(|e| e.into_inner()) = acceptor;
        Ok(())
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certs(&self) -> bool {
        self.client_certs
    }
}

/// The names a memcached server certificate for `host` (the host memcached listens on) carries:
/// the host itself unless it is a wildcard address, and the loopback names, so clients on the
/// machine can verify it by any of them.
pub fn memcached_names(host: &str) -> Vec<String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let wildcard = host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified());
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
    if !wildcard && !names.iter().any(|n| n == host) {
        names.insert(0, host.to_owned());
    }
    names
}

/// Issues the memcached server certificate into `dir` (`memcached.pem`, `memcached.key`),
/// replacing an earlier one, so it always names `host`.
pub fn issue_memcached_into(dir: &Path, host: &str) -> Result<(), TlsError> {
    let ca = crate::ClusterCa::load(dir)?;
    let credentials = ca.issue_memcached(&memcached_names(host))?;
    credentials.save_as(dir, MEMCACHED_CERT_STEM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cover_the_host_and_loopback() {
        assert_eq!(memcached_names("127.0.0.1"), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(memcached_names("0.0.0.0"), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(memcached_names("[::]"), ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(memcached_names("cache.example"), ["cache.example", "localhost", "127.0.0.1", "::1"]);
        assert_eq!(memcached_names("10.0.0.5")[0], "10.0.0.5");
    }

    #[test]
    fn the_issued_certificate_serves_but_names_no_cluster_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        crate::ClusterCa::ensure(dir.path(), "unit", &[]).expect("CA");
        issue_memcached_into(dir.path(), "127.0.0.1").expect("issue");
        let pem = read(&dir.path().join("memcached.pem")).expect("cert");
        let cert = CertificateDer::from_pem_slice(pem.as_bytes()).expect("parse");
        assert!(crate::config::identity_of(&cert).is_err(), "a memcached certificate must carry no identity");
        let tls = ClientTls::load(&dir.path().join("memcached.pem"), &dir.path().join("memcached.key"), None)
            .expect("load");
        assert!(!tls.requires_client_certs());
        let ca = dir.path().join("ca.pem");
        let with_ca =
            ClientTls::load(&dir.path().join("memcached.pem"), &dir.path().join("memcached.key"), Some(&ca))
                .expect("load with a client CA");
        assert!(with_ca.requires_client_certs());
    }
}
