//! Opening a TUN device: the benchmark's only unsafe code. Linux attaches a
//! file descriptor of `/dev/net/tun` to a device with the TUNSETIFF ioctl,
//! which no safe wrapper of the crates the project uses offers (rustix has
//! none for it), so it is called through libc here, with a request whose
//! layout is the kernel's `struct ifreq`.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use anyhow::{bail, Context};

/// `struct ifreq` as TUNSETIFF reads it: the device name, then the flags
/// (a `short` at the start of the 24-byte union).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// Creates TUN device `name` in the calling thread's network namespace
/// (IFF_TUN: IP packets; IFF_NO_PI: no 4-byte header before them) and
/// returns its file, non-blocking: reads return one packet the stack sent
/// out of the device, writes hand one packet to the stack as received on it.
/// The device lives as long as the file.
pub fn open(name: &str) -> anyhow::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        bail!("TUN device name {name:?} must be 1 to {} bytes", libc::IFNAMSIZ - 1);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .context("cannot open /dev/net/tun (the WAN benchmark runs as root, with the tun module)")?;
    let mut request =
        IfReq { name: [0; libc::IFNAMSIZ], flags: (libc::IFF_TUN | libc::IFF_NO_PI) as _, _rest: [0; 22] };
    request.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the descriptor is open for as long as `file` lives, and
    // `request` is a valid `struct ifreq` (40 bytes, NUL-terminated name)
    // that the kernel reads and writes only during the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut request as *mut IfReq) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("TUNSETIFF {name}"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_request_has_the_size_of_struct_ifreq() {
        assert_eq!(std::mem::size_of::<super::IfReq>(), std::mem::size_of::<libc::ifreq>());
    }
}
