//! Guards durability across a whole-cluster restart: data written through the cluster is all
//! there after `fawn up` is stopped (SIGTERM) and started again on the same data directory.

mod common;

use common::{Cluster, Shape};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_every_write() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client().await;
    for i in 0..1000u32 {
        client.put(format!("r-{i}").as_bytes(), format!("v-{i}").as_bytes()).await.expect("put");
    }
    for i in (0..1000u32).step_by(3) {
        client.delete(format!("r-{i}").as_bytes()).await.expect("delete");
    }
    drop(client);

    cluster.restart();

    let client = cluster.client().await;
    for i in 0..1000u32 {
        let got = client.get(format!("r-{i}").as_bytes()).await.expect("get").map(|it| it.value);
        let want = (!i.is_multiple_of(3)).then(|| format!("v-{i}").into_bytes());
        assert_eq!(got, want, "r-{i} after restart");
    }
    // The cluster keeps accepting writes after the restart (sequence numbers continue).
    let cas_before = client.put(b"after", b"1").await.expect("put");
    let cas_after = client.put(b"after", b"2").await.expect("put");
    assert!(cas_after > cas_before);
}
