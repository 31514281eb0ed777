//! Issue 20: a peer that refuses this master is told in one line that says
//! so and what to check on its side, never as a library's debug dump; and
//! `check` probes every peer the same way, within a bounded time.

use std::time::Duration;

use keysync_server::CertAuthority;
use keysync_tests::binary::{free_addr, run_cli, AgentProcess};
use keysync_tests::cluster::{write_agent_files, AgentFiles};
use keysync_tests::wait_until;

const REFUSED: &str = "master-b refused our certificate (TLS alert access denied): check that its [[peer]] list \
                       names master-a and trusts our CA";

#[test]
fn a_peer_whose_list_lacks_us_is_reported_as_refusing_our_certificate() {
    let root = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let (addr_a, addr_b) = (free_addr(), free_addr());
    let a = write_agent_files(root.path(), &ca, "master-a", addr_a, &[("master-b".into(), addr_b)]);
    // master-b peers only with master-c: master-a is a stranger to it.
    let b = write_agent_files(root.path(), &ca, "master-b", addr_b, &[("master-c".into(), free_addr())]);
    let _agent_b = AgentProcess::start(&b.config_path, b.dir.join("agent.log"));
    let agent_a = AgentProcess::start(&a.config_path, a.dir.join("agent.log"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let warning = || {
        std::fs::read_to_string(&agent_a.log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("WARN") && l.contains("sync failed") && l.contains("refused our certificate"))
            .map(str::to_string)
    };
    rt.block_on(wait_until(Duration::from_secs(30), "a warning that master-b refused us", || warning().is_some()));
    let line = warning().unwrap();
    assert!(line.contains(REFUSED), "{line}");

    // `status` says the same. (Some attempts end on a write that meets the
    // closed connection before the alert is read: a broken pipe.)
    let last_error = || {
        let out = run_cli(&["status", "--json", "--config", a.config_path.to_str().unwrap()]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        report["peers"][0]["last_error"].as_str().unwrap_or_default().to_string()
    };
    rt.block_on(wait_until(Duration::from_secs(30), "status tells master-b refused us", || last_error() == REFUSED));
    let log = std::fs::read_to_string(&agent_a.log).unwrap();
    for dump in ["tonic::transport::Error", "hyper::Error", "Custom {", "code: '"] {
        assert!(!log.contains(dump), "library output {dump:?} in the log:\n{log}");
    }
}

/// How master-b is set up for one `check` of master-a.
enum PeerB {
    /// Nothing listens at its address.
    Down,
    /// Its agent runs and lists master-a.
    Up,
    /// Its agent runs, but its [[peer]] list lacks master-a.
    LacksUs,
    /// Its agent runs with a certificate from another CA.
    OtherCa,
    /// Something takes the TCP connection and never answers.
    Silent,
}

#[test]
fn check_probes_each_peer_and_warns_with_the_cause() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cases = [
        (PeerB::Up, "ok   peer master-b 127.0.0.1:"),
        (PeerB::Down, "connection refused"),
        (PeerB::LacksUs, REFUSED),
        (PeerB::OtherCa, "we refused master-b's certificate (not signed by a trusted CA)"),
        (PeerB::Silent, "no answer within 3s"),
    ];
    for (case, want) in cases {
        let root = tempfile::tempdir().unwrap();
        let ca = CertAuthority::new("ca").unwrap();
        let (addr_a, addr_b) = (free_addr(), free_addr());
        let a = write_agent_files(root.path(), &ca, "master-a", addr_a, &[("master-b".into(), addr_b)]);
        let b_files = |ca: &CertAuthority, peers: &[(String, std::net::SocketAddr)]| {
            write_agent_files(root.path(), ca, "master-b", addr_b, peers)
        };
        let start = |b: AgentFiles| {
            let agent = AgentProcess::start(&b.config_path, b.dir.join("agent.log"));
            rt.block_on(wait_until(Duration::from_secs(30), "master-b started", || {
                std::fs::read_to_string(&agent.log).is_ok_and(|log| log.contains("agent started"))
            }));
            agent
        };
        // Listening, never accepting: the kernel completes the TCP handshake.
        let _silent = matches!(case, PeerB::Silent).then(|| std::net::TcpListener::bind(addr_b).unwrap());
        let _b = match case {
            PeerB::Down | PeerB::Silent => None,
            PeerB::Up => Some(start(b_files(&ca, &[("master-a".into(), addr_a)]))),
            PeerB::LacksUs => Some(start(b_files(&ca, &[("master-c".into(), free_addr())]))),
            PeerB::OtherCa => {
                Some(start(b_files(&CertAuthority::new("other").unwrap(), &[("master-a".into(), addr_a)])))
            }
        };
        let begun = std::time::Instant::now();
        let out = run_cli(&["check", "--config", a.config_path.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // A peer's state never fails check: the agent starts and retries.
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("all checks passed"), "{stdout}");
        let line =
            stdout.lines().find(|l| l.contains("peer master-b")).unwrap_or_else(|| panic!("no peer line: {stdout}"));
        assert!(line.to_lowercase().contains(&want.to_lowercase()), "{line:?} should contain {want:?}");
        if !line.starts_with("ok") {
            assert!(line.starts_with(&format!("WARN peer master-b 127.0.0.1:{}: ", addr_b.port())), "{line}");
            assert!(stdout.contains("1 peer warning(s) above"), "{stdout}");
        }
        assert!(begun.elapsed() < Duration::from_secs(20), "check took {:?}", begun.elapsed());
    }
}

#[test]
fn a_peer_address_that_is_no_host_is_a_config_error() {
    let root = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let a = write_agent_files(root.path(), &ca, "master-a", free_addr(), &[("master-b".into(), free_addr())]);
    let text = std::fs::read_to_string(&a.config_path).unwrap();
    let address = text.lines().find(|l| l.starts_with("address = ")).unwrap();
    std::fs::write(&a.config_path, text.replace(address, "address = \"10.0.0.300:4515\"")).unwrap();
    let out = run_cli(&["check", "--config", a.config_path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("peer[0].address: \"10.0.0.300:4515\" is not host:port"), "{stderr}");
}
