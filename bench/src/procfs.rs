//! What the kernel says about an agent process: its CPU time
//! (`/proc/PID/stat`) and its memory now and at its peak (`/proc/PID/status`,
//! VmRSS and VmHWM, the resident set's high-water mark since the process
//! started: a peak no sampling can miss).

use std::process::Command;

use anyhow::Context;

/// utime + stime of a process, in clock ticks (/proc/PID/stat fields 14, 15).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: count from its closing parenthesis.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> { Ok(fields.get(n - 3).context("short /proc/PID/stat")?.parse()?) };
    Ok(field(14)? + field(15)?)
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux).
pub fn clock_ticks() -> anyhow::Result<f64> {
    let out = Command::new("getconf").arg("CLK_TCK").output().context("cannot run getconf CLK_TCK")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// A process's resident memory now and at its peak, in MiB.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
}

pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mib = |field: &str| -> anyhow::Result<f64> {
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
        Ok(kib as f64 / 1024.0)
    };
    Ok(Memory { rss_mib: mib("VmRSS:")?, peak_rss_mib: mib("VmHWM:")? })
}
