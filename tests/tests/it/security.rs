//! Issue 4 against running agents: hostile files in the key folders, hostile
//! messages from a configured peer, and strangers at the TLS door are each
//! refused and audited once, nothing of them reaches a peer, and the agents
//! keep replicating. Start-up refusals (permissions, master config) are in
//! `startup.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keysync_proto::v1;
use keysync_server::{TlsMaterial, TlsSetup};
use keysync_tests::cluster::{TestCluster, NAMES};
use keysync_tests::salt_ops::{find, master_writes_pending, move_key, new_public_key, path, SaltLine};
use keysync_tests::wait_until;
use salt_keysync::core::MinionId;
use salt_keysync::disk::audit::Record;
use salt_keysync::disk::store::Store;

pub(crate) const SETTLE: Duration = Duration::from_secs(15);

pub(crate) async fn accepted_everywhere(cluster: &TestCluster, origin: usize, id: &str, key: &str) {
    for idx in 0..cluster.agents.len() {
        master_writes_pending(cluster.pki(idx), id, key);
    }
    move_key(SaltLine::S3008, cluster.pki(origin), id, "minions");
    for idx in 0..cluster.agents.len() {
        let pki = cluster.pki(idx);
        wait_until(SETTLE, &format!("{id} accepted on agent {idx}"), || {
            find(pki, id).is_some_and(|(folder, bytes)| folder == "minions" && bytes == key.as_bytes())
        })
        .await;
    }
}

fn refusals<'a>(audit: &'a [Record], minion: &str) -> Vec<&'a Record> {
    audit.iter().filter(|r| r.action == "refuse" && r.minion.as_deref() == Some(minion)).collect()
}

/// Every name anywhere under `pki` (folders included), sorted.
/// The agent's own bookkeeping in pki_dir (dot names, ignored by Salt): the
/// state marker and the staging folder for its atomic writes.
const AGENT_OWN: [&str; 2] = [".salt-keysync-state", ".keysync-staging"];

