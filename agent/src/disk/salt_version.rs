//! The version of the salt-master beside this agent, for peers to compare.
//!
//! Learnt by running `[salt] version_command` (`salt-master --version` by
//! default) at start, at every reload, and again when the program's file
//! changes (a package upgrade replaces it) — never per `Hello`: Salt takes
//! about half a second of CPU to start. Reading package metadata instead
//! would mean guessing which Python and which site-packages the master
//! runs from (onedir, distribution, pip in a venv); the program the master
//! is started with answers for all of them.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Longest a version command may run.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Longest version string kept (and accepted from a peer).
pub const MAX_VERSION_LEN: usize = 64;

/// The salt-master version as last learnt, shared by the tasks of one agent.
#[derive(Clone)]
pub struct SaltVersion {
    command: Arc<Vec<String>>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    version: Option<String>,
    /// Why the last run gave no version.
    error: Option<String>,
    /// The program's (path, inode, mtime) at the last run.
    program: Option<(PathBuf, u64, SystemTime)>,
    running: bool,
}

impl SaltVersion {
    /// Starts learning the version in the background.
    pub fn start(command: Vec<String>) -> SaltVersion {
        let version = SaltVersion { command: Arc::new(command), state: Arc::default() };
        version.refresh();
        version
    }

    /// The version as last learnt, `Err` with why it is unknown. Runs the
    /// command again, in the background, if the program's file changed.
    pub fn current(&self) -> Result<String, String> {
        let changed = {
            let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            !state.running && program_identity(&self.command[0]) != state.program
        };
        if changed {
            self.refresh();
        }
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match (&state.version, &state.error) {
            (Some(version), _) => Ok(version.clone()),
            (None, Some(error)) => Err(error.clone()),
            (None, None) => Err("not learnt yet".into()),
        }
    }

    /// Runs the command again in the background (at start and at reload).
    pub fn refresh(&self) {
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.running {
                return;
            }
            state.running = true;
        }
        let (command, state) = (self.command.clone(), self.state.clone());
        let spawned = std::thread::Builder::new().name("salt-version".into()).spawn(move || {
            let program = program_identity(&command[0]);
            let result = run(&command);
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(version) => {
                    if state.version.as_ref() != Some(&version) {
                        tracing::info!(salt_version = %version, "salt-master version");
                    }
                    (state.version, state.error) = (Some(version), None);
                }
                Err(error) => {
                    if state.error.as_ref() != Some(&error) {
                        tracing::warn!(error = %error, "cannot learn the salt-master version; peers will see it as unknown");
                    }
                    (state.version, state.error) = (None, Some(error));
                }
            }
            state.program = program;
            state.running = false;
        });
        if let Err(e) = spawned {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (state.running, state.error) = (false, Some(format!("cannot start a thread: {e}")));
        }
    }
}

/// The program's path as PATH resolves it, with its inode and mtime.
fn program_identity(program: &str) -> Option<(PathBuf, u64, SystemTime)> {
    use std::os::unix::fs::MetadataExt;
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())?
    };
    let meta = std::fs::metadata(&path).ok()?;
    Some((path, meta.ino(), meta.modified().ok()?))
}

/// Runs `command` and reads the version from what it prints.
fn run(command: &[String]) -> Result<String, String> {
    let shown = command.join(" ");
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("`{shown}`: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = (&mut stdout).take(64 * 1024).read_to_end(&mut text);
        text
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{shown}` did not finish within {}s", TIMEOUT.as_secs()));
            }
            Err(e) => return Err(format!("`{shown}`: {e}")),
        }
    };
    let text = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
    if !status.success() {
        return Err(format!("`{shown}` failed ({status})"));
    }
    parse_version(&text).ok_or_else(|| format!("`{shown}` printed no version: {:?}", text.trim()))
}

/// `salt-master 3008.3 (Argon)` → `3008.3`: the first word that starts
/// with a digit, if it looks like a version.
pub fn parse_version(text: &str) -> Option<String> {
    let word = text.split_whitespace().find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    is_version(word).then(|| word.to_string())
}

/// What a version may look like, here and from a peer.
pub fn is_version(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_VERSION_LEN
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_' | '~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eventually(version: &SaltVersion, check: impl Fn(&Result<String, String>) -> bool) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let current = version.current();
            if check(&current) || Instant::now() > deadline {
                return current;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn versions_are_parsed_from_what_salt_prints() {
        assert_eq!(parse_version("salt-master 3008.3 (Argon)\n").as_deref(), Some("3008.3"));
        assert_eq!(parse_version("salt-master 3006.28 (Sulfur)").as_deref(), Some("3006.28"));
        assert_eq!(parse_version("salt-master 3007.0rc1+12.gabc (Chlorine)").as_deref(), Some("3007.0rc1+12.gabc"));
        assert_eq!(parse_version("command not found"), None);
        assert_eq!(parse_version("salt-master 3008.3;rm -rf /"), None);
    }

    #[test]
    fn a_missing_program_is_an_error_naming_the_command() {
        let version = SaltVersion::start(vec!["/nonexistent/salt-master".into(), "--version".into()]);
        let result = eventually(&version, |r| r.as_ref().is_err_and(|e| e != "not learnt yet"));
        let error = result.unwrap_err();
        assert!(error.starts_with("`/nonexistent/salt-master --version`: "), "{error}");
    }

    #[test]
    fn the_command_runs_again_when_the_program_changes() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("salt-master");
        let install = |version: &str| {
            // A new file, as a package upgrade makes it; written by another
            // process, so that no thread here can hold it open for writing
            // when it is run (ETXTBSY).
            let script = format!(
                r#"printf '#!/bin/sh\necho "salt-master {version} (Test)"\n' > staged && chmod 755 staged && mv staged salt-master"#
            );
            let status = Command::new("sh").arg("-c").arg(script).current_dir(dir.path()).status().unwrap();
            assert!(status.success());
        };
        install("3006.28");
        let version = SaltVersion::start(vec![program.to_str().unwrap().into(), "--version".into()]);
        assert_eq!(eventually(&version, |r| r.is_ok()), Ok("3006.28".into()));
        install("3008.3");
        assert_eq!(eventually(&version, |r| r.as_deref() == Ok("3008.3")), Ok("3008.3".into()));
    }
}
