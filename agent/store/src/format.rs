//! The state store's format, recorded in the store and copied as plain text
//! beside it (`state.format`), so that a release that cannot read a store
//! refuses it before it changes anything, and the package's install scripts
//! (which run before this binary is replaced) can refuse a downgrade.
//!
//! - Format 1: 0.1.0. Decision records of layout 1 (`codec.rs`); the store
//!   says nothing of its format.
//! - Format 2: 0.2.0. Layout 2 (a record's first byte is 0x10; 0x11, layout
//!   3, for the rare record with a context of more than 255 versions), claims,
//!   held deletes, the tombstone list. 0.1.0 takes that first byte for the
//!   kind of decision (1 to 3) and refuses the first record it loads: "cannot
//!   load the state store; if it is corrupt, rebuild it …: record for "…" is
//!   corrupt". The store is not corrupt: it is newer.
//!
//! A store that says nothing is of format 1 (or of a 0.2.0 build before this
//! record existed): this release reads both, and marks it as its own when it
//! opens it. A store of a newer format is refused by [`check`], naming the
//! release that wrote it, the releases that read it, and the way out.

use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use redb::ReadableTable;

/// The format this release reads (with every older one) and writes. The
/// package scripts hold the same number (`reads=` in
/// `packaging/debian/preinst`, `prerm` and `packaging/rpm/pre.sh`).
pub const FORMAT: u32 = 2;
/// The first release that reads [`FORMAT`]: a downgrade below it cannot use
/// a store this release wrote. Written into `state.format` (`read-since`),
/// where the installed package's prerm reads it at a downgrade.
pub const FORMAT_SINCE: &str = "0.2.0";
/// The plain-text copy beside `state.redb`.
pub const TEXT_NAME: &str = "state.format";
/// This release.
pub const THIS_RELEASE: &str = env!("CARGO_PKG_VERSION");

const META_FORMAT: &str = "format";
const META_WRITTEN_BY: &str = "format_written_by";
const META_READ_SINCE: &str = "format_read_since";
/// A text file this large is no format marker.
const MAX_TEXT_BYTES: u64 = 4096;

/// A store's format: its number, the release that wrote it, and the first
/// release that reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub number: u32,
    pub written_by: String,
    pub read_since: String,
}

impl Format {
    /// This release's.
    pub fn this_release() -> Format {
        Format { number: FORMAT, written_by: THIS_RELEASE.into(), read_since: FORMAT_SINCE.into() }
    }

    /// Whether this release reads it.
    pub fn is_readable(&self) -> bool {
        self.number <= FORMAT
    }

    /// The plain text of `state.format`.
    pub fn text(&self) -> String {
        format!(
            "# salt-keysync: the format of state.redb beside it. A release that does not read it refuses to \
             start, and the packages refuse to install it (/usr/share/doc/salt-keysync/operations.md, \
             \"Downgrading\").\nformat {}\nwritten-by {}\nread-since {}\n",
            self.number, self.written_by, self.read_since
        )
    }

    /// Parses `state.format`'s text.
    pub fn parse(text: &str) -> Option<Format> {
        let field = |key: &str| text.lines().find_map(|line| line.strip_prefix(key)).map(|v| v.trim().to_string());
        Some(Format {
            number: field("format ")?.parse().ok()?,
            written_by: field("written-by ").unwrap_or_default(),
            read_since: field("read-since ").unwrap_or_default(),
        })
    }
}

/// A store this release cannot read: what it says, for [`super::StoreError::TooNew`].
pub fn too_new_message(path: &Path, found: &Format) -> String {
    let since = if found.read_since.is_empty() { "?" } else { found.read_since.as_str() };
    format!(
        "state store {} is in format {}, written by salt-keysync {}, which releases before {since} cannot read; \
         this is salt-keysync {THIS_RELEASE}, which reads formats up to {FORMAT} (a downgrade). Nothing was \
         changed. Either install salt-keysync {since} or later again, or rebuild the state for this release from \
         the peers: stop the agent and run `{} --config FILE`, which moves this store aside (see {})",
        path.display(),
        found.number,
        if found.written_by.is_empty() { "?" } else { found.written_by.as_str() },
        crate::RECOVER_COMMAND,
        crate::RECOVERY_GUIDE,
    )
}

