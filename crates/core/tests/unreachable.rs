//! A remote that cannot be reached fails within a bounded time with a
//! message naming the URL and a hint. Its own test binary: it sets AWS_*
//! variables, which must not leak into tests of the real MinIO server.

use std::time::Duration;

use mado_core::store::{OpenOptions, Remote, Space};
use mado_core::Hash;

/// An unreachable S3 endpoint fails within a bounded time, naming the URL.
#[tokio::test]
async fn unreachable_remote_fails_fast_with_a_hint() {
    // A loopback port with nothing listening.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
    std::env::set_var("AWS_ACCESS_KEY_ID", "x");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "y");
    let r = Remote::open("s3://nobucket/p", &OpenOptions::default()).unwrap();
    let t = std::time::Instant::now();
    let err = r.get_object(Space::Objects, &Hash([7; 32]), "blob").await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(30), "took {:?}", t.elapsed());
    let msg = err.to_string();
    assert!(msg.contains("s3://nobucket/p") && msg.contains("hint"), "{msg}");
}
