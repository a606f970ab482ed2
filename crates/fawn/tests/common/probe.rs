//! A probe client: puts to one key every 50 ms and records when each put was acknowledged,
//! so a test can tell how long puts to that key's range stalled around a fault.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fawn_client::{Client, ClientOptions};

/// Puts to `key` every 50 ms until stopped; the times of acknowledged puts.
pub struct Probe {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Instant>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Probe {
    pub fn start(bootstrap: Vec<String>, key: String) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let acked: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let ack = acked.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let options = ClientOptions {
                    connect_timeout: Duration::from_secs(1),
                    request_timeout: Duration::from_millis(500),
                    ..ClientOptions::default()
                };
                let Ok(client) = Client::connect(&bootstrap, options).await else { return };
                let mut i = 0u64;
                while !s.load(Ordering::Relaxed) {
                    i += 1;
                    let value = format!("p{i}");
                    let put = client.put(key.as_bytes(), value.as_bytes());
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(600), put).await {
                        ack.lock().expect("lock").push(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        });
        Probe { stop, acked, thread }
    }

    pub fn acked(&self) -> Vec<Instant> {
        self.acked.lock().expect("lock").clone()
    }

    pub fn finish(self) -> Vec<Instant> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let acked = self.acked.lock().expect("lock").clone();
        acked
    }
}
