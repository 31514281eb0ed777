//! The redb database under the store, reopened after an I/O error. redb
//! refuses every transaction after one fails to write ("Previous I/O error
//! occurred. Please close and re-open the database.") until the database is
//! closed and opened again: a full state disk left the agent stuck, its
//! writes failing for ever, until someone restarted it. Now the next
//! transaction after an I/O error reopens the database first, so once space
//! is back the agent's retries succeed and it catches up by itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use redb::{Database, ReadTransaction, ReadableDatabase, WriteTransaction};

use super::CACHE_BYTES;

pub(super) struct Db {
    path: PathBuf,
    /// A file (reopened after an I/O error), not the in-memory store.
    file: bool,
    /// `None` between closing the broken database and opening it again.
    inner: RwLock<Option<Database>>,
    /// An I/O error happened: reopen before the next transaction.
    broken: AtomicBool,
    /// Times reopened, for the log and tests.
    reopened: AtomicU64,
}

impl Db {
    pub(super) fn file(path: PathBuf) -> Result<Db, redb::Error> {
        let db = open(&path)?;
        Ok(Db::new(path, true, db))
    }

    pub(super) fn memory(path: PathBuf, db: Database) -> Db {
        Db::new(path, false, db)
    }

    fn new(path: PathBuf, file: bool, db: Database) -> Db {
        Db { path, file, inner: RwLock::new(Some(db)), broken: AtomicBool::new(false), reopened: AtomicU64::new(0) }
    }

    pub(super) fn begin_write(&self) -> Result<WriteTransaction, redb::Error> {
        self.reopen_if_broken()?;
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        let db = inner.as_ref().ok_or(redb::Error::DatabaseClosed)?;
        db.begin_write().map_err(|e| self.noted(e.into()))
    }

    pub(super) fn begin_read(&self) -> Result<ReadTransaction, redb::Error> {
        self.reopen_if_broken()?;
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        let db = inner.as_ref().ok_or(redb::Error::DatabaseClosed)?;
        db.begin_read().map_err(|e| self.noted(e.into()))
    }

    /// Notes an error of any operation: an I/O error breaks the database
    /// until it is reopened.
    pub(super) fn noted(&self, e: redb::Error) -> redb::Error {
        if matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo) {
            self.broken.store(true, Ordering::SeqCst);
        }
        e
    }

    /// How many times the database was reopened after an I/O error.
    pub(super) fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::SeqCst)
    }

    fn reopen_if_broken(&self) -> Result<(), redb::Error> {
        if !self.file || !self.broken.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if !self.broken.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Closed first: redb holds a lock on its file.
        *inner = None;
        let db = open(&self.path)?;
        *inner = Some(db);
        self.broken.store(false, Ordering::SeqCst);
        let n = self.reopened.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::warn!(path = %self.path.display(), n, "state store reopened after an I/O error");
        Ok(())
    }
}

fn open(path: &PathBuf) -> Result<Database, redb::Error> {
    Ok(redb::Builder::new().set_cache_size(CACHE_BYTES).create(path)?)
}
