//! Flags and commands of the cluster's mutual TLS: every role's `--tls-dir` / `--plaintext`,
//! the admin tools' credentials, and `fawn ca` (create the CA, issue certificates).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use fawn_tls::{ClusterCa, Identity, Role};

/// How a role's native connections are made: one of the two flags is required.
#[derive(Args, Debug)]
pub struct TransportArgs {
    /// Directory holding the cluster CA's certificate (`ca.pem`) and this process's
    /// certificate and key (`<role>-<id>.pem`, `<role>-<id>.key`, mode 0600): every native
    /// connection, in and out, is mutual TLS and a peer's role comes from its certificate.
    /// `fawn ca` makes them; `fawn up` does by itself.
    #[arg(long, value_name = "DIR", required_unless_present = "plaintext", conflicts_with = "plaintext")]
    tls_dir: Option<PathBuf>,
    /// Native connections in plain TCP, unauthenticated and unencrypted: for a trusted
    /// network only (tests, a single host).
    #[arg(long)]
    plaintext: bool,
}

impl TransportArgs {
    /// Sets this process's transport as `role` `node`.
    pub fn apply(&self, role: Role, node: u32) -> anyhow::Result<()> {
        fawn_kv::run::use_transport(self.tls_dir.as_deref(), role, node)
    }
}

/// The credentials an admin command (`status`, `leave`, `managers`) connects with.
#[derive(Args, Debug)]
pub struct AdminTransportArgs {
    /// Directory holding `ca.pem` and an admin certificate (`admin-0.pem`, `admin-0.key`);
    /// `fawn up` writes them to `<data-dir>/tls`.
    #[arg(long, value_name = "DIR", default_value = "fawn-data/tls", conflicts_with = "plaintext")]
    tls_dir: PathBuf,
    /// Connect in plain TCP (to a cluster started with `--plaintext`).
    #[arg(long)]
    plaintext: bool,
}

impl AdminTransportArgs {
    pub fn apply(&self) -> anyhow::Result<()> {
        if !self.plaintext && !self.tls_dir.join("ca.pem").exists() {
            anyhow::bail!(
                "no cluster CA at {}: give --tls-dir DIR (with ca.pem and admin-0.pem/.key), or --plaintext for a cluster started with --plaintext",
                self.tls_dir.display()
            );
        }
        fawn_kv::run::use_transport((!self.plaintext).then_some(self.tls_dir.as_path()), Role::Admin, 0)
    }
}

/// `fawn ca`.
#[derive(Args, Debug)]
pub struct CaArgs {
    #[command(subcommand)]
    command: CaCommand,
}

#[derive(Subcommand, Debug)]
enum CaCommand {
    /// Create a cluster CA in DIR (`ca.pem`, and `ca.key` readable by its owner only). The
    /// cluster's name is in every certificate it issues: a process with a certificate of
    /// another CA is refused in the handshake. Keep `ca.key` where certificates are issued
    /// only; every process needs `ca.pem`.
    Init {
        /// Directory to create the CA in.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The cluster's name: 1-63 lowercase letters, digits and inner hyphens.
        #[arg(long)]
        cluster: String,
    },
    /// Issue a process's certificate and key (`<role>-<id>.pem`, `.key`) with the CA in DIR.
    /// Give a manager its `--id`, a back-end its `--node`, a front-end its `--id`, an
    /// operator's tools the role admin (id 0 is what they load).
    Issue {
        /// Directory holding the CA (`ca.pem`, `ca.key`).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// manager, backend, frontend or admin.
        #[arg(long, value_parser = ["manager", "backend", "frontend", "admin"])]
        role: String,
        /// The process's id in its role.
        #[arg(long)]
        id: u32,
        /// Where to write the certificate and key (default: DIR); `ca.pem` is copied there too.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

impl CaArgs {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            CaCommand::Init { dir, cluster } => {
                anyhow::ensure!(!dir.join("ca.pem").exists(), "{} already holds a CA", dir.display());
                let ca = ClusterCa::create(&cluster)?;
                ca.save(&dir).with_context(|| format!("saving the CA in {}", dir.display()))?;
                println!("cluster {} CA created in {}", ca.cluster(), dir.display());
                Ok(())
            }
            CaCommand::Issue { dir, role, id, out } => {
                let ca =
                    ClusterCa::load(&dir).with_context(|| format!("loading the CA in {}", dir.display()))?;
                let identity = Identity::new(ca.cluster(), role.parse()?, id)?;
                let out = out.unwrap_or_else(|| dir.clone());
                issue(&ca, &identity, &out)?;
                println!("issued {} into {}", identity.uri(), out.display());
                Ok(())
            }
        }
    }
}

fn issue(ca: &ClusterCa, identity: &Identity, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    ca.issue(identity)?.save(out, identity)?;
    let ca_pem = out.join("ca.pem");
    if !ca_pem.exists() {
        std::fs::write(&ca_pem, ca.cert_pem()).with_context(|| format!("writing {}", ca_pem.display()))?;
    }
    Ok(())
}