/// The format a store's `meta` table records; `None` for a store that
/// records none (format 1, or new).
pub fn read_meta(meta: &impl ReadableTable<&'static str, &'static [u8]>) -> Result<Option<Format>, redb::StorageError> {
    let text = |key: &str| -> Result<Option<String>, redb::StorageError> {
        Ok(meta.get(key)?.map(|v| String::from_utf8_lossy(v.value()).into_owned()))
    };
    let Some(number) = meta.get(META_FORMAT)? else { return Ok(None) };
    // An unreadable number is no format this release knows.
    let number = number.value().try_into().map(u32::from_be_bytes).unwrap_or(u32::MAX);
    Ok(Some(Format {
        number,
        written_by: text(META_WRITTEN_BY)?.unwrap_or_default(),
        read_since: text(META_READ_SINCE)?.unwrap_or_default(),
    }))
}

/// Records `format` in a store's `meta` table.
pub fn write_meta(
    meta: &mut redb::Table<&'static str, &'static [u8]>,
    format: &Format,
) -> Result<(), redb::StorageError> {
    meta.insert(META_FORMAT, format.number.to_be_bytes().as_slice())?;
    meta.insert(META_WRITTEN_BY, format.written_by.as_bytes())?;
    meta.insert(META_READ_SINCE, format.read_since.as_bytes())?;
    Ok(())
}

/// The format `state_dir`'s store records, read without writing (the store
/// may be in use: then `state.format` says it). `None`: no store, or one
/// that records none.
pub fn peek(state_dir: &Path) -> Result<Option<Format>, String> {
    let path = state_dir.join(super::FILE_NAME);
    if !path.exists() {
        return Ok(None);
    }
    let db = match redb::ReadOnlyDatabase::open(&path) {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Ok(read_text(state_dir).ok().flatten()),
        Err(e) => return Err(format!("state store {}: {e}", path.display())),
    };
    let txn = redb::ReadableDatabase::begin_read(&db).map_err(|e| format!("state store {}: {e}", path.display()))?;
    match txn.open_table(super::META) {
        Ok(meta) => read_meta(&meta).map_err(|e| format!("state store {}: {e}", path.display())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(format!("state store {}: {e}", path.display())),
    }
}

/// What `state.format` in `state_dir` says, if it is there.
pub fn read_text(state_dir: &Path) -> io::Result<Option<Format>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(state_dir.join(TEXT_NAME))
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = String::new();
    file.take(MAX_TEXT_BYTES).read_to_string(&mut text)?;
    Ok(Format::parse(&text))
}

/// Writes `state.format` in `state_dir` (mode 0600, under a fresh name,
/// synced, renamed into place) unless it already says `format`.
pub fn write_text(state_dir: &Path, format: &Format) -> io::Result<()> {
    if read_text(state_dir).ok().flatten().as_ref() == Some(format) {
        return Ok(());
    }
    let staged = state_dir.join(format!(".{TEXT_NAME}.{}", std::process::id()));
    let written = (|| {
        let _ = std::fs::remove_file(&staged);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&staged)?;
        file.write_all(format.text().as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&staged, state_dir.join(TEXT_NAME))?;
        std::fs::File::open(state_dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    written
}

/// A store file another user owns, with the names /etc/passwd gives the
/// users (the agent finds it before it opens the store).
#[derive(Debug)]
pub struct Foreign {
    pub path: PathBuf,
    pub uid: u32,
    pub euid: u32,
    /// The names of `uid` and `euid`, where known.
    pub names: (Option<String>, Option<String>),
}

impl Foreign {
    pub fn message(&self) -> String {
        let name = |name: &Option<String>| name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default();
        format!(
            "{} is owned by uid {}{}, not by this agent's user (uid {}{}), which cannot write it: an agent or \
             `recover` run as another user left it. As root, hand it over with /usr/lib/salt-keysync/owners \
             (the packages run it at every install), or chown it to uid {}",
            self.path.display(),
            self.uid,
            name(&self.names.0),
            self.euid,
            name(&self.names.1),
            self.euid,
        )
    }
}

/// For tests of other crates (the `fault-injection` feature): records
/// `format` in the store of `state_dir` as a release that wrote it would,
/// and in `state.format`.
#[cfg(feature = "fault-injection")]
pub fn set_for_tests(state_dir: &Path, format: &Format) {
    let db = redb::Database::create(state_dir.join(super::FILE_NAME)).expect("open the store");
    let txn = db.begin_write().expect("a write transaction");
    {
        let mut meta = txn.open_table(super::META).expect("the meta table");
        write_meta(&mut meta, format).expect("write the format");
    }
    txn.commit().expect("commit");
    std::fs::write(state_dir.join(TEXT_NAME), format.text()).expect("write state.format");
}
