//! What the audit log costs the agent: time per `record()`, per `sync()`
//! call, per fdatasync (what a blocking sync cost), and `verify` speed.
//!
//!     cargo run --release -p salt-keysync --example audit_cost -- DIR

use std::time::Instant;

use salt_keysync::disk::audit::{verify_files, Action, AuditLog, Outcome, Record, Via};

const N_RECORDS: usize = 100_000;
const N_SYNCS: usize = 200;

fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[ms.len() * 99 / 100])
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: audit_cost DIR");
    let path = std::path::Path::new(&dir).join("audit.jsonl");
    let log = AuditLog::open(&path, "master-a").unwrap();
    let record = Record {
        minion: Some("web01".into()),
        fingerprint: Some(
            "dd:1d:33:71:aa:a1:fb:8c:28:7a:f4:57:4a:da:c8:4f:90:5c:6f:bb:e0:c1:ec:48:28:1f:5e:4f:bb:eb:c9:4b".into(),
        ),
        origin: Some("master-b".into()),
        version: Some("1732190000000.0@master-b".into()),
        ..Record::new(Action::Accept, Via::Peer(&keysync_machine::PeerName::new("master-b").unwrap()), Outcome::Applied)
    };

    let start = Instant::now();
    for _ in 0..N_RECORDS {
        log.record(record.clone());
    }
    println!("record(): {:.2} us each over {N_RECORDS}", start.elapsed().as_secs_f64() * 1e6 / N_RECORDS as f64);

    let mut calls = Vec::new();
    for _ in 0..N_SYNCS {
        log.record(record.clone());
        let start = Instant::now();
        log.sync();
        calls.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p99) = percentiles(calls);
    println!("sync() call (the flusher thread runs fdatasync): p50 {p50:.3} ms, p99 {p99:.3} ms");

    let file = std::fs::File::open(&path).unwrap();
    let mut syncs = Vec::new();
    for _ in 0..N_SYNCS {
        log.record(record.clone());
        let start = Instant::now();
        file.sync_data().unwrap();
        syncs.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p99) = percentiles(syncs);
    println!("fdatasync after one record (a blocking sync): p50 {p50:.3} ms, p99 {p99:.3} ms");

    let start = Instant::now();
    let report = verify_files(&[path]).unwrap();
    assert!(report.broken.is_none());
    println!("verify: {} records in {:.0} ms", report.n_records, start.elapsed().as_secs_f64() * 1e3);
}
