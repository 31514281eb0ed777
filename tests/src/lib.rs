//! Test harness: in-process agent clusters with real mTLS and real temporary
//! pki folders, Salt-style file operations, and an "eventually" helper.
#![forbid(unsafe_code)]

pub mod binary;
pub mod cluster;
pub mod docs;
pub mod probe;
pub mod proxy;
pub mod salt;
pub mod salt_ops;

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` until it returns true, or panics after `timeout` with `what`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        if start.elapsed() > timeout {
            panic!("not true after {timeout:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `eventually` for a plain synchronous condition.
pub async fn wait_until(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    eventually(timeout, what, || std::future::ready(check())).await
}
