//! The system calls of the soft provider. Each `unsafe` block sits in a small function
//! of its own with the reason it is sound.
//!
//! - [`memfd`]: an anonymous file for the region table;
//! - [`Mapping`]: a shared mapping of it (ours read-write, the peer's read-only);
//! - [`vm_read`] / [`vm_write`]: Linux cross-memory attach (`process_vm_readv`,
//!   `process_vm_writev`), which copies between our memory and another process's
//!   without that process running any code;
//! - [`pidfd_open`] / [`has_exited`]: whether the peer process is gone, so that
//!   nothing waits for a lane a dead process left odd.

use std::{
    ffi::CStr,
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::AtomicU64,
};

/// A new memfd of `len` bytes (zeroed), closed on exec.
pub(crate) fn memfd(name: &CStr, len: usize) -> io::Result<File> {
    #[allow(unsafe_code)]
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` was just returned by memfd_create, is open, and nothing else owns it.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len as u64)?;
    // Its size is fixed for good: a peer that maps it must not find it shrunk under
    // the mapping (reading past the end of a shrunk file is SIGBUS).
    add_seals(&file, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    Ok(file)
}

/// Seals `file` against writes by anyone but the mappings made already (Linux 5.1's
/// `F_SEAL_FUTURE_WRITE`; where it is missing, nothing more is sealed), and against
/// further seals.
pub(crate) fn seal_writes(file: &File) -> io::Result<()> {
    match add_seals(file, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL) {
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => add_seals(file, libc::F_SEAL_SEAL),
        other => other,
    }
}

fn add_seals(file: &File, seals: libc::c_int) -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: fcntl on a descriptor `file` owns, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `file`'s size is sealed (it can never shrink), as [`memfd`] makes it.
pub(crate) fn cannot_shrink(file: &File) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: fcntl on a descriptor `file` owns, with no argument.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// A shared mapping of a whole file, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; it is only ever accessed through
// `atomic_at`, whose atomics are safe to use from any thread.
#[allow(unsafe_code)]
unsafe impl Send for Mapping {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared; read-only unless `writable`.
    pub(crate) fn map(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        #[allow(unsafe_code)]
        // SAFETY: a fresh mapping chosen by the kernel (null hint) of an open file; it
        // aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Mapping { ptr, len })
    }

    /// The 8-byte atomic word at `offset`.
    ///
    /// # Panics
    ///
    /// If `offset` is not a multiple of 8 inside the mapping (a bug of the caller:
    /// offsets come from the table layout, never from the peer).
    pub(crate) fn atomic_at(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "table offset {offset} outside a mapping of {} bytes",
            self.len
        );
        #[allow(unsafe_code)]
        // SAFETY: the word lies inside the mapping (checked above), is 8-aligned (the
        // mapping is page-aligned and the offset a multiple of 8), the mapping lives as
        // long as `self`, and shared memory is only ever accessed atomically, by both
        // processes. A read-only mapping is only loaded from.
        unsafe {
            &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>()
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: `ptr` and `len` describe a mapping made by `map` and not unmapped
        // yet; every reference into it borrows `self`, so none outlives this.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// Copies `local.len()` bytes at `remote` in process `pid` into `local`.
pub(crate) fn vm_read(pid: i32, local: &mut [u8], remote: u64) -> io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let n = vm_read_once(pid, &mut local[done..], remote + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv moved no bytes",
            ));
        }
        done += n;
    }
    Ok(())
}

fn vm_read_once(pid: i32, local: &mut [u8], remote: u64) -> io::Result<usize> {
    let local_iov = libc::iovec {
        iov_base: local.as_mut_ptr().cast(),
        iov_len: local.len(),
    };
    let remote_iov = libc::iovec {
        iov_base: remote as usize as *mut libc::c_void,
        iov_len: local.len(),
    };
    #[allow(unsafe_code)]
    // SAFETY: the local iovec describes `local`, which is exclusively borrowed for the
    // call; the remote iovec names memory of another process, which the kernel checks
    // (it fails with EFAULT, never touching our memory outside `local`).
    let n = unsafe { libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Copies `local` to `remote` in process `pid`.
pub(crate) fn vm_write(pid: i32, local: &[u8], remote: u64) -> io::Result<()> {
    let mut done = 0;
    while done < local.len() {
        let n = vm_write_once(pid, &local[done..], remote + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "process_vm_writev moved no bytes",
            ));
        }
        done += n;
    }
    Ok(())
}

fn vm_write_once(pid: i32, local: &[u8], remote: u64) -> io::Result<usize> {
    let local_iov = libc::iovec {
        iov_base: local.as_ptr().cast_mut().cast(),
        iov_len: local.len(),
    };
    let remote_iov = libc::iovec {
        iov_base: remote as usize as *mut libc::c_void,
        iov_len: local.len(),
    };
    #[allow(unsafe_code)]
    // SAFETY: the local iovec describes `local`, borrowed for the call and only read
    // by the kernel; the remote side is checked by the kernel.
    let n = unsafe { libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A pidfd for process `pid`: it becomes readable when the process exits, and,
/// unlike the pid, it can never name another process.
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    #[allow(unsafe_code)]
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1; no
    // memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd =
        i32::try_from(fd).map_err(|_| io::Error::other("pidfd_open: descriptor out of range"))?;
    #[allow(unsafe_code)]
    // SAFETY: `fd` was just returned by pidfd_open, is open, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the process behind `pidfd` has exited (without waiting).
pub(crate) fn has_exited(pidfd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: `poll` is one valid, exclusively borrowed pollfd for the call; a zero
    // timeout never blocks.
    let n = unsafe { libc::poll(&mut poll, 1, 0) };
    n > 0 && poll.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// This process's id.
pub(crate) fn pid() -> i32 {
    std::process::id() as i32
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`) and this process's pid
/// namespace: two processes that agree on both see the same pids.
pub(crate) fn host_identity() -> ([u8; 16], u64) {
    let mut boot = [0u8; 16];
    if let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = text
            .bytes()
            .filter(u8::is_ascii_hexdigit)
            .map(|c| (c as char).to_digit(16).unwrap_or(0) as u8)
            .collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            boot[i] = pair[0] << 4 | pair.get(1).copied().unwrap_or(0);
        }
    }
    let pidns = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|link| {
            let link = link.to_string_lossy().into_owned();
            link.trim_start_matches("pid:[")
                .trim_end_matches(']')
                .parse()
                .ok()
        })
        .unwrap_or(0);
    (boot, pidns)
}

