//! The integration tests of salt-keysync, one binary (ripgrep style).

/// `salt-keysync audit`: filters, table, verify on tampered and rotated logs, --follow.
mod audit;
/// The real binary as separate processes: CLI errors, `run --config` on three agents.
mod binary;
/// `certs init`/`certs issue` and the documented openssl recipe, each carrying two agents.
mod certs;
/// Issue 28 item 5: `check` predicts `run` for listen addresses in use and a
/// named master config that does not exist; exit 75 for an address in use.
mod check_predicts_run;
/// `status --cluster` beside real Salt 3008.3 and 3006.28: versions, key
/// counts, skew, and an auto-accepting master as an error on every master.
mod cluster_health;
/// Issue 27: a compromised master decides only as itself, and cannot starve
/// or flood the others.
mod compromised;
/// `salt-keysync demo`: three operations shown propagating, private files, cleanup on Ctrl-C.
mod demo;
/// Issue 20: every shell command in the docs is run by a test or marked as an example.
mod doc_commands;
/// Issue 29 item 5: a store of a newer format refused (78, check, recover as
/// the way out); root's files in the agent's user's folders handed over.
mod downgrade;
/// First contact on agent processes: drifted masters started in two orders
/// end alike, an identical site rewrites nothing, observe mode and `plan`.
mod first_contact;
/// Issue 28 item 2: held deletes and refused decisions told on every master,
/// exit status 3 for an error finding, `release` and `revert` asking first.
mod guard_view;
/// Issue 27 item 9: the salt user played against the real postrm, %postun
/// and owners as root (mount namespace); a staging folder left by root.
mod maintainer_scripts;
/// The shipped alert rules and dashboard: only exported metrics, mixin
/// conventions, a runbook section and a promtool test case per alert.
mod monitoring;
/// sd_notify with a fake systemd socket: READY, WATCHDOG, RELOADING, STOPPING.
mod notify;
/// Issue 20: what the binary tells an operator: each cause once, `--json`
/// errors as JSON, filter values checked, options only where they act.
mod operator;
/// What the packages ship: man pages and completions from `generate`,
/// examples in `--help`, the example config's documented defaults.
mod packaging;
/// Issue 20: a peer that refuses this master, or cannot be reached, told
/// in one line with its cause: at run time, in `status` and by `check`.
mod peer_causes;
/// Issue 20: documented procedures run as written (a stolen certificate cut
/// off by renaming the master).
mod procedures;
/// SIGHUP reloads on agent processes: peers, certificates, refused broken configs.
mod reload;
/// In-process three-agent clusters over real mTLS: accept, reject and delete
/// in both Salt patterns, restarts, transitive propagation, partitions.
mod replication;
/// Issue 29: a rolling upgrade, this release beside an agent of the previous one.
mod rolling;
/// Real `salt-key` from Salt 3008.3, 3007.15 and 3006.28 driving three agent
/// processes; a first-contact conflict settled by one live `salt-key -d`.
mod salt_key;
/// The key-acceptance settings read as real Salt 3008.3 and 3006.28 read them.
mod salt_settings;
/// Issue 4: hostile key files, hostile peer messages and strangers at the TLS
/// door are refused, audited once each, and never reach a peer.
mod security;
/// Issue 18: what the systemd unit relies on: exit 78, journald priorities,
/// `salt-keysync reload`, connect failures with their cause.
mod service;
/// Issue 4: start-up refuses too-open paths and masters it cannot serve.
mod startup;
/// `salt-keysync status` and the metrics endpoint: a stopped peer, key counts,
/// master.pub and settings drift between masters.
mod status;
/// The repository's own tidiness: `//!` lines, an I/O-free machine crate,
/// documents that stand on their own.
mod tidy;
