//! What the agent shows and takes from the operator and the service
//! manager while it runs: the control socket, what it knows of its peers,
//! metrics, systemd's notify protocol, config reloads and log format.

pub mod board;
pub mod clocks;
pub mod control;
pub mod findings;
pub mod held;
pub mod logging;
pub mod metrics;
pub mod refused;
pub mod reload;
pub mod scrape_listener;
pub mod sd_notify;
pub mod site_plan;
