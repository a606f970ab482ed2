//! Mutual-TLS configurations for one process, and the identity of the peer at the other end.
//!
//! Both ends present a certificate of the cluster's CA and verify the other's against that CA
//! alone (no system roots). A client verifies the server's certificate for the name
//! `<cluster>.fawn`, which every certificate of the cluster carries, so processes can be reached
//! by any address; who the peer is comes from the identity URI in its certificate.

use std::sync::Arc;

use tokio_rustls::rustls::crypto::ring::default_provider;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use x509_parser::extensions::GeneralName;

use crate::ca::Credentials;
use crate::identity::{cluster_dns_name, Identity, Role};
use crate::TlsError;

/// One process's side of the cluster's mutual TLS.
#[derive(Clone)]
pub struct TlsSetup {
    identity: Identity,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl TlsSetup {
    /// Builds both configurations from the CA certificate and this process's credentials,
    /// which must carry `identity`.
    pub fn new(ca_pem: &str, credentials: &Credentials, identity: Identity) -> Result<Self, TlsError> {
        let own = identity_of(&first_cert(credentials.cert_pem.as_bytes())?)?;
        if own != identity {
            return Err(TlsError::Identity(format!("the certificate is {own}'s, not {identity}'s")));
        }
        let roots = Arc::new(root_store(ca_pem, &identity.cluster)?);
        let chain = vec![first_cert(credentials.cert_pem.as_bytes())?];
        let key = PrivateKeyDer::from_pem_slice(credentials.key_pem.as_bytes()).map_err(pem_error)?;
        let provider = Arc::new(provider());

        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        let server_name = ServerName::try_from(cluster_dns_name(&identity.cluster))
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(TlsSetup {
            identity,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
            server_name,
        })
    }

    /// Reads `ca.pem` and this identity's credentials from `dir` (see [`crate::ca`]).
    pub fn load(dir: &std::path::Path, identity: Identity) -> Result<Self, TlsError> {
        let ca_pem = std::fs::read_to_string(dir.join("ca.pem"))
            .map_err(|e| TlsError::Io(format!("{}: {e}", dir.join("ca.pem").display())))?;
        let credentials = Credentials::load(dir, &identity)?;
        Self::new(&ca_pem, &credentials, identity)
    }

    /// Loads the credentials of `role` `node` from `dir`, of the cluster its `ca.pem` names.
    pub fn load_as(dir: &std::path::Path, role: Role, node: u32) -> Result<Self, TlsError> {
        let cluster = crate::ca::cluster_in(dir)?;
        Self::load(dir, Identity::new(&cluster, role, node)?)
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Wraps accepted connections: the handshake fails unless the client presents a
    /// certificate of this cluster's CA.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Wraps outgoing connections; pass [`TlsSetup::server_name`] as the name to verify.
    pub fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    pub fn server_name(&self) -> ServerName<'static> {
        self.server_name.clone()
    }

    /// The identity of a peer that completed the handshake, from the certificates it presented.
    /// Refuses one of another cluster (the chain check already makes that a forgery).
    pub fn peer_identity(&self, certs: Option<&[CertificateDer<'_>]>) -> Result<Identity, TlsError> {
        let cert = certs.and_then(|certs| certs.first()).ok_or(TlsError::NoPeerCertificate)?;
        let peer = identity_of(cert)?;
        if peer.cluster != self.identity.cluster {
            return Err(TlsError::Identity(format!("{peer} is not of cluster {}", self.identity.cluster)));
        }
        Ok(peer)
    }
}

pub(crate) fn provider() -> CryptoProvider {
    default_provider()
}

fn pem_error(e: tokio_rustls::rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Config(format!("PEM: {e}"))
}

fn first_cert(pem: &[u8]) -> Result<CertificateDer<'static>, TlsError> {
    CertificateDer::from_pem_slice(pem).map_err(pem_error)
}

/// Every CA certificate in `ca_pem` (several during a CA rotation: peers with a certificate of
/// either are trusted), each of which must be of `cluster`.
fn root_store(ca_pem: &str, cluster: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let der = der.map_err(pem_error)?;
        let of = crate::ca::ca_cluster_of(&der)?;
        if of != cluster {
            return Err(TlsError::Identity(format!(
                "a CA certificate of cluster {of} in the bundle of {cluster}"
            )));
        }
        roots.add(der)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Config("no CA certificate in ca.pem".into()));
    }
    Ok(roots)
}

/// The identity URI in a certificate.
pub fn identity_of(cert: &CertificateDer<'_>) -> Result<Identity, TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| TlsError::Identity(format!("certificate: {e}")))?;
    let names = parsed
        .subject_alternative_name()
        .map_err(|e| TlsError::Identity(format!("certificate names: {e}")))?
        .ok_or_else(|| TlsError::Identity("the certificate names no identity".into()))?;
    let uri = names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with("fawn://") => Some(*uri),
            _ => None,
        })
        .ok_or_else(|| TlsError::Identity("the certificate names no fawn:// identity".into()))?;
    Identity::from_uri(uri)
}
