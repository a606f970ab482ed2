//! The cluster's certificate authority and the credentials it issues to each process.
//!
//! On disk (one directory, e.g. `<data-dir>/tls`):
//! - `ca.pem`: the CA certificate, which every process trusts and nothing else;
//! - `ca.key`: its private key, mode 0600, needed only where certificates are issued;
//! - `<role>-<node>.pem` and `<role>-<node>.key` (0600): a process's certificate and key.
//!
//! Files are written to a temporary name, synced, renamed and the directory synced, so a crash
//! leaves either the old file or the whole new one.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};

use time::{Duration, OffsetDateTime};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;

use crate::identity::{check_cluster_name, cluster_dns_name, Identity, Role};
use crate::TlsError;

/// How long the CA certificate is valid.
pub const CA_VALIDITY_DAYS: i64 = 3_650;
/// How long a process certificate is valid; re-issue before then.
pub const NODE_VALIDITY_DAYS: i64 = 825;
const _: () = assert!(NODE_VALIDITY_DAYS < CA_VALIDITY_DAYS);

const SECRET_MODE: u32 = 0o600;
const PUBLIC_MODE: u32 = 0o644;

/// A process's certificate and private key, PEM encoded.
#[derive(Clone)]
pub struct Credentials {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Credentials {
    fn file_stem(identity: &Identity) -> String {
        format!("{}-{}", identity.role.as_str(), identity.node)
    }

    /// Writes `<role>-<node>.pem` and `.key` into `dir`.
    pub fn save(&self, dir: &Path, identity: &Identity) -> Result<(), TlsError> {
        self.save_as(dir, &Self::file_stem(identity))
    }

    /// Writes `<stem>.pem` and `<stem>.key` into `dir`.
    pub fn save_as(&self, dir: &Path, stem: &str) -> Result<(), TlsError> {
        write_durably(&dir.join(format!("{stem}.pem")), self.cert_pem.as_bytes(), PUBLIC_MODE)?;
        write_durably(&dir.join(format!("{stem}.key")), self.key_pem.as_bytes(), SECRET_MODE)
    }

    /// Whether `dir` holds a certificate for `identity`.
    pub fn exist(dir: &Path, identity: &Identity) -> bool {
        dir.join(format!("{}.pem", Self::file_stem(identity))).exists()
    }

    /// Reads what [`Credentials::save`] wrote.
    pub fn load(dir: &Path, identity: &Identity) -> Result<Self, TlsError> {
        let stem = Self::file_stem(identity);
        Ok(Credentials {
            cert_pem: read(&dir.join(format!("{stem}.pem")))?,
            key_pem: read_secret(&dir.join(format!("{stem}.key")))?,
        })
    }
}

/// The cluster's CA: its name, its certificate and the key that signs.
pub struct ClusterCa {
    cluster: String,
    cert_pem: String,
    key: KeyPair,
}

impl ClusterCa {
    /// A new CA for `cluster`.
    pub fn create(cluster: &str) -> Result<Self, TlsError> {
        check_cluster_name(cluster)?;
        let key = KeyPair::generate()?;
        let cert = Self::params(cluster)?.self_signed(&key)?;
        Ok(ClusterCa { cluster: cluster.to_owned(), cert_pem: cert.pem(), key })
    }

    fn params(cluster: &str) -> Result<CertificateParams, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("FAWN cluster {cluster} CA"));
        params.distinguished_name.push(DnType::OrganizationalUnitName, cluster.to_owned());
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = yesterday();
        params.not_after = params.not_before + Duration::days(CA_VALIDITY_DAYS);
        Ok(params)
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The CA certificate every process trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues credentials for `identity`, which must belong to this CA's cluster. The
    /// certificate is good for both ends of a connection (server and client authentication).
    pub fn issue(&self, identity: &Identity) -> Result<Credentials, TlsError> {
        if identity.cluster != self.cluster {
            return Err(TlsError::Identity(format!(
                "cannot issue for {identity}: this CA is cluster {}'s",
                self.cluster
            )));
        }
        let mut params = CertificateParams::new(vec![cluster_dns_name(&self.cluster)])?;
        params.subject_alt_names.push(SanType::URI(identity.uri().try_into()?));
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, identity.to_string());
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// Signs a leaf certificate valid for [`NODE_VALIDITY_DAYS`] with a new key.
    fn sign(&self, mut params: CertificateParams) -> Result<Credentials, TlsError> {
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.use_authority_key_identifier_extension = true;
        params.not_before = yesterday();
        params.not_after = params.not_before + Duration::days(NODE_VALIDITY_DAYS);
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Credentials { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Issues a memcached server's certificate for `names` (DNS names or IP addresses): for
    /// server authentication only, and with neither a `fawn://` identity nor the cluster's DNS
    /// name, so it is no credential for the cluster's native connections.
    pub fn issue_memcached(&self, names: &[String]) -> Result<Credentials, TlsError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("FAWN cluster {} memcached", self.cluster));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// Writes `ca.pem` and `ca.key` into `dir` (created if missing).
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        write_durably(&dir.join("ca.pem"), self.cert_pem.as_bytes(), PUBLIC_MODE)?;
        write_durably(&dir.join("ca.key"), self.key.serialize_pem().as_bytes(), SECRET_MODE)
    }

