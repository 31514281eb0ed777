//! Issue 20: the binary prints errors as `{:#}` (each error, then its
//! `source()` chain, joined by ": "). An error whose message already holds
//! its cause must not also hand it out as its source, or the operator reads
//! `No such file or directory (os error 2): No such file or directory (os
//! error 2)`. Every layer's errors, provoked for real, checked here.

use keysync_proto::v1;
use salt_keysync::disk::pki::dirs::Trust;

/// Every error printed as the binary prints it, with the cause that must
/// appear in it exactly once; all of them are checked before failing.
#[derive(Default)]
struct Shown(Vec<String>);

impl Shown {
    fn once(&mut self, what: &str, error: impl Into<anyhow::Error>, cause: &str) {
        let shown = format!("{:#}", error.into());
        if shown.matches(cause).count() != 1 {
            self.0.push(format!("{what}: {cause:?} should appear once in {shown:?}"));
        }
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert!(self.0.is_empty(), "{}", self.0.join("\n"));
        }
    }
}

fn enoent() -> String {
    std::io::Error::from_raw_os_error(libc::ENOENT).to_string()
}

fn enotdir() -> String {
    std::io::Error::from_raw_os_error(libc::ENOTDIR).to_string()
}

fn trust() -> Trust {
    Trust::of(rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
}

#[test]
fn io_causes_are_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("below");
    let mut shown = Shown::default();

    let e = salt_keysync::config::Config::load(&missing).unwrap_err();
    shown.once("config", e, &enoent());

    let e = salt_keysync::cli::status::query(&under_file).unwrap_err();
    shown.once("status", e, &enotdir());

    let e = salt_keysync::disk::pki::dirs::open_path(&missing, &trust()).unwrap_err();
    shown.once("pki folder", e, &enoent());

    let options = salt_keysync::disk::pki::PkiOptions {
        owner: salt_keysync::disk::pki::Owner {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        },
        trust: trust(),
        key_mode: 0o600,
        create: false,
    };
    let Err(e) = salt_keysync::disk::pki::Pki::open(&missing, options) else { panic!("pki_dir opened") };
    shown.once("pki_dir", e, &enoent());

    let e = salt_keysync::disk::state_guard::check_offline(&under_file, &trust(), dir.path()).unwrap_err();
    shown.once("state marker", e, "not a folder");

    let e = salt_keysync::disk::audit::verify_files(std::slice::from_ref(&missing)).unwrap_err();
    shown.once("audit log", e, &enoent());

    let Err(e) = salt_keysync::disk::store::Store::open(&under_file, "master-a") else { panic!("store opened") };
    shown.once("store", e, &enotdir());
}

#[test]
fn wire_causes_are_printed_once() {
    let decision = |minion: &str, key: &[u8]| v1::Decision {
        minion: minion.into(),
        verdict: v1::Verdict::Accepted.into(),
        version: Some(v1::Version { hlc: 1, node: "master-a".into() }),
        public_key: key.to_vec(),
        ..Default::default()
    };
    let mut shown = Shown::default();
    let e = salt_keysync::net::wire::decision_from_wire(decision("a/b", b"")).unwrap_err();
    shown.once("id", e, "forbidden character");
    let e = salt_keysync::net::wire::decision_from_wire(decision("web01", b"")).unwrap_err();
    shown.once("key", e, "key file is empty");
}
