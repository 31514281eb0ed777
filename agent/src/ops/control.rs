//! The local control socket `salt-keysync status`, `reload`, `plan`, `held`,
//! `release` and `revert` talk to: a Unix socket, mode 0600 in a folder of
//! mode 0700, so only the agent's own user (and root) can ask. One request
//! line in (a word, and for `release` and `revert` a JSON object after it),
//! one JSON line out.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::node::CoreHandle;
use crate::ops::board::Board;
use crate::ops::reload::ReloadReply;

/// Unix socket paths longer than this do not fit `sockaddr_un`.
const MAX_SOCKET_PATH: usize = 107;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request line: `release` or `revert` naming a few thousand ids.
const MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// `plan` asks every peer (each within 10 s, all at once, twice at most).
const PLAN_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds the control socket at `path`. Its folder is created with mode 0700
/// if missing; an existing folder other users can enter is refused (the
/// agent's own `state_dir` is tightened to 0700 instead). A socket left by
/// a killed agent is replaced; one that still answers means another agent
/// runs with this state.
pub async fn bind(path: &Path, state_dir: &Path) -> Result<ControlSocket> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        bail!("control_socket {}: longer than {MAX_SOCKET_PATH} bytes, which Unix sockets cannot use", path.display());
    }
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !folder.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .with_context(|| format!("cannot create control socket folder {}", folder.display()))?;
    }
    let mode = std::fs::metadata(folder).with_context(|| format!("control socket folder {}", folder.display()))?;
    let mode = mode.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        if folder == state_dir {
            std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make state_dir {} private (mode 0700)", folder.display()))?;
        } else {
            bail!(
                "control_socket {}: its folder {} has mode {mode:04o}; other users could reach the socket (use a folder with mode 0700)",
                path.display(),
                folder.display()
            );
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                bail!(
                    "control_socket {} answers: another salt-keysync agent is running with this state",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove stale control socket {}", path.display()))?;
        }
        Ok(_) => bail!("control_socket {} exists and is not a socket; refusing to replace it", path.display()),
        Err(_) => {}
    }
    // Never wider than 0600 at its path, not even for a moment: bound under
    // a temporary name in the same (0700) folder, made 0600, then renamed
    // into place (a listening socket keeps working under its new name). No
    // umask change: the umask is the whole process's, and another thread
    // (another agent in a test, a task) could create a file meanwhile.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = folder.join(format!(".{}.{}.tmp", std::process::id(), name.len()));
    let fits = temporary.as_os_str().len() <= MAX_SOCKET_PATH;
    let at = if fits { temporary.as_path() } else { path };
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(at).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make control socket {} owner-only", path.display()))?;
    if fits {
        std::fs::rename(at, path).with_context(|| format!("cannot put control socket {} in place", path.display()))?;
    }
    let identity = std::fs::symlink_metadata(path)
        .map(|meta| (meta.dev(), meta.ino()))
        .with_context(|| format!("control socket {}", path.display()))?;
    Ok(ControlSocket { listener, path: path.to_path_buf(), identity })
}

/// The bound control socket. Its path is removed when this is dropped: at
/// the agent's stop, and also when a start fails after binding it (the TCP
/// port in use, a lost state), where a socket left behind would make
/// `status` speak of a killed agent. Only this very socket is removed, never
/// one another agent has bound at that path since.
#[derive(Debug)]
pub struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    identity: (u64, u64),
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|meta| (meta.dev(), meta.ino()) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What a request needs from the rest of the agent.
pub struct ControlContext {
    pub board: Arc<Board>,
    pub core: CoreHandle,
    /// The reloader's queue (the one SIGHUP feeds); `None` when the agent
    /// was started without a config file to re-read.
    pub reload: Option<mpsc::Sender<Option<ReloadReply>>>,
    /// The config file a reload re-reads (named in the reply).
    pub config_path: Option<std::path::PathBuf>,
    /// Gathers `plan` from this node and the peers.
    pub plan: crate::ops::site_plan::Gather,
    /// Whether the core's start is over.
    pub start: Arc<StartGate>,
}

/// The core's start (the store read, the folders reconciled) takes tens of
/// seconds at 1,000,000 keys; meanwhile every request is answered that the
/// agent is starting, not left to time out.
#[derive(Debug)]
pub struct StartGate {
    began: std::time::Instant,
    done: std::sync::atomic::AtomicBool,
}

impl StartGate {
    pub fn new() -> Arc<StartGate> {
        Arc::new(StartGate { began: std::time::Instant::now(), done: false.into() })
    }

    /// The start is over: requests are answered from now on.
    pub fn open(&self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
    }

    /// How long the start has lasted, while it lasts.
    fn starting(&self) -> Option<Duration> {
        (!self.done.load(std::sync::atomic::Ordering::Acquire)).then(|| self.began.elapsed())
    }
}

/// What every request is answered while the agent starts.
fn starting_reply(word: &str, lasted: Duration) -> String {
    let word = crate::text::shown(word);
    serde_json::json!({
        "error": format!(
            "the agent is starting: it reads its state store and reconciles the key folders with it ({} s so far; \
             a first start on 1,000,000 keys takes about a minute); ask {word:?} again once it is done",
            lasted.as_secs()
        )
    })
    .to_string()
}