    /// Reads what [`ClusterCa::save`] wrote; the cluster name comes from the certificate.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        let cert_pem = read(&dir.join("ca.pem"))?;
        let key = KeyPair::from_pem(&read_secret(&dir.join("ca.key"))?)?;
        let cluster = ca_cluster(&cert_pem)?;
        Ok(ClusterCa { cluster, cert_pem, key })
    }

    /// The CA in `dir`, created for `cluster` if `dir` holds none, and credentials for each of
    /// `members` (of this CA's cluster, whatever `cluster` says when the CA exists already)
    /// that `dir` lacks. Existing files are kept: running it again issues nothing new.
    pub fn ensure(dir: &Path, cluster: &str, members: &[(Role, u32)]) -> Result<Self, TlsError> {
        let ca = if dir.join("ca.pem").exists() {
            Self::load(dir)?
        } else {
            let ca = Self::create(cluster)?;
            ca.save(dir)?;
            ca
        };
        for &(role, node) in members {
            let identity = Identity::new(&ca.cluster, role, node)?;
            if !Credentials::exist(dir, &identity) {
                ca.issue(&identity)?.save(dir, &identity)?;
            }
        }
        Ok(ca)
    }
}

/// The cluster whose CA certificate is `dir/ca.pem` (every process's directory holds it).
pub fn cluster_in(dir: &Path) -> Result<String, TlsError> {
    ca_cluster(&read(&dir.join("ca.pem"))?)
}

/// Validity starts a day back, so a peer whose clock is a little behind accepts a fresh
/// certificate.
fn yesterday() -> OffsetDateTime {
    OffsetDateTime::now_utc() - Duration::days(1)
}

fn io_error(path: &Path, e: std::io::Error) -> TlsError {
    TlsError::Io(format!("{}: {e}", path.display()))
}

pub(crate) fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|e| io_error(path, e))
}

/// Reads a private key, refusing one that other users can read.
pub(crate) fn read_secret(path: &Path) -> Result<String, TlsError> {
    let mode = fs::metadata(path).map_err(|e| io_error(path, e))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(TlsError::Io(format!(
            "{}: mode {:o} lets other users read a private key; chmod 600 it",
            path.display(),
            mode & 0o777
        )));
    }
    read(path)
}

fn write_durably(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    let tmp = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| io_error(&tmp, e))?;
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| io_error(&tmp, e))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| io_error(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| io_error(path, e))?;
    fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| io_error(&dir, e))
}

/// The cluster a CA certificate belongs to (its organizational unit): that of the first
/// certificate of `ca_pem`.
fn ca_cluster(ca_pem: &str) -> Result<String, TlsError> {
    let der = CertificateDer::from_pem_slice(ca_pem.as_bytes())
        .map_err(|e| TlsError::Config(format!("PEM: {e}")))?;
    ca_cluster_of(&der)
}

/// The cluster a CA certificate (DER) belongs to (its organizational unit).
pub(crate) fn ca_cluster_of(der: &CertificateDer<'_>) -> Result<String, TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| TlsError::Identity(format!("CA certificate: {e}")))?;
    let unit = parsed
        .subject()
        .iter_organizational_unit()
        .next()
        .and_then(|unit| unit.as_str().ok())
        .ok_or_else(|| TlsError::Identity("the CA certificate names no cluster".into()))?;
    crate::identity::check_cluster_name(unit)?;
    Ok(unit.to_owned())
}
