//! What the kernel says about an agent process: its CPU time
//! (`/proc/PID/stat`) and its memory now and at its peak (`/proc/PID/status`,
//! VmRSS and VmHWM, the resident set's high-water mark since the process
//! started).
//!
//! VmHWM is not a peak no reading can pass: the kernel raises its mark when
//! it unmaps memory, not when an allocator hands pages back with `madvise`,
//! and reads both figures from counters each CPU batches. A VmRSS read
//! earlier can stand above a VmHWM read later (CI saw 48.59 then 48.38 MiB):
//! a window's peak is the larger of the two, [`Memory::peak_since`].

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

impl Memory {
    /// The peak of a window that began with `before` and ends with this
    /// reading: the high-water mark now, or what was resident at its start
    /// if that was more.
    pub fn peak_since(&self, before: &Memory) -> f64 {
        self.peak_rss_mib.max(before.rss_mib)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_peaks_at_least_at_what_was_resident_when_it_began() {
        // The readings of the CI run whose hostile row had a peak below its start.
        let before = Memory { rss_mib: 48.59375, peak_rss_mib: 48.6 };
        let end = Memory { rss_mib: 40.5, peak_rss_mib: 48.375 };
        assert_eq!(end.peak_since(&before), 48.59375);
        let higher = Memory { rss_mib: 40.5, peak_rss_mib: 60.0 };
        assert_eq!(higher.peak_since(&before), 60.0);
    }

    #[test]
    fn this_process_reads_its_own_memory() {
        let m = memory(std::process::id()).expect("/proc/self/status");
        assert!(m.rss_mib > 0.0 && m.peak_rss_mib >= m.rss_mib, "{m:?}");
    }
}
