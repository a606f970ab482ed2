//! The one place that decides whether a native connection is plain TCP or mutual TLS, for
//! both ends: [`Transport::connect`] for outgoing connections (pools, chain links, the manager
//! client, the CLI) and [`Transport::accept`] for a listener's connections.
//!
//! A process sets its transport once at start ([`set`]) from its `--tls-dir` (or its explicit
//! `--plaintext`); everything that connects asks [`current`]. Under TLS both ends present a
//! certificate of the cluster's CA, so a peer of another cluster fails the handshake, and the
//! accepting end learns the peer's [`Identity`] (cluster, role, node) from its certificate:
//! what a peer may ask for is decided from that, never from what it says in a frame.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use fawn_tls::{Identity, TlsSetup};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// How this process's native connections are made.
pub enum Transport {
    /// Plain TCP: no authentication, no encryption (only with an explicit `--plaintext`).
    Plain,
    /// Mutual TLS with this process's credentials.
    Tls(TlsSetup),
}

static CURRENT: RwLock<Option<Arc<Transport>>> = RwLock::new(None);

/// Sets this process's transport (a process sets it once at start; a test process that talks
/// to several clusters in turn sets each one's before talking to it).
pub fn set(transport: Transport) {
    *CURRENT.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(transport));
}

/// This process's transport: plain TCP until [`set`].
pub fn current() -> Arc<Transport> {
    let current = CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone();
    current.unwrap_or_else(|| Arc::new(Transport::Plain))
}

type Tls = Box<tokio_rustls::TlsStream<TcpStream>>;

/// A connected native stream, plain or TLS.
pub enum NetStream {
    Plain(TcpStream),
    Tls(Tls),
}

impl Transport {
    /// Connects to `addr` (TCP, then the TLS handshake) within `timeout`.
    pub async fn connect(&self, addr: &str, timeout: Duration) -> io::Result<NetStream> {
        let connecting = async {
            let tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            match self {
                Transport::Plain => Ok(NetStream::Plain(tcp)),
                Transport::Tls(setup) => {
                    let tls = setup.connector().connect(setup.server_name(), tcp).await?;
                    Ok(NetStream::Tls(Box::new(tls.into())))
                }
            }
        };
        tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }

    /// Completes an accepted connection: under TLS, the handshake, which fails unless the
    /// peer presents a certificate of this cluster's CA, and the peer's identity (`None` in
    /// plain mode, where nothing is known of the peer).
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<(NetStream, Option<Identity>)> {
        let _ = tcp.set_nodelay(true);
        match self {
            Transport::Plain => Ok((NetStream::Plain(tcp), None)),
            Transport::Tls(setup) => {
                let tls = setup.acceptor().accept(tcp).await?;
                let peer = setup
                    .peer_identity(tls.get_ref().1.peer_certificates())
                    .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))?;
                Ok((NetStream::Tls(Box::new(tls.into())), Some(peer)))
            }
        }
    }

    /// This process's own identity under TLS.
    pub fn identity(&self) -> Option<&Identity> {
        match self {
            Transport::Plain => None,
            Transport::Tls(setup) => Some(setup.identity()),
        }
    }
}

impl NetStream {
    /// Separates the directions, for a reader task and a writer task.
    pub fn into_split(self) -> (NetRead, NetWrite) {
        match self {
            NetStream::Plain(tcp) => {
                let (r, w) = tcp.into_split();
                (NetRead::Plain(r), NetWrite::Plain(w))
            }
            NetStream::Tls(tls) => {
                let (r, w) = tokio::io::split(tls);
                (NetRead::Tls(r), NetWrite::Tls { inner: w, accepted: None })
            }
        }
    }
}

/// The reading half of a [`NetStream`].
pub enum NetRead {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<Tls>),
}

/// The writing half of a [`NetStream`]. Every write goes through to the socket before it
/// completes, as on plain TCP: TLS buffers records, and callers written for TCP never flush.
pub enum NetWrite {
    Plain(OwnedWriteHalf),
    /// `accepted`: bytes the TLS session took from the caller's buffer but has not yet sent;
    /// the write completes once they are sent (the caller polls again with the same buffer,
    /// as `write_all` does).
    Tls {
        inner: WriteHalf<Tls>,
        accepted: Option<usize>,
    },
}

impl AsyncRead for NetRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            NetRead::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NetWrite {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NetWrite::Plain(w) => Pin::new(w).poll_write(cx, buf),
            NetWrite::Tls { inner, accepted } => {
                if accepted.is_none() {
                    *accepted = Some(ready!(Pin::new(&mut *inner).poll_write(cx, buf))?);
                }
                ready!(Pin::new(&mut *inner).poll_flush(cx))?;
                Poll::Ready(Ok(accepted.take().unwrap_or(0)))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetWrite::Plain(w) => Pin::new(w).poll_flush(cx),
            NetWrite::Tls { inner, .. } => Pin::new(inner).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NetWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            NetWrite::Tls { inner, .. } => Pin::new(inner).poll_shutdown(cx),
        }
    }
}
