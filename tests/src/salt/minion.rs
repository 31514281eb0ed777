//! One real salt-minion whose `master:` lists every master of the cluster
//! (Salt's hot multi-master mode), tuned to retry authentication quickly.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use super::master::Ports;
use super::{private_dir, tool, write_file, Daemon};

pub struct SaltMinion {
    pub version: String,
    pub id: String,
    /// root_dir and the `-c` folder holding the `minion` config file.
    pub dir: PathBuf,
    daemon: Option<Daemon>,
}

impl SaltMinion {
    pub fn new(version: &str, id: &str, masters: &[Ipv4Addr], ports: Ports, dir: PathBuf) -> SaltMinion {
        private_dir(&dir.join("pki"));
        private_dir(&dir.join("cache"));
        private_dir(&dir.join("sock"));
        let d = dir.display();
        let master_list: String = masters.iter().map(|ip| format!("  - {ip}\n")).collect();
        // acceptance_wait_time 1: a key accepted on the master is picked up
        // within about a second. No fqdn grains (reverse DNS is slow), jobs in
        // threads (no fork per test.ping), no mine job at start.
        let config = format!(
            "id: {id}\n\
             master:\n{master_list}\
             master_port: {ret}\n\
             publish_port: {publish}\n\
             root_dir: {d}\n\
             pki_dir: {d}/pki\n\
             cachedir: {d}/cache\n\
             sock_dir: {d}/sock\n\
             pidfile: {d}/minion.pid\n\
             log_file: {d}/minion.log\n\
             log_level_logfile: info\n\
             user: root\n\
             acceptance_wait_time: 1\n\
             acceptance_wait_time_max: 2\n\
             random_reauth_delay: 0\n\
             auth_timeout: 5\n\
             auth_tries: 2\n\
             recon_default: 200\n\
             recon_max: 1000\n\
             enable_fqdns_grains: False\n\
             multiprocessing: False\n\
             mine_enabled: False\n",
            ret = ports.ret,
            publish = ports.publish,
        );
        write_file(&dir.join("minion"), config.as_bytes(), 0o600);
        SaltMinion { version: version.into(), id: id.into(), dir, daemon: None }
    }

    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "minion {} already runs", self.id);
        // A pidfile left by a killed minion makes the next one refuse to start.
        let _ = std::fs::remove_file(self.dir.join("minion.pid"));
        let mut command = Command::new(tool(&self.version, "salt-minion"));
        command.arg("-c").arg(&self.dir).args(["-l", "quiet"]);
        self.daemon = Some(Daemon::spawn(&format!("salt-minion {}", self.id), command, self.dir.join("minion.out")));
    }

    pub fn stop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.stop();
        }
    }

    /// Its public key as the minion holds it (`minion.pub`, with a newline;
    /// the master stores it without).
    pub fn public_key(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.join("pki/minion.pub")).ok()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("minion.log")).unwrap_or_default()
    }
}
