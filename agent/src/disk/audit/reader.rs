//! Reading audit files: whole lines only. A record exists once its newline
//! is written, so a last line without one (a crash during a write, or a
//! write still in progress) is reported as torn, never parsed; `Follower`
//! tails a file across logrotate's rename and copytruncate.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{line_hash, Record};

/// One complete line of an audit file.
#[derive(Clone, Debug)]
pub struct Line {
    /// 1-based line number in its file.
    pub number: usize,
    /// The line as written (without its newline; invalid UTF-8 replaced).
    pub raw: String,
    /// What the next record's `prev` must be.
    pub hash: String,
    /// The record, or why the line is not one.
    pub record: Result<Record, String>,
}

/// A last line without its newline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Torn {
    pub line: usize,
    pub len: usize,
}

/// A whole file read.
#[derive(Debug)]
pub struct Scan {
    pub lines: Vec<Line>,
    pub torn: Option<Torn>,
}

impl Torn {
    pub fn warning(&self, path: &Path) -> String {
        format!(
            "{}: line {} is incomplete ({} bytes without a newline: a crash during a write, or a write in progress); ignored",
            path.display(),
            self.line,
            self.len
        )
    }
}

fn parse_line(number: usize, bytes: &[u8]) -> Line {
    let raw = String::from_utf8_lossy(bytes).into_owned();
    let record = match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str::<Record>(text).map_err(|e| format!("not a record: {e}")),
        Err(e) => Err(format!("not UTF-8: {e}")),
    };
    Line { number, raw, hash: line_hash(bytes), record }
}

/// Calls `each` for every complete line of `reader`, numbering from
/// `first_number`; returns the torn last line, if any.
pub fn each_line(reader: impl BufRead, first_number: usize, mut each: impl FnMut(Line)) -> io::Result<Option<Torn>> {
    let mut reader = reader;
    let mut buf = Vec::new();
    let mut number = first_number;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            return Ok(None);
        }
        if buf.last() != Some(&b'\n') {
            return Ok(Some(Torn { line: number, len: buf.len() }));
        }
        buf.pop();
        each(parse_line(number, &buf));
        number += 1;
    }
}

/// Reads a whole file.
pub fn scan(path: &Path) -> io::Result<Scan> {
    let file = File::open(path)?;
    let mut lines = Vec::new();
    let torn = each_line(BufReader::new(file), 1, |line| lines.push(line))?;
    Ok(Scan { lines, torn })
}

/// Tails a file: `poll` returns the lines completed since the last call. When
/// the path is renamed away and re-created, the old file is read to its end
/// first and the new one from its start; when the file is truncated in place,
/// reading restarts at its start.
pub struct Follower {
    path: PathBuf,
    file: Option<File>,
    identity: (u64, u64),
    offset: u64,
    partial: Vec<u8>,
    next_number: usize,
    /// The first line read from this file (with its newline): a file
    /// truncated and written again past `offset` between two polls no longer
    /// starts with it.
    first_line: Vec<u8>,
}

/// What [`Follower::poll`] found.
#[derive(Debug, Default)]
pub struct Polled {
    pub lines: Vec<Line>,
    /// Set when the path was rotated since the last poll ("renamed",
    /// "truncated").
    pub rotated: Option<&'static str>,
}

impl Follower {
    /// Starts at the beginning of `path`, which need not exist yet.
    pub fn new(path: &Path) -> Follower {
        let mut follower = Follower {
            path: path.into(),
            file: None,
            identity: (0, 0),
            offset: 0,
            partial: Vec::new(),
            next_number: 1,
            first_line: Vec::new(),
        };
        follower.reopen();
        follower
    }

    fn reopen(&mut self) -> bool {
        match File::open(&self.path).and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((file, meta)) => {
                self.file = Some(file);
                self.identity = (meta.dev(), meta.ino());
                self.offset = 0;
                self.partial.clear();
                self.next_number = 1;
                self.first_line.clear();
                true
            }
            Err(_) => false,
        }
    }

    fn read_new(&mut self, out: &mut Vec<Line>) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut fresh = Vec::new();
        file.read_to_end(&mut fresh)?;
        self.offset += fresh.len() as u64;
        self.partial.extend_from_slice(&fresh);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            if self.next_number == 1 {
                self.first_line = self.partial[..=end].to_vec();
            }
            out.push(parse_line(self.next_number, &self.partial[..end]));
            self.next_number += 1;
            self.partial.drain(..=end);
        }
        Ok(())
    }

    pub fn poll(&mut self) -> io::Result<Polled> {
        let mut polled = Polled::default();
        self.read_new(&mut polled.lines)?;
        let Ok(meta) = std::fs::metadata(&self.path) else { return Ok(polled) };
        let had_file = self.file.is_some();
        if !had_file || (meta.dev(), meta.ino()) != self.identity {
            // Renamed away (and re-created), or created: the old file was read to its end above.
            if self.reopen() {
                polled.rotated = had_file.then_some("renamed");
                self.read_new(&mut polled.lines)?;
            }
        } else if self.rewritten() {
            polled.rotated = Some("truncated");
            self.offset = 0;
            self.partial.clear();
            self.next_number = 1;
            self.first_line.clear();
            self.read_new(&mut polled.lines)?;
        }
        Ok(polled)
    }

    /// Whether the open file was truncated since it was read: shorter than
    /// what was read, or no longer starting with the line it started with.
    fn rewritten(&self) -> bool {
        let Some(file) = &self.file else { return false };
        let Ok(len) = file.metadata().map(|m| m.len()) else { return false };
        if len < self.offset {
            return true;
        }
        let mut start = vec![0; self.first_line.len()];
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut start, 0).is_ok_and(|()| start != self.first_line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_line_without_newline_is_torn_not_parsed() {
        let text = b"{\"time\":\"t\",\"node\":\"a\",\"action\":\"x\",\"via\":\"local\",\"outcome\":\"o\"}\nnot json\n{\"time\"";
        let mut lines = Vec::new();
        let torn = each_line(&text[..], 1, |l| lines.push(l)).unwrap();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].record.is_ok());
        assert!(lines[1].record.as_ref().unwrap_err().starts_with("not a record"), "{:?}", lines[1].record);
        assert_eq!(torn, Some(Torn { line: 3, len: 7 }));
    }
}
