//! systemd's notify protocol, with a fake systemd: a Unix datagram socket in
//! the test named by NOTIFY_SOCKET. The agent says READY=1 once it listens
//! and has reconciled its folders, pings the watchdog at half WATCHDOG_USEC,
//! brackets a reload with RELOADING=1 / READY=1, and says STOPPING=1.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use keysync_server::CertAuthority;
use keysync_tests::binary::{free_addr, AgentProcess};
use keysync_tests::cluster::write_agent_files;

/// The next message that is not a watchdog ping; counts the pings on the way.
/// `recv`, again when a signal meant for another test in this process interrupts it.
fn recv(socket: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match socket.recv(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn next_state(socket: &UnixDatagram, n_pings: &mut usize) -> String {
    let mut buf = [0u8; 4096];
    loop {
        let n = recv(socket, &mut buf).expect("a notification within the socket's timeout");
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        if text == "WATCHDOG=1" {
            *n_pings += 1;
        } else {
            return text;
        }
    }
}

#[test]
fn agent_notifies_ready_watchdog_reload_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("ca").unwrap();
    let listen = free_addr();
    let files = write_agent_files(dir.path(), &ca, "master-a", listen, &[]);
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();

    let agent = AgentProcess::start_with_env(
        &files.config_path,
        files.dir.join("agent.log"),
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap()), ("WATCHDOG_USEC", "400000")],
    );
    let mut n_pings = 0;
    // While the store is read and the folders reconciled, `systemctl status` says so.
    let starting = next_state(&socket, &mut n_pings);
    assert_eq!(starting, "STATUS=starting: reading the state store and reconciling the key folders with it");
    let ready = next_state(&socket, &mut n_pings);
    assert_eq!(ready, format!("READY=1\nSTATUS=listening on {listen}, 0 peers"));
    // Ready means listening and reconciled: the port takes connections and start-up is logged.
    assert!(std::net::TcpStream::connect(listen).is_ok(), "READY=1 before the listener accepts");
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("start-up reconciliation") && log.contains("agent started"), "{log}");

    // Pings every 200 ms (half of 400 ms): three come well within 5 s (a 30 s pace would not).
    let since = Instant::now();
    let mut buf = [0u8; 64];
    while n_pings < 3 {
        let n = recv(&socket, &mut buf).expect("watchdog pings keep coming");
        assert_eq!(&buf[..n], b"WATCHDOG=1");
        n_pings += 1;
    }
    assert!(since.elapsed() < Duration::from_secs(5), "3 pings took {:?}", since.elapsed());

    agent.signal("HUP");
    let reloading = next_state(&socket, &mut n_pings);
    assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading:?}");
    assert_eq!(next_state(&socket, &mut n_pings), "READY=1\nSTATUS=0 peers; config reloaded");

    // A refused reload also ends with READY=1, carrying the reason.
    let good = std::fs::read_to_string(&files.config_path).unwrap();
    std::fs::write(&files.config_path, good.replace("node = \"master-a\"", "node = \"master-z\"")).unwrap();
    agent.signal("HUP");
    assert!(next_state(&socket, &mut n_pings).starts_with("RELOADING=1"));
    let refused = next_state(&socket, &mut n_pings);
    assert!(refused.starts_with("READY=1\nSTATUS=0 peers; reload refused: node cannot change"), "{refused:?}");

    agent.signal("TERM");
    assert_eq!(next_state(&socket, &mut n_pings), "STOPPING=1");
    let status = agent.stop();
    assert!(status.success(), "{status}");
}
