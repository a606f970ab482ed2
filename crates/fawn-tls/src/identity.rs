//! Who a certificate speaks for: a cluster, a role and a node id, written into the certificate as
//! the URI subject alternative name `fawn://<cluster>/<role>/<node>`.
//!
//! The role decides what a peer may ask for (a back-end sends chain messages only as itself, only
//! managers install configurations, only an admin asks for membership changes), so it comes from
//! the certificate the cluster's CA signed, never from what a peer says in a frame.

use std::fmt;
use std::str::FromStr;

use crate::TlsError;

const SCHEME: &str = "fawn://";
/// A cluster name is one DNS label: it is also the certificates' DNS name `<cluster>.fawn`.
pub const CLUSTER_NAME_BYTES_MAX: usize = 63;

/// What a process is to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Manager,
    Backend,
    Frontend,
    /// An operator's tool (`fawn status`, `fawn leave`, flush): membership and admin requests.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Manager, Role::Backend, Role::Frontend, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Manager => "manager",
            Role::Backend => "backend",
            Role::Frontend => "frontend",
            Role::Admin => "admin",
        }
    }
}

impl FromStr for Role {
    type Err = TlsError;

    fn from_str(text: &str) -> Result<Self, TlsError> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == text)
            .ok_or_else(|| TlsError::Identity(format!("unknown role `{text}`")))
    }
}

/// The identity a certificate carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub cluster: String,
    pub role: Role,
    pub node: u32,
}

impl Identity {
    pub fn new(cluster: &str, role: Role, node: u32) -> Result<Self, TlsError> {
        check_cluster_name(cluster)?;
        Ok(Identity { cluster: cluster.to_owned(), role, node })
    }

    /// The URI subject alternative name that carries this identity.
    pub fn uri(&self) -> String {
        format!("{SCHEME}{}/{}/{}", self.cluster, self.role.as_str(), self.node)
    }

    /// Parses a URI made by [`Identity::uri`].
    pub fn from_uri(uri: &str) -> Result<Self, TlsError> {
        let bad = || TlsError::Identity(format!("`{uri}` is not fawn://<cluster>/<role>/<node>"));
        let rest = uri.strip_prefix(SCHEME).ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let (Some(cluster), Some(role), Some(node), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let node = node.parse().map_err(|_| bad())?;
        Identity::new(cluster, role.parse()?, node)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} of cluster {}", self.role.as_str(), self.node, self.cluster)
    }
}

/// The DNS name every certificate of `cluster` carries and every client verifies: a certificate
/// of another cluster's CA fails the chain check, and one of this CA carries this name.
pub fn cluster_dns_name(cluster: &str) -> String {
    format!("{cluster}.fawn")
}

/// A cluster name is 1 to 63 bytes of lowercase letters, digits and inner hyphens.
pub fn check_cluster_name(cluster: &str) -> Result<(), TlsError> {
    let bytes = cluster.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= CLUSTER_NAME_BYTES_MAX
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-');
    if valid {
        Ok(())
    } else {
        Err(TlsError::Identity(format!(
            "cluster name `{cluster}`: use 1-{CLUSTER_NAME_BYTES_MAX} lowercase letters, digits and inner hyphens"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn uri_round_trips_and_rejects_garbage() {
        let id = Identity::new("prod-1", Role::Backend, 7).expect("valid");
        assert_eq!(id.uri(), "fawn://prod-1/backend/7");
        assert_eq!(Identity::from_uri(&id.uri()).expect("parse"), id);
        for bad in [
            "",
            "fawn://",
            "http://prod-1/backend/7",
            "fawn://prod-1/backend",
            "fawn://prod-1/backend/7/x",
            "fawn://prod-1/king/7",
            "fawn://prod-1/backend/-1",
            "fawn://Prod/backend/1",
            "fawn://-a/backend/1",
        ] {
            assert!(Identity::from_uri(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn cluster_names_are_dns_labels() {
        assert!(check_cluster_name("a").is_ok());
        assert!(check_cluster_name(&"a".repeat(CLUSTER_NAME_BYTES_MAX)).is_ok());
        assert!(check_cluster_name(&"a".repeat(CLUSTER_NAME_BYTES_MAX + 1)).is_err());
        assert!(check_cluster_name("a.b").is_err());
        assert!(check_cluster_name("a-").is_err());
    }

    proptest! {
        #[test]
        fn parsing_any_text_never_panics(text in ".{0,80}") {
            let _ = Identity::from_uri(&text);
        }

        #[test]
        fn every_valid_identity_round_trips(cluster in "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", role in 0usize..4, node: u32) {
            let id = Identity::new(&cluster, Role::ALL[role], node).expect("valid");
            prop_assert_eq!(Identity::from_uri(&id.uri()).expect("parse"), id);
        }
    }
}
