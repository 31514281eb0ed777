//! The config's defaults, bounds and errors, each naming its key.

use super::*;

const MINIMAL: &str = r#"
node = "master-a"
[tls]
ca = "tls/ca.pem"
cert = "tls/node.pem"
key = "/abs/node.key"
[[peer]]
name = "master-b"
address = "10.0.0.12:4515"
"#;

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new("/etc/salt-keysync/config.toml")).map_err(|e| e.to_string())
}

#[test]
fn defaults_follow_the_design() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.pki_dir, Path::new("/etc/salt/pki/master"));
    assert_eq!(config.state_dir, Path::new("/var/lib/salt-keysync"));
    assert_eq!(config.audit_log, Path::new("/var/lib/salt-keysync/audit.jsonl"));
    assert_eq!(config.listen.to_string(), "0.0.0.0:4515");
    assert_eq!(config.tls.ca, Path::new("/etc/salt-keysync/tls/ca.pem"));
    assert_eq!(config.tls.key, Path::new("/abs/node.key"));
    assert_eq!(config.peers[0].name, "master-b");
    assert_eq!(config.salt.cachedir, Path::new("/var/cache/salt/master"));
    assert_eq!(config.salt.version_command, ["salt-master", "--version"]);
    assert_eq!(config.control_socket, Path::new("/var/lib/salt-keysync/control.sock"));
    assert_eq!(config.metrics_listen, None);
    let with_metrics = parse(&format!("metrics_listen = \"127.0.0.1:9515\"\n{MINIMAL}")).unwrap();
    assert_eq!(with_metrics.metrics_listen, Some("127.0.0.1:9515".parse().unwrap()));
    assert!(with_metrics.metrics_allow.is_empty(), "any scraper by default");
    let allow = parse(&format!("metrics_allow = [\"10.0.0.5\", \"::1\"]\n{MINIMAL}")).unwrap();
    assert_eq!(allow.metrics_allow, ["10.0.0.5".parse::<std::net::IpAddr>().unwrap(), "::1".parse().unwrap()]);
    let e = parse(&format!("metrics_allow = [\"10.0.0.0/8\"]\n{MINIMAL}")).unwrap_err();
    assert!(e.contains("metrics_allow[0]: \"10.0.0.0/8\" is not an IP address"), "{e}");
}

/// Issue 28 item 5: a peer named `master-A` passed check and failed at run
/// time. Node names are lowercase, as TLS compares them.
#[test]
fn node_names_are_lowercase() {
    let e = parse(&MINIMAL.replace("name = \"master-b\"", "name = \"master-B\"")).unwrap_err();
    assert!(e.contains("peer[0].name: \"master-B\" has capital letters"), "{e}");
    assert!(e.contains("(\"master-b\")"), "{e}");
    let e = parse(&MINIMAL.replace("node = \"master-a\"", "node = \"Master-A\"")).unwrap_err();
    assert!(e.contains("node: \"Master-A\" has capital letters"), "{e}");
    assert!(parse(&MINIMAL.replace("10.0.0.12:4515", "Master-B.Example:4515")).is_ok(), "host names are not");
}

/// Issue 30: the machine names the decisions a restart finishes from its
/// journal `journal`, and the audit log this node's own `local`: a peer of
/// either name would miss those decisions when they are forwarded (sent to
/// every peer but the one they came from) and be mistaken for this node.
#[test]
fn reserved_names_are_no_node_names() {
    for name in ["journal", "local", "network"] {
        let e = parse(&MINIMAL.replace("name = \"master-b\"", &format!("name = \"{name}\""))).unwrap_err();
        assert!(e.contains(&format!("peer[0].name: {name:?} is a name the agent uses itself")), "{e}");
        let e = parse(&MINIMAL.replace("node = \"master-a\"", &format!("node = \"{name}\""))).unwrap_err();
        assert!(e.contains(&format!("node: {name:?} is a name the agent uses itself")), "{e}");
    }
    assert!(parse(&MINIMAL.replace("name = \"master-b\"", "name = \"journal.example\"")).is_ok());
}