fn tree(pki: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![pki.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for dirent in std::fs::read_dir(&dir).unwrap() {
            let dirent = dirent.unwrap();
            if AGENT_OWN.iter().any(|own| dirent.file_name() == *own) {
                continue;
            }
            out.push(dirent.path().strip_prefix(pki).unwrap().display().to_string());
            if dirent.file_type().unwrap().is_dir() {
                stack.push(dirent.path());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_key_files_are_refused_once_and_never_reach_a_peer() {
    let mut cluster = TestCluster::start(3).await;
    let real = new_public_key();
    accepted_everywhere(&cluster, 0, "web01", &real).await;

    let pki = cluster.pki(0).to_path_buf();
    let master_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    std::fs::write(pki.join("master.pem"), &master_pem).unwrap();
    let minions = pki.join("minions");
    // A copy of master.pem over an accepted minion's key, as a rename (salt-key's way).
    std::fs::write(pki.join(".stage"), &master_pem).unwrap();
    std::fs::rename(pki.join(".stage"), minions.join("web01")).unwrap();
    std::fs::write(minions.join("stolen"), &master_pem).unwrap();
    std::os::unix::fs::symlink("../master.pem", minions.join("x")).unwrap();
    std::fs::hard_link(pki.join("master.pem"), minions.join("hard")).unwrap();
    let mkfifo = std::process::Command::new("mkfifo").arg(minions.join("fifo")).status().unwrap();
    assert!(mkfifo.success(), "mkfifo (coreutils) is needed");
    std::fs::create_dir(minions.join("dir")).unwrap();
    // 50 MB, sparse: the size must come from fstat. Read whole, the private
    // key at its end would be the reason given, not the size.
    let big = std::fs::File::create(minions.join("big")).unwrap();
    big.set_len(50 * 1024 * 1024).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&big, master_pem.as_bytes(), 50 * 1024 * 1024).unwrap();
    drop(big);
    std::fs::write(minions.join("trunc"), &real[..real.len() / 2]).unwrap();
    std::fs::write(minions.join("master.pub"), &real).unwrap();
    std::fs::write(pki.join("minions_rejected/evil"), &master_pem).unwrap();
    let big_len = (50 * 1024 * 1024 + master_pem.len()).to_string();
    let expected: [(&str, &str); 10] = [
        ("web01", "minions/web01: key file contains a private key block"),
        ("stolen", "minions/stolen: key file contains a private key block"),
        ("x", "minions/x: not a regular file (symbolic link)"),
        ("hard", "minions/hard: a hard link with 2 names"),
        ("fifo", "minions/fifo: not a regular file (FIFO)"),
        ("dir", "minions/dir: not a regular file (directory)"),
        ("big", &format!("minions/big: key file is {big_len} bytes, more than the 16384 byte limit")),
        ("trunc", "minions/trunc: key file is not a single PEM public key: no END line (truncated?)"),
        ("master.pub", "minions/master.pub: not a regular file (the name of a master key file)"),
        ("evil", "minions_rejected/evil: key file contains a private key block"),
    ];
    for (name, reason) in expected {
        wait_until(SETTLE, &format!("{name} is refused on master-a"), || {
            refusals(&cluster.agents[0].audit(), name)
                .iter()
                .any(|r| r.reason.as_deref().is_some_and(|why| why.starts_with(reason)))
        })
        .await;
    }

    // Replication goes on: an accept, then a reject that revokes on the peers.
    let next = new_public_key();
    accepted_everywhere(&cluster, 0, "web02", &next).await;
    for agent in &cluster.agents[1..] {
        assert!(!agent.files.dir.join("cache/.dfn").exists(), "{}: no revocation yet", agent.name());
    }
    move_key(SaltLine::S3006, &pki, "web02", "minions_rejected");
    for (idx, agent) in cluster.agents.iter().enumerate().skip(1) {
        let dfn = agent.files.dir.join("cache/.dfn");
        wait_until(SETTLE, &format!(".dfn on agent {idx}"), || {
            path(agent.pki(), "minions_rejected", "web02").exists() && dfn.exists()
        })
        .await;
        let meta = std::fs::metadata(&dfn).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o400, "{}", dfn.display());
        assert_eq!(std::fs::read_to_string(&dfn).unwrap(), format!("{}_master", agent.name()));
    }

    // One record per hostile file, with outcome "refused".
    let audit = cluster.agents[0].audit();
    for (name, _) in expected {
        let records = refusals(&audit, name);
        assert_eq!(records.len(), 1, "{name}: {records:#?}");
        assert_eq!((records[0].via.as_str(), records[0].outcome.as_str()), ("local", "refused"), "{name}");
    }
    // Peers: the folders hold exactly what was decided, web01 still the real key.
    for (idx, agent) in cluster.agents.iter().enumerate().skip(1) {
        let want: Vec<String> =
            ["minions", "minions/web01", "minions_pre", "minions_rejected", "minions_rejected/web02"]
                .map(String::from)
                .to_vec();
        assert_eq!(tree(agent.pki()), want, "agent {idx}");
        assert_eq!(std::fs::read(path(agent.pki(), "minions", "web01")).unwrap(), real.as_bytes());
        let audit = agent.audit();
        for (name, _) in expected.iter().filter(|(name, _)| *name != "web01") {
            assert!(audit.iter().all(|r| r.minion.as_deref() != Some(name)), "agent {idx} heard of {name}");
        }
        assert!(audit.iter().all(|r| r.action != "delete"), "agent {idx}: nothing was deleted");
    }
    let states: Vec<_> = (1..3).map(|idx| cluster.agents[idx].files.dir.join("state")).collect();
    // Stopped one by one: shutdown() would remove the folders with the stores.
    for idx in 0..3 {
        cluster.stop(idx).await;
    }
    for (idx, state) in states.iter().enumerate() {
        let store = Store::open(state, NAMES[idx + 1]).unwrap();
        let mut ids: Vec<String> = store.load().unwrap().entries.iter().map(|(id, _)| id.to_string()).collect();
        ids.sort();
        assert_eq!(ids, ["web01", "web02"], "store of {}", NAMES[idx + 1]);
        let web01 = store.get(&[MinionId::parse("web01").unwrap()]).unwrap();
        assert_eq!(web01[0].verdict.key().unwrap().bytes(), real.as_bytes());
        // Not even the private key's bytes are anywhere in the state folder.
        for dirent in std::fs::read_dir(state).unwrap() {
            let bytes = std::fs::read(dirent.unwrap().path()).unwrap();
            let pem_body = master_pem.lines().nth(1).unwrap().as_bytes();
            assert!(!bytes.windows(pem_body.len()).any(|w| w == pem_body), "private key PEM in {state:?}");
        }
    }
}

/// `rchar` of /proc/self/io: bytes this process read through any file descriptor.
/// What a process has read so far (`rchar` of /proc/PID/io): every read
/// call, from any file or socket.
fn bytes_read_by(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let line = io.lines().find(|line| line.starts_with("rchar:")).unwrap();
    line["rchar:".len()..].trim().parse().unwrap()
}

/// A 50 MB key file is refused from its size alone, never read whole.
/// Measured on an agent process of its own: in this test binary's process,
/// other tests read tens of MB meanwhile (a read count of the whole process
/// once failed this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_key_file_is_refused_without_being_read() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = keysync_tests::binary::ProcessCluster::start(root.path(), 1, |_| {});
    cluster.started().await;
    let (pki, audit_log) = (cluster.files[0].pki.clone(), cluster.files[0].audit_log.clone());
    let pid = cluster.agent(0).pid();
    let before = bytes_read_by(pid);
    let big = std::fs::File::create(pki.join("minions/big")).unwrap();
    big.set_len(50 * 1024 * 1024).unwrap();
    drop(big);
    wait_until(SETTLE, "the big file is refused", || {
        refusals(&salt_keysync::disk::audit::read_all(&audit_log).unwrap(), "big")
            .iter()
            .any(|r| r.reason.as_deref().is_some_and(|why| why.contains("more than the 16384 byte limit")))
    })
    .await;
    let read = bytes_read_by(pid) - before;
    assert!(read < 1024 * 1024, "{read} bytes read while refusing: the big file was read");
    cluster.stop();
}

/// The `Hello` a client presenting `node`'s identity opens with.
pub(crate) fn hello_as(node: &str) -> keysync_proto::v1::HelloRequest {
    keysync_proto::v1::HelloRequest {
        node: node.into(),
        protocol_version: keysync_proto::PROTOCOL_VERSION,
        ..Default::default()
    }
}

/// A client presenting `material` (a configured peer's identity) to `addr`.
pub(crate) async fn peer_client(
    addr: std::net::SocketAddr,
    server: &str,
    material: &TlsMaterial,
) -> keysync_proto::v1::key_sync_client::KeySyncClient<tonic::transport::Channel> {
    let tls = TlsSetup::new(material).unwrap();
    keysync_server::connect(&addr.to_string(), server, &tls, 32 * 1024 * 1024, Duration::from_secs(10)).await.unwrap()
}

pub(crate) fn identity(cluster: &TestCluster, name: &str) -> TlsMaterial {
    let now = time::OffsetDateTime::now_utc();
    let issued = cluster.ca.issue(&[name], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
    TlsMaterial {
        ca_pem: cluster.ca.cert_pem().into_bytes(),
        cert_pem: issued.cert_pem.into_bytes(),
        key_pem: issued.key_pem.into_bytes(),
    }
}

pub(crate) fn now_hlc(offset: Duration) -> u64 {
    let ms = (std::time::SystemTime::now() + offset).duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    (ms as u64) << 16
}

pub(crate) fn wire_accept(minion: &str, key: &str, hlc: u64) -> v1::Decision {
    v1::Decision {
        minion: minion.into(),
        verdict: v1::Verdict::Accepted.into(),
        public_key: key.as_bytes().to_vec(),
        version: Some(v1::Version { hlc, node: "master-b".into() }),
        supersedes: None,
        context: Vec::new(),
        relays: Vec::new(),
        reached: Default::default(),
    }
}

/// Everything under the agent's folder except its state (audit, store).
fn agent_tree(cluster: &TestCluster, idx: usize) -> Vec<String> {
    tree(&cluster.agents[idx].files.dir).into_iter().filter(|p| !p.starts_with("state")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_messages_from_a_configured_peer_are_refused_and_write_nothing() {
    let cluster = TestCluster::start(2).await;
    let key = new_public_key();
    let private = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let root_before: Vec<String> = std::fs::read_dir(cluster.root.path())
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let tree_before = agent_tree(&cluster, 0);

    let mut client = peer_client(cluster.agents[0].addr, "master-a", &identity(&cluster, "master-b")).await;
    client.hello(hello_as("master-b")).await.unwrap();
    let now = now_hlc(Duration::ZERO);
    let hostile = vec![
        wire_accept("../master.pem", &key, now),
        wire_accept("a/b", &key, now),
        wire_accept(".", &key, now),
        wire_accept("..", &key, now),
        wire_accept("", &key, now),
        wire_accept("a\0b", &key, now),
        wire_accept(&"x".repeat(300), &key, now),
        wire_accept("future01", &key, now_hlc(Duration::from_secs(24 * 3600))),
        wire_accept("privkey", &private, now),
    ];
    let n_hostile = hostile.len();
    let mut batch = hostile;
    batch.push(wire_accept("good01", &key, now));
    let mut acks =
        client.push(tokio_stream::iter([v1::DecisionBatch { decisions: batch }])).await.unwrap().into_inner();
    let ack = acks.message().await.unwrap().expect("an ack");
    assert_eq!((ack.n_received, ack.n_applied), (n_hostile as u32 + 1, 1), "only good01 is applied");
    drop(acks);
    wait_until(SETTLE, "good01 written on master-a", || path(cluster.pki(0), "minions", "good01").exists()).await;

    // One refusal per hostile message, naming what was wrong.
    let audit = cluster.agents[0].audit();
    let refused: Vec<&Record> = audit.iter().filter(|r| r.action == "refuse" && r.via == "master-b").collect();
    assert_eq!(refused.len(), n_hostile, "{refused:#?}");
    let reasons: Vec<&str> = refused.iter().filter_map(|r| r.reason.as_deref()).collect();
    for want in [
        "\"../master.pem\" contains a forbidden character",
        "\"a/b\" contains a forbidden character",
        "minion id \".\" starts with a dot",
        "minion id \"..\" starts with a dot",
        "minion id is empty",
        "\"a\\\\0b\" contains a forbidden character",
        "minion id is 300 bytes long, more than 255",
        "ahead of this node's clock",
        "key file contains a private key block",
    ] {
        assert_eq!(reasons.iter().filter(|r| r.contains(want)).count(), 1, "{want:?} in {reasons:#?}");
    }
    let future = refused.iter().find(|r| r.minion.as_deref() == Some("future01")).expect("future01 refusal");
    assert_eq!(future.outcome, "refused");

    // A message over the cap fails the stream and is audited; the agent stays up.
    let huge: Vec<v1::Decision> =
        (0..10_000).map(|i| wire_accept(&format!("bulk{i}"), &"A".repeat(1000), now)).collect();
    let outcome = async {
        let mut acks = client.push(tokio_stream::iter([v1::DecisionBatch { decisions: huge }])).await?.into_inner();
        while acks.message().await?.is_some() {}
        Ok::<_, tonic::Status>(())
    };
    assert!(outcome.await.is_err(), "a 10 MB batch must fail the push");
    wait_until(SETTLE, "the oversized batch is audited", || {
        cluster.agents[0].audit().iter().any(|r| {
            r.action == "refuse"
                && r.via == "master-b"
                && r.reason.as_deref().is_some_and(|why| why.contains("too large"))
        })
    })
    .await;

    // Nothing was written outside the three folders, and nothing but good01 in them.
    let mut want = tree_before;
    want.push("pki/minions/good01".into());
    want.sort();
    assert_eq!(agent_tree(&cluster, 0), want);
    let root_after: Vec<String> = std::fs::read_dir(cluster.root.path())
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(root_after, root_before);
    assert!(cluster.agents[0].audit().iter().all(|r| r.minion.as_deref().is_none_or(|m| !m.starts_with("bulk"))));

    // Still replicating with the real peer.
    accepted_everywhere(&cluster, 1, "after", &new_public_key()).await;
    cluster.shutdown().await;
}

/// Opens one raw TLS connection to `addr` from `source` as `identity` (or
/// with no client certificate), trusting `ca_pem` for the server, and says
/// whether the server refused it (handshake failed, or the connection closed
/// before any HTTP/2 byte). Returns the client's local address, which the
/// agent audits (the first refusal from each address in a minute).
async fn stranger(
    addr: std::net::SocketAddr,
    source: std::net::IpAddr,
    ca_pem: &str,
    identity: Option<&TlsMaterial>,
) -> (std::net::SocketAddr, bool) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(m) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(&m.cert_pem).unwrap()],
                PrivateKeyDer::from_pem_slice(&m.key_pem).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::new(source, 0)).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let attempt = async {
        let mut tls = connector.connect(ServerName::try_from("master-a").unwrap(), tcp).await?;
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await?;
        let mut buf = [0u8; 64];
        tls.read(&mut buf).await
    };
    let outcome = tokio::time::timeout(Duration::from_secs(10), attempt).await.expect("the agent answers within 10 s");
    (local, !matches!(outcome, Ok(n) if n > 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_at_the_door_are_refused_audited_and_peers_still_served() {
    let cluster = TestCluster::start(3).await;
    let ca_pem = cluster.ca.cert_pem();
    let now = time::OffsetDateTime::now_utc();
    let rogue_ca = keysync_server::CertAuthority::new("rogue CA").unwrap();
    let rogue = rogue_ca.issue(&["master-b"], now - time::Duration::hours(1), now + time::Duration::days(1)).unwrap();
    let expired =
        cluster.ca.issue(&["master-b"], now - time::Duration::days(2), now - time::Duration::days(1)).unwrap();
    let material = |issued: keysync_server::IssuedCert| TlsMaterial {
        ca_pem: Vec::new(),
        cert_pem: issued.cert_pem.into_bytes(),
        key_pem: issued.key_pem.into_bytes(),
    };
    // (what, client identity, presented identity audited, reason audited)
    let cases: [(&str, Option<TlsMaterial>, &str, &str); 4] = [
        ("no client certificate", None, "(no certificate)", "TLS handshake refused"),
        ("another CA", Some(material(rogue)), "master-b", "not signed by a trusted CA"),
        ("an unconfigured name", Some(identity(&cluster, "mallory")), "mallory", "names no configured peer"),
        ("an expired certificate", Some(material(expired)), "master-b", "xpired"),
    ];
    for (n, (what, client, presented, reason)) in cases.iter().enumerate() {
        let source = std::net::IpAddr::from([127, 0, 2, 1 + n as u8]);
        let (local, refused) = stranger(cluster.agents[0].addr, source, &ca_pem, client.as_ref()).await;
        assert!(refused, "{what}: the agent let it in");
        let remote = local.to_string();
        wait_until(SETTLE, &format!("{what} audited"), || {
            cluster.agents[0].audit().iter().any(|r| r.remote.as_deref() == Some(&remote))
        })
        .await;
        let audit = cluster.agents[0].audit();
        let records: Vec<&Record> = audit.iter().filter(|r| r.remote.as_deref() == Some(&remote)).collect();
        assert_eq!(records.len(), 1, "{what}: one record per attempt: {records:#?}");
        let record = records[0];
        assert_eq!(
            (record.action.as_str(), record.via.as_str(), record.outcome.as_str()),
            ("refuse", "network", "refused"),
            "{what}"
        );
        assert_eq!(record.peer.as_deref(), Some(*presented), "{what}");
        assert!(record.reason.as_deref().is_some_and(|why| why.contains(reason)), "{what}: {record:#?}");
    }

    // An agent dialing "master-b" where master-c answers refuses it and audits what it presented.
    let extra = cluster.root.path().join("extra");
    let files = keysync_tests::cluster::write_agent_files(
        &extra,
        &cluster.ca,
        "master-d",
        keysync_tests::binary::free_addr(),
        &[("master-b".into(), cluster.agents[2].addr)],
    );
    let config = salt_keysync::config::Config::load(&files.config_path).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let dialer = tokio::spawn(salt_keysync::agent::run(config, None, shutdown.clone()));
    let d_audit = || salt_keysync::disk::audit::read_verified(&files.audit_log).unwrap_or_default();
    let wrong_name = |r: &Record| {
        r.action == "refuse"
            && r.peer.as_deref() == Some("master-b")
            && r.reason.as_deref().is_some_and(|why| why.contains("not valid for the name master-b: it names master-c"))
    };
    wait_until(SETTLE, "master-d audits master-c's certificate", || d_audit().iter().any(wrong_name)).await;
    // It keeps retrying (reconnect_max is 300 ms) without flooding the audit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(d_audit().iter().filter(|r| wrong_name(r)).count(), 1, "{:#?}", d_audit());
    shutdown.cancel();
    dialer.await.unwrap().unwrap();

    // The real peers are still served, both directions.
    accepted_everywhere(&cluster, 0, "from-a", &new_public_key()).await;
    accepted_everywhere(&cluster, 2, "from-c", &new_public_key()).await;
    cluster.shutdown().await;
}

/// Issue 14 item 4: 300 idle TCP connections from 30 addresses, no TLS
/// byte sent (260 locked a peer out before), hold master-b's port while its
/// peers must handshake again: they are served before the idle connections
/// time out (their addresses keep a share of handshakes strangers cannot
/// use, each stranger address is bounded), and the audit log grows by at
/// most a few records per address, not one per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_strangers_neither_starve_the_peers_nor_flood_the_audit() {
    let cluster = TestCluster::start(3).await;
    let target = cluster.agents[1].addr;
    cluster.partition(&[&[0], &[1], &[2]]);
    let mut idle = Vec::new();
    for i in 0..300u32 {
        let source = std::net::IpAddr::from([127, 0, 1, 2 + (i % 30) as u8]);
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(std::net::SocketAddr::new(source, 0)).unwrap();
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), socket.connect(target)).await {
            idle.push(stream);
        }
    }
    cluster.heal();
    accepted_everywhere(&cluster, 0, "while-held", &new_public_key()).await;
    let still_held = |stream: &tokio::net::TcpStream| matches!(stream.try_read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    assert!(idle.iter().any(still_held), "the peers were served only once the idle connections had timed out");
    // Every idle connection is closed at the handshake deadline.
    wait_until(Duration::from_secs(30), "the idle connections are closed", || !idle.iter().any(still_held)).await;
    let mut per_source: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for record in cluster.agents[1].audit() {
        if let Some(remote) = record.remote.as_deref().filter(|r| r.starts_with("127.0.1.")) {
            let ip = remote.rsplit_once(':').map_or(remote, |(ip, _)| ip);
            *per_source.entry(ip.to_string()).or_default() += 1;
        }
    }
    assert!(!per_source.is_empty(), "the refusals are audited");
    let most = per_source.values().max().copied().unwrap_or(0);
    assert!(most <= 2, "at most a few records per stranger address, not one per connection: {per_source:?}");
    accepted_everywhere(&cluster, 2, "after", &new_public_key()).await;
    cluster.shutdown().await;
}
