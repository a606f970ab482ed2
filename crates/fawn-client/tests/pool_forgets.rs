//! Guards that the connection pool forgets peers: a connection unused past the pool's idle
//! limit is closed (the peer sees it end) and dropped, one in use is kept, and `forget` /
//! `retain` close connections to peers no longer needed.

use std::time::Duration;

use fawn_client::pool::Pool;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A peer that accepts connections and reports each one's end.
async fn peer() -> (String, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (ended, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let ended = ended.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                let _ = ended.send(());
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn idle_connections_are_closed_and_forgotten() {
    let idle = Duration::from_millis(200);
    let pool = Pool::with_idle_forget(Duration::from_secs(1), idle);
    let (a, mut a_ended) = peer().await;
    let (b, _b_ended) = peer().await;
    let held = pool.get(&a).await.expect("a");
    let _ = pool.get(&b).await.expect("b");
    tokio::time::sleep(idle * 2).await;
    // A call sweeps: b is idle and forgotten; a is held by a caller and kept.
    let (c, _c_ended) = peer().await;
    let _ = pool.get(&c).await.expect("c");
    assert_eq!(pool.len(), 2, "b should be forgotten, a and c kept");
    drop(held);
    tokio::time::sleep(idle * 2).await;
    let _ = pool.get(&c).await.expect("c");
    assert_eq!(pool.len(), 1, "a should be forgotten once no caller holds it");
    tokio::time::timeout(Duration::from_secs(5), a_ended.recv()).await.expect("a's connection closed");

    pool.retain(|addr| addr != c);
    assert!(pool.is_empty());
    let _ = pool.get(&b).await.expect("b");
    pool.forget(&b);
    assert!(pool.is_empty());
}