/// A random 64-bit value (from the standard library's randomly keyed hasher).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.write_i32(pid());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_memory_attach_to_ourselves_copies() {
        let src = vec![7u8; 10_000];
        let mut dst = vec![0u8; 10_000];
        vm_read(pid(), &mut dst, src.as_ptr() as u64).unwrap();
        assert_eq!(src, dst);
        let data = [1u8, 2, 3];
        vm_write(pid(), &data, dst.as_mut_ptr() as u64).unwrap();
        assert_eq!(&dst[..4], &[1, 2, 3, 7]);
        // An unmapped address is refused by the kernel, not a crash.
        assert!(vm_read(pid(), &mut dst[..8], 8).is_err());
    }

    #[test]
    fn a_pidfd_tells_when_its_process_exits() {
        let me = pidfd_open(pid()).unwrap();
        assert!(!has_exited(&me));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = pidfd_open(child.id() as i32).unwrap();
        child.wait().unwrap();
        assert!(has_exited(&fd), "a reaped child has exited");
    }

    #[test]
    fn memfd_mappings_share_atomics() {
        let file = memfd(c"test", 4096).unwrap();
        let a = Mapping::map(&file, 4096, true).unwrap();
        let b = Mapping::map(&file, 4096, false).unwrap();
        a.atomic_at(64)
            .store(42, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            b.atomic_at(64).load(std::sync::atomic::Ordering::SeqCst),
            42
        );
        let (boot, _) = host_identity();
        assert_ne!(boot, [0u8; 16]);
    }
}
