//! Guards CA bundles (`ca.pem` holding several CA certificates, as during a CA rotation): a
//! bundle of two CAs of the process's cluster loads, whichever CA issued its certificate; a
//! bundle that also holds another cluster's CA, or no certificate at all, is refused.

use fawn_tls::{ClusterCa, Identity, Role, TlsSetup};

fn load(trusted: &str, issuer: &ClusterCa) -> Result<TlsSetup, String> {
    let identity = Identity::new(issuer.cluster(), Role::Backend, 1).expect("identity");
    let credentials = issuer.issue(&identity).expect("issue");
    TlsSetup::new(trusted, &credentials, identity).map_err(|e| e.to_string())
}

#[test]
fn a_bundle_must_hold_only_cas_of_the_cluster() {
    let old = ClusterCa::create("alpha").expect("old CA");
    let new = ClusterCa::create("alpha").expect("new CA");
    let other = ClusterCa::create("beta").expect("other cluster's CA");
    let both = format!("{}{}", old.cert_pem(), new.cert_pem());
    assert!(load(&both, &old).is_ok(), "a certificate of the first CA");
    assert!(load(&both, &new).is_ok(), "a certificate of the second CA");
    let mixed = format!("{both}{}", other.cert_pem());
    let refused = load(&mixed, &new).err().unwrap_or_default();
    assert!(refused.contains("beta"), "another cluster's CA in the bundle is refused: {refused}");
    assert!(load("", &new).is_err(), "an empty bundle is refused");
}
