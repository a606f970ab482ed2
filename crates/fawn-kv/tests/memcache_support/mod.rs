//! Shared by the `memcache_*` tests: an in-memory [`KvService`] that decides updates with the
//! real `fawn_proto::op::decide` (so the semantics under test are the cluster's), a server
//! started in-process on an ephemeral port, and byte-exact request/reply helpers.

#![allow(dead_code)]

pub mod tls;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fawn_kv::memcache::{serve, MemcacheConfig};
use fawn_kv::service::{ItemStats, KvService, ServiceError};
use fawn_proto::op::{decide, is_expired, Effect, Item, Outcome, Update};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub fn now() -> u32 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as u32)
}

struct Stored {
    item: Item,
    stored_at: u32,
}

/// A single-node stand-in for the cluster: one map, one sequence (the "head").
#[derive(Default)]
pub struct MemService {
    items: Mutex<HashMap<Vec<u8>, Stored>>,
    seq: AtomicU64,
    /// Pending `flush_all` time (0 = none).
    flush_at: Mutex<u32>,
    /// When set, every call fails with `Unavailable` (a chain that cannot serve).
    pub fail: AtomicBool,
}

impl MemService {
    fn check(&self) -> Result<(), ServiceError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(ServiceError::Unavailable("no chain for range".into()));
        }
        Ok(())
    }

    /// Applies a due flush: items stored before the flush time vanish.
    fn apply_flush(&self, items: &mut HashMap<Vec<u8>, Stored>) {
        let mut at = self.flush_at.lock();
        if *at != 0 && now() >= *at {
            let cutoff = *at;
            items.retain(|_, s| s.stored_at >= cutoff && s.stored_at != 0);
            *at = 0;
        }
    }
}

impl KvService for MemService {
    async fn get(&self, key: &[u8]) -> Result<Option<Item>, ServiceError> {
        self.check()?;
        let mut items = self.items.lock();
        self.apply_flush(&mut items);
        Ok(items.get(key).filter(|s| !is_expired(s.item.expiry, now())).map(|s| s.item.clone()))
    }

    async fn update(&self, update: Update) -> Result<Outcome, ServiceError> {
        self.check()?;
        let mut items = self.items.lock();
        self.apply_flush(&mut items);
        let new_cas = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let current = items.get(&update.key).map(|s| &s.item);
        let (outcome, effect) = decide(&update, current, now(), new_cas);
        match effect {
            Effect::None => {}
            Effect::Delete => {
                items.remove(&update.key);
            }
            Effect::Put { value, flags, expiry, state } => {
                let item = Item { value, flags, expiry, cas: new_cas, state };
                items.insert(update.key, Stored { item, stored_at: now() });
            }
        }
        Ok(outcome)
    }

    async fn flush_all(&self, at_unix: u32) -> Result<(), ServiceError> {
        self.check()?;
        if at_unix <= now() {
            self.items.lock().clear();
        } else {
            *self.flush_at.lock() = at_unix;
        }
        Ok(())
    }

    async fn item_stats(&self) -> Result<ItemStats, ServiceError> {
        self.check()?;
        let items = self.items.lock();
        let live = items.iter().filter(|(_, s)| !is_expired(s.item.expiry, now()));
        let (count, bytes) =
            live.fold((0, 0), |(n, b), (k, s)| (n + 1, b + (k.len() + s.item.value.len()) as u64));
        Ok(ItemStats { curr_items: count, bytes })
    }

    /// The double keeps everything in memory without a limit; it reports memcached's default.
    fn capacity_bytes(&self) -> u64 {
        64 * 1024 * 1024
    }
}

/// A running server; dropping `stop` (or sending on it) shuts it down.
pub struct Server {
    pub addr: std::net::SocketAddr,
    pub service: Arc<MemService>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    pub async fn start() -> Server {
        Self::with_config(MemcacheConfig::default()).await
    }

