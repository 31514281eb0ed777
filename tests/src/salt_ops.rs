//! The file operations Salt performs on a pki_dir, reproduced step by step:
//! Salt 3006 renames between folders, Salt 3008 removes the id everywhere and
//! renames a `tmpXXXXXXXX` file over the final name, and the master writes
//! pending keys in place.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub const FOLDERS: [&str; 3] = ["minions", "minions_pre", "minions_rejected"];

/// A fresh, real public key (ECDSA P-256, SPKI PEM) as a minion would send.
pub fn new_public_key() -> String {
    rcgen::KeyPair::generate().expect("generate key pair").public_key_pem()
}

/// Which Salt line's file operations to perform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaltLine {
    S3006,
    S3008,
}

pub fn path(pki: &Path, folder: &str, id: &str) -> PathBuf {
    pki.join(folder).join(id)
}

/// What a key file's times and inode say of the writes to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Inode and mtime (seconds, nanoseconds): the same only if the file
    /// was neither written nor replaced.
    pub written: (u64, i64, i64),
    /// ctime (seconds, nanoseconds): also moves on a chmod, chown or link.
    pub changed: (i64, i64),
}

/// The stamp of every file in `pki`'s three key folders, by `folder/name`.
pub fn stamps(pki: &Path) -> std::io::Result<std::collections::BTreeMap<String, FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    let mut files = std::collections::BTreeMap::new();
    for folder in FOLDERS {
        for entry in fs::read_dir(pki.join(folder))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let stamp = FileStamp {
                written: (meta.ino(), meta.mtime(), meta.mtime_nsec()),
                changed: (meta.ctime(), meta.ctime_nsec()),
            };
            files.insert(format!("{folder}/{}", entry.file_name().to_string_lossy()), stamp);
        }
    }
    Ok(files)
}

/// The master receiving a minion's key: written in place into minions_pre.
pub fn master_writes_pending(pki: &Path, id: &str, key: &str) {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path(pki, "minions_pre", id))
        .unwrap();
    let (head, tail) = key.as_bytes().split_at(key.len() / 2);
    file.write_all(head).unwrap();
    file.flush().unwrap();
    file.write_all(tail).unwrap();
}

/// Which folder holds `id`, and its bytes.
pub fn find(pki: &Path, id: &str) -> Option<(&'static str, Vec<u8>)> {
    FOLDERS.iter().find_map(|folder| fs::read(path(pki, folder, id)).ok().map(|bytes| (*folder, bytes)))
}

/// `salt-key -a id` (to "minions") or `salt-key -r id` (to "minions_rejected").
pub fn move_key(line: SaltLine, pki: &Path, id: &str, to: &str) {
    let (from, bytes) = find(pki, id).unwrap_or_else(|| panic!("{id} is in no folder of {}", pki.display()));
    match line {
        SaltLine::S3006 => fs::rename(path(pki, from, id), path(pki, to, id)).unwrap(),
        SaltLine::S3008 => {
            for folder in FOLDERS {
                let _ = fs::remove_file(path(pki, folder, id));
            }
            let tmp = path(pki, to, &tmp_name());
            let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).unwrap();
            file.write_all(&bytes).unwrap();
            file.flush().unwrap();
            drop(file);
            fs::rename(&tmp, path(pki, to, id)).unwrap();
        }
    }
}

/// `salt-key -d id`.
pub fn delete_key(pki: &Path, id: &str) {
    for folder in FOLDERS {
        let _ = fs::remove_file(path(pki, folder, id));
    }
}

/// A name like `tempfile.mkstemp` makes: "tmp" and eight of `[a-z0-9_]`.
fn tmp_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() as u64) << 20;
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789_";
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let tail: String = (0..8)
        .map(|_| {
            x = x.rotate_left(7).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            alphabet[(x % alphabet.len() as u64) as usize] as char
        })
        .collect();
    format!("tmp{tail}")
}