/// Retired masters are origins a peer may name, never this node or a peer.
#[test]
fn retired_masters_are_masters_no_longer_peers() {
    let config = parse(&format!("retired_masters = [\"master-old\"]\n{MINIMAL}")).unwrap();
    assert_eq!(config.masters(), ["master-b", "master-old"]);
    for (text, error) in [
        ("retired_masters = [\"master-b\"]", "retired_masters[0]: \"master-b\" is this node or a [[peer]]"),
        ("retired_masters = [\"x\", \"x\"]", "retired_masters[1]: \"x\" is listed twice"),
        ("retired_masters = [\"-x\"]", "retired_masters[0]: \"-x\" is not a DNS name"),
    ] {
        let e = parse(&format!("{text}\n{MINIMAL}")).unwrap_err();
        assert!(e.contains(error), "{e}");
    }
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (format!("{MINIMAL}\nbogus = 1"), "unknown field `bogus`"),
        (MINIMAL.replace("10.0.0.12:4515", "x"), "peer[0].address: \"x\" is not host:port"),
        (MINIMAL.replace("10.0.0.12", "10.0.0.300"), "peer[0].address: \"10.0.0.300:4515\" is not host:port (host: "),
        (MINIMAL.replace("name = \"master-b\"", "name = \"master-a\""), "peer[0].name: \"master-a\" is this node"),
        (MINIMAL.replace("node = \"master-a\"", "node = \"a b\""), "node: \"a b\" is not a DNS name"),
        (format!("listen = \"nope\"\n{MINIMAL}"), "listen: \"nope\" is not ip:port"),
        (format!("log_format = \"xml\"\n{MINIMAL}"), "log_format: \"xml\""),
        (format!("metrics_listen = \"localhost\"\n{MINIMAL}"), "metrics_listen: \"localhost\" is not ip:port"),
        (format!("control_sock = \"/x\"\n{MINIMAL}"), "unknown field `control_sock`"),
        (format!("{MINIMAL}\n[timings]\nrescan_interval = \"soon\""), "timings.rescan_interval: \"soon\""),
        (
            format!("{MINIMAL}\n[[peer]]\nname = \"master-b\"\naddress = \"h:1\""),
            "peer[1].name: \"master-b\" is listed twice",
        ),
        (MINIMAL.replace("[tls]", "[tls]\ncrt = 1"), "unknown field `crt`"),
        (format!("{MINIMAL}\n[salt]\nversion_command = []"), "salt.version_command: must name a program"),
    ];
    for (text, want) in cases {
        let err = parse(&text).unwrap_err();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
}

#[test]
fn timings_outside_safe_bounds_are_refused_with_the_reason() {
    let timing = |line: &str| parse(&format!("{MINIMAL}\n[timings]\n{line}"));
    let refused = [
        ("absent_grace = \"0s\"", "timings.absent_grace: \"0s\" is below the minimum 10ms: Salt 3008"),
        ("absent_grace = \"5ms\"", "timings.absent_grace: \"5ms\" is below the minimum 10ms"),
        ("absent_grace = \"100d\"", "timings.absent_grace: \"100d\" is above the maximum 5s: "),
        ("anti_entropy_interval = \"0s\"", "timings.anti_entropy_interval: \"0s\" is below the minimum 1s: "),
        ("anti_entropy_interval = \"2days\"", "timings.anti_entropy_interval: \"2days\" is above the maximum 1h"),
        ("rescan_interval = \"1ms\"", "timings.rescan_interval: \"1ms\" is below the minimum 10s: "),
        ("rescan_interval = \"1year\"", "timings.rescan_interval: \"1year\" is above the maximum 1day"),
        ("max_clock_skew = \"0s\"", "timings.max_clock_skew: \"0s\" is below the minimum 1s: "),
        ("max_clock_skew = \"30days\"", "timings.max_clock_skew: \"30days\" is above the maximum 1day"),
        ("reconnect_max = \"1ms\"", "timings.reconnect_max: \"1ms\" is below the minimum 100ms: "),
        ("reconnect_max = \"1day\"", "timings.reconnect_max: \"1day\" is above the maximum 1h"),
    ];
    for (line, want) in refused {
        let err = timing(line).unwrap_err();
        assert!(err.contains(want), "{line}: {err:?} should contain {want:?}");
    }
    // The bounds themselves, and what the tests and the fault suite use.
    for line in [
        "absent_grace = \"10ms\"",
        "absent_grace = \"5s\"",
        "anti_entropy_interval = \"1s\"",
        "rescan_interval = \"1h\"",
        "max_clock_skew = \"4h\"",
        "reconnect_max = \"300ms\"",
    ] {
        assert!(timing(line).is_ok(), "{line}: {:?}", timing(line).err());
    }
}

#[test]
fn host_port_forms() {
    for ok in ["10.0.0.1:4515", "master-b.example.com:1", "[::1]:4515", "master-b.invalid:4515", "localhost:1"] {
        assert!(is_host_port(ok), "{ok}");
    }
    for bad in [
        "10.0.0.1",
        ":4515",
        "h:0",
        "h:99999",
        "a b:1",
        "10.0.0.300:4515",
        "10.0.0:4515",
        "::1:4515",
        "[zz]:1",
        "under_score:1",
        "-lead.example:1",
        "a..b:1",
    ] {
        assert!(!is_host_port(bad), "{bad}");
    }
}