    pub async fn with_config(config: MemcacheConfig) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let service = Arc::new(MemService::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, service.clone(), config, async {
            let _ = stopped.await;
        }));
        Server { addr, service, stop: Some(stop), task: Some(task) }
    }

    pub async fn connect(&self) -> Client {
        Client { stream: TcpStream::connect(self.addr).await.expect("connect") }
    }

    /// Shuts the server down and waits until `serve` has returned.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("serve returns promptly after shutdown")
                .expect("serve task");
        }
    }
}

pub struct Client {
    pub stream: TcpStream,
}

impl Client {
    pub async fn send(&mut self, request: &[u8]) {
        self.stream.write_all(request).await.expect("write");
    }

    /// Reads exactly `want.len()` bytes and compares them byte for byte.
    pub async fn expect(&mut self, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        let read = tokio::time::timeout(Duration::from_secs(5), self.stream.read_exact(&mut got));
        match read.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("read failed ({e}); wanted {:?}", show(want)),
            Err(_) => panic!("timed out; wanted {:?}", show(want)),
        }
        assert_eq!(show(&got), show(want));
    }

    /// Sends `request` and checks the reply is exactly `want`.
    pub async fn roundtrip(&mut self, request: &[u8], want: &[u8]) {
        self.send(request).await;
        self.expect(want).await;
    }

    /// Asserts nothing more arrives within `wait`, and the connection is still open.
    pub async fn expect_silence(&mut self, wait: Duration) {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(wait, self.stream.read(&mut byte)).await {
            Err(_) => {}
            Ok(Ok(0)) => panic!("connection closed, expected silence"),
            Ok(Ok(_)) => panic!("unexpected byte {:?}", byte[0] as char),
            Ok(Err(e)) => panic!("read error {e}"),
        }
    }

    /// Asserts the server closes the connection (EOF) with nothing more to say.
    pub async fn expect_closed(&mut self) {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), self.stream.read_to_end(&mut rest));
        match read.await {
            Ok(Ok(_)) => assert_eq!(show(&rest), "", "nothing after the error"),
            // A reset is also a close.
            Ok(Err(_)) => {}
            Err(_) => panic!("connection not closed"),
        }
    }

    /// Sends `stats` and returns the value of one `STAT` line.
    pub async fn stat(&mut self, name: &str) -> String {
        let text = self.stats("stats\r\n").await;
        let prefix = format!("STAT {name} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no STAT {name} in {text}"))
            .to_string()
    }

    /// Sends a `stats` request and returns its reply, up to and with `END`.
    pub async fn stats(&mut self, request: &str) -> String {
        self.send(request.as_bytes()).await;
        let mut text = String::new();
        while !text.ends_with("END\r\n") {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk))
                .await
                .expect("stats reply")
                .expect("read");
            assert!(n > 0, "closed during stats");
            text.push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
        text
    }
}

/// Printable form of bytes for readable assertion failures.
pub fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace('\r', "\\r").replace('\n', "\\n\n")
}

/// A binary-protocol request frame (cas 0).
pub fn bin_request(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = vec![0x80, op];
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.extend_from_slice(&[extras.len() as u8, 0, 0, 0]);
    out.extend_from_slice(&((extras.len() + key.len() + value.len()) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    [out, extras.to_vec(), key.to_vec(), value.to_vec()].concat()
}

/// A binary-protocol response frame, as the server should send it.
pub struct BinReply<'a> {
    pub op: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub extras: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl BinReply<'_> {
    /// A reply with no cas, extras or key.
    pub fn plain(op: u8, status: u16, value: &[u8], opaque: u32) -> Vec<u8> {
        BinReply { op, status, opaque, cas: 0, extras: b"", key: b"", value }.bytes()
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0x81, self.op];
        out.extend_from_slice(&(self.key.len() as u16).to_be_bytes());
        out.extend_from_slice(&[self.extras.len() as u8, 0]);
        out.extend_from_slice(&self.status.to_be_bytes());
        let body = self.extras.len() + self.key.len() + self.value.len();
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
        [out, self.extras.to_vec(), self.key.to_vec(), self.value.to_vec()].concat()
    }
}