/// Answers requests until `shutdown`, then removes the socket.
pub async fn serve(socket: ControlSocket, ctx: Arc<ControlContext>, shutdown: CancellationToken) {
    let listener = &socket.listener;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        if let Err(e) = tokio::time::timeout(PLAN_TIMEOUT + REQUEST_TIMEOUT, answer(stream, &ctx)).await.unwrap_or_else(|_| Err(anyhow::anyhow!("timed out"))) {
                            tracing::debug!(error = %e, "control request failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(socket);
}

async fn answer(stream: UnixStream, ctx: &ControlContext) -> Result<()> {
    // Named (from /etc/passwd) only for the requests that audit who made them.
    let peer_uid = stream.peer_cred().ok().map(|cred| cred.uid());
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    // A request is a word, or `release`/`revert` with the ids they name;
    // cap what a client can make us buffer.
    let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST_BYTES));
    tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await??;
    let (word, args) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
    let reply = match ctx.start.starting() {
        Some(lasted) => starting_reply(word, lasted),
        None => reply(ctx, word, args, peer_uid).await?,
    };
    write.write_all(reply.as_bytes()).await?;
    write.write_all(b"\n").await?;
    write.shutdown().await?;
    Ok(())
}

/// The answer to `word` (with `args`), asked by the user `peer_uid`.
async fn reply(ctx: &ControlContext, word: &str, args: &str, peer_uid: Option<u32>) -> Result<String> {
    let operator = |action| crate::ops::held::operate(&ctx.core, action, args, crate::ops::held::who(peer_uid));
    Ok(match word {
        "status" => {
            let keys = ctx.board.key_counts(&ctx.core).await;
            let mut report = ctx.board.report_with(keys);
            let rows = ctx.core.ask(|reply| crate::node::Request::Conflicts { reply }).await?;
            report.conflicts = rows.iter().map(crate::ops::site_plan::entry).collect();
            let held = ctx.core.ask(|reply| crate::node::Request::Held { reply }).await?;
            report.held = crate::ops::held::bursts(&held);
            let trouble = ctx.core.ask(|reply| crate::node::Request::WriteTrouble { reply }).await?;
            report.write_trouble = trouble.map(|(lasted, error)| crate::ops::sd_notify::write_trouble(lasted, &error));
            let stale = ctx.core.ask(|reply| crate::node::Request::Stale { reply }).await?;
            report.stale = stale.as_ref().map(crate::ops::sd_notify::stale);
            crate::ops::findings::add_guard_findings(&mut report);
            serde_json::to_string(&report)?
        }
        "plan" => serde_json::to_string(&ctx.plan.site(&ctx.board.peers()).await)?,
        "reload" => reload(ctx).await.to_string(),
        "held" => serde_json::to_string(&crate::ops::held::list(&ctx.core, ctx.board.node()).await?)?,
        "release" => serde_json::to_string(&operator(keysync_machine::node::OperatorAction::Release).await)?,
        "revert" => serde_json::to_string(&operator(keysync_machine::node::OperatorAction::Revert).await)?,
        other => serde_json::json!({
            "error": format!(
                "unknown request {:?}; expected \"status\", \"plan\", \"reload\", \"held\", \"release\" or \"revert\"",
                crate::text::shown(other)
            )
        })
        .to_string(),
    })
}

/// Reloads as SIGHUP does, and says how it went: `{"reloaded": summary}`,
/// `{"refused": reason}` (the running config stays in force) or `{"error": …}`.
async fn reload(ctx: &ControlContext) -> serde_json::Value {
    let Some(requests) = &ctx.reload else {
        return serde_json::json!({ "error": "this agent was started without a config file to reload" });
    };
    let (reply, outcome) = oneshot::channel();
    if requests.send(Some(reply)).await.is_err() {
        return serde_json::json!({ "error": "the agent is stopping" });
    }
    match outcome.await {
        Ok(Ok(summary)) => serde_json::json!({ "reloaded": summary, "config": ctx.config_path }),
        Ok(Err(reason)) => serde_json::json!({ "refused": reason, "config": ctx.config_path }),
        Err(_) => serde_json::json!({ "error": "the agent stopped before the reload finished" }),
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn binds_owner_only_and_replaces_only_a_dead_socket() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = state.join("control.sock");

        let listener = bind(&socket, &state).await.unwrap();
        assert_eq!((mode(&state), mode(&socket)), (0o700, 0o600), "state_dir is tightened, the socket is 0600");
        let err = bind(&socket, &state).await.unwrap_err().to_string();
        assert!(err.contains("another salt-keysync agent is running"), "{err}");
        drop(listener);
        bind(&socket, &state).await.expect("a socket nobody answers on is stale and replaced");

        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = bind(&open.join("c.sock"), &state).await.unwrap_err().to_string();
        assert!(err.contains("has mode 0755"), "{err}");
        std::fs::write(state.join("file"), "x").unwrap();
        let err = bind(&state.join("file"), &state).await.unwrap_err().to_string();
        assert!(err.contains("is not a socket"), "{err}");
        let fresh = dir.path().join("new/sub/c.sock");
        bind(&fresh, &state).await.unwrap();
        assert_eq!(mode(fresh.parent().unwrap()), 0o700);
    }
}
