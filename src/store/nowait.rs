//! Reads of local files that cannot wait: the path is in the kernel's lookup cache and the bytes
//! are in the page cache, so the read runs on the async worker itself.
//!
//! Every other local read is a trip to the blocking pool: a queue, a thread woken and the task
//! woken back, about three context switches and 25 µs of CPU per request on a two-core machine,
//! more than opening and reading a 64 KiB chunk file that is already in memory. Here the file
//! is opened with `openat2(RESOLVE_CACHED)` (Linux 5.12), which fails rather than wait for a
//! lookup that needs I/O, and read with `preadv2(RWF_NOWAIT)`, which fails rather than wait for
//! the disk. Whatever would wait, and whatever this path does not decide for certain, is
//! [`Nowait::WouldBlock`]: the caller then takes the blocking path, which gives the answer for
//! every case. Only an open file below the root (`RESOLVE_BENEATH`, so no symlink leaves it) or
//! a name that does not exist is decided here, which the blocking path would decide the same way.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use super::{ByteRange, ObjectMeta, StoreError, StoreKey, resolve_range};

/// What a read that must not wait found.
#[derive(Debug)]
pub enum Nowait<T> {
    /// Decided without waiting.
    Done(T),
    /// Deciding would wait (or is not certain here): use the blocking path.
    WouldBlock,
}

/// A local root opened once, for reads beneath it that do not wait.
#[derive(Debug)]
pub(crate) struct Root {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    dir: File,
    /// Set when the filesystem refuses reads that do not wait, so that none are tried again.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    reads_refused: std::sync::atomic::AtomicBool,
}

/// A read that gave an object's metadata and the range of it that is in the buffer.
pub(crate) type Read = Option<(ObjectMeta, Range<u64>)>;

impl Root {
    /// Opens the (canonical) root directory; `None` where reads that do not wait are not
    /// available.
    pub fn open(root: &Path) -> Option<Self> {
        imp::open_dir(root)
    }

    /// Whether reads that do not wait were found unavailable: the kernel has no `openat2` with
    /// `RESOLVE_CACHED`, or this filesystem refuses `RWF_NOWAIT`.
    #[cfg(test)]
    fn refused(&self) -> bool {
        imp::refused(self)
    }

    /// Opens `key`, with the metadata of the regular file it names; `Done(None)` when nothing
    /// by that name exists, or it is no regular file.
    pub fn open_file(&self, key: &StoreKey) -> Nowait<Option<(ObjectMeta, File)>> {
        let file = match imp::open_beneath(self, key.as_str()) {
            Nowait::Done(Some(file)) => file,
            Nowait::Done(None) => return Nowait::Done(None),
            Nowait::WouldBlock => return Nowait::WouldBlock,
        };
        match file.metadata() {
            Ok(m) if m.is_file() => Nowait::Done(Some((super::object::local_meta(&m), file))),
            Ok(_) => Nowait::Done(None),
            Err(_) => Nowait::WouldBlock,
        }
    }

    /// Reads `range` of `key` (all of it when `None`) into `buf`, which it replaces. An
    /// unsatisfiable range is [`StoreError::Range`]; a range of more than `max` bytes is left to
    /// the blocking path, so that the worker copies little.
    pub fn read(
        &self,
        key: &StoreKey,
        range: Option<ByteRange>,
        max: u64,
        buf: &mut Vec<u8>,
    ) -> Nowait<Result<Read, StoreError>> {
        let (meta, file) = match self.open_file(key) {
            Nowait::Done(Some(found)) => found,
            Nowait::Done(None) => return Nowait::Done(Ok(None)),
            Nowait::WouldBlock => return Nowait::WouldBlock,
        };
        let range = match resolve_range(range, meta.size) {
            Ok(r) => r,
            Err(e) => return Nowait::Done(Err(e)),
        };
        let Some(want) = Some(range.end - range.start)
            .filter(|n| *n <= max)
            .and_then(|n| usize::try_from(n).ok())
        else {
            return Nowait::WouldBlock;
        };
        buf.clear();
        if buf.try_reserve(want).is_err() {
            return Nowait::WouldBlock;
        }
        match imp::read_at(self, &file, buf, want, range.start) {
            Nowait::Done(()) if buf.len() == want => Nowait::Done(Ok(Some((meta, range)))),
            // Short (the file shrank since its metadata was read) or not in memory.
            _ => Nowait::WouldBlock,
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::ffi::CString;
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::{Nowait, Root};

    /// Cleared for the whole process when the kernel (older than 5.12, or a seccomp filter)
    /// does not offer `openat2` with `RESOLVE_CACHED`.
    static OPENAT2: AtomicBool = AtomicBool::new(true);

    pub fn open_dir(root: &Path) -> Option<Root> {
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(root)
            .ok()?;
        Some(Root {
            dir,
            reads_refused: AtomicBool::new(false),
        })
    }

    /// Opens `key` (relative, already checked by [`crate::store::StoreKey`]) below the root,
    /// following symlinks only where they stay below it, if no lookup has to wait.
    pub fn open_beneath(root: &Root, key: &str) -> Nowait<Option<File>> {
        if !OPENAT2.load(Ordering::Relaxed) {
            return Nowait::WouldBlock;
        }
        let Ok(path) = CString::new(key) else {
            return Nowait::WouldBlock;
        };
        // SAFETY: `open_how` is a plain C struct of integers; all zero is its empty value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        // Non-blocking, as on the blocking path: opening a FIFO must not wait for a writer.
        how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_CACHED;
        // SAFETY: the arguments are a live directory descriptor, a NUL-terminated path and a
        // pointer to `how` with its size, as openat2(2) takes them; nothing is kept after return.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.dir.as_raw_fd(),
                path.as_ptr(),
                &raw const how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            let Ok(fd) = i32::try_from(fd) else {
                return Nowait::WouldBlock;
            };
            // SAFETY: openat2 returned a new descriptor that nothing else owns.
            return Nowait::Done(Some(unsafe { File::from_raw_fd(fd) }));
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // Nothing by that name (negative lookups are cached too), or a file in the way.
            Some(libc::ENOENT | libc::ENOTDIR) => Nowait::Done(None),
            // Too old a kernel, or a filter that forbids the call: never again.
            Some(libc::ENOSYS | libc::EINVAL | libc::EPERM) => {
                OPENAT2.store(false, Ordering::Relaxed);
                Nowait::WouldBlock
            }
            // EAGAIN (not cached), EXDEV (a symlink out of the root, or an absolute one, which
            // may still point inside it), ELOOP, and the rest: the blocking path decides.
            _ => Nowait::WouldBlock,
        }
    }

    /// Appends `want` bytes of `file` from `offset` to `buf` (which has room for them) as far as
    /// the page cache holds them; `WouldBlock` when a read would wait for the disk.
    #[cfg(test)]
    pub fn refused(root: &Root) -> bool {
        !OPENAT2.load(Ordering::Relaxed) || root.reads_refused.load(Ordering::Relaxed)
    }

    pub fn read_at(root: &Root, file: &File, buf: &mut Vec<u8>, want: usize, offset: u64) -> Nowait<()> {
        if root.reads_refused.load(Ordering::Relaxed) {
            return Nowait::WouldBlock;
        }
        let start = buf.len();
        while buf.len() - start < want {
            let done = buf.len() - start;
            let spare = &mut buf.spare_capacity_mut()[..want - done];
            let iov = libc::iovec {
                iov_base: spare.as_mut_ptr().cast(),
                iov_len: spare.len(),
            };
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                return Nowait::WouldBlock;
            };
            // SAFETY: `iov` describes spare capacity of `buf` that nothing else references; the
            // kernel writes at most `iov_len` bytes there.
            let n = unsafe { libc::preadv2(file.as_raw_fd(), &raw const iov, 1, at, libc::RWF_NOWAIT) };
            match usize::try_from(n) {
                Ok(0) => break,
                // SAFETY: the kernel initialised these `n` bytes, which lie within the spare
                // capacity handed to it.
                Ok(n) => unsafe { buf.set_len(buf.len() + n) },
                Err(_) => {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
                        root.reads_refused.store(true, Ordering::Relaxed);
                    }
                    return Nowait::WouldBlock;
                }
            }
        }
        Nowait::Done(())
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    use std::fs::File;
    use std::path::Path;

    use super::{Nowait, Root};

    pub fn open_dir(_: &Path) -> Option<Root> {
        None
    }

    pub fn open_beneath(_: &Root, _: &str) -> Nowait<Option<File>> {
        Nowait::WouldBlock
    }

    pub fn read_at(_: &Root, _: &File, _: &mut Vec<u8>, _: usize, _: u64) -> Nowait<()> {
        Nowait::WouldBlock
    }

    #[cfg(test)]
    pub fn refused(_: &Root) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> StoreKey {
        StoreKey::new(k).unwrap()
    }

    /// What the blocking path reads: the bytes of the file and its metadata.
    fn blocking(path: &Path, range: Range<usize>) -> (Vec<u8>, ObjectMeta) {
        let bytes = std::fs::read(path).unwrap();
        let meta = super::super::object::local_meta(&std::fs::metadata(path).unwrap());
        (bytes[range].to_vec(), meta)
    }

    /// The bytes read, the object's metadata and the range read.
    type Found = (Vec<u8>, ObjectMeta, Range<u64>);

    /// Reads with [`Root::read`]; `None` when it left the read to the blocking path.
    fn read(root: &Root, k: &str, range: Option<ByteRange>, max: u64) -> Option<Result<Option<Found>, StoreError>> {
        let mut buf = b"old bytes".to_vec();
        match root.read(&key(k), range, max, &mut buf) {
            Nowait::Done(read) => Some(read.map(|found| found.map(|(meta, range)| (buf, meta, range)))),
            Nowait::WouldBlock => None,
        }
    }

    #[test]
    fn files_in_memory_read_as_the_blocking_path_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let root_path = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root_path.join("a/b")).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(root_path.join("a/b/c"), &data).unwrap();
        std::fs::write(root_path.join("empty"), b"").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("a/b/c", root_path.join("alias")).unwrap();
        let root = Root::open(&root_path);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(root.is_some(), "the root does not open");
        }
        let Some(root) = root else { return };
        let file = root_path.join("a/b/c");
        let cases = [
            (None, 0..100_000),
            (Some(ByteRange::Bounded(10, 20)), 10..20),
            (Some(ByteRange::Bounded(99_990, 200_000)), 99_990..100_000),
            (Some(ByteRange::From(50_000)), 50_000..100_000),
            (Some(ByteRange::Suffix(7)), 99_993..100_000),
        ];
        for name in ["a/b/c", "alias"] {
            for (range, expected) in cases.clone() {
                match read(&root, name, range, 1 << 20) {
                    Some(read) => {
                        let (bytes, meta, got) = read.unwrap().unwrap();
                        let (want, want_meta) = blocking(&file, expected.clone());
                        assert_eq!(bytes, want, "{name} {range:?}");
                        assert_eq!(meta, want_meta);
                        assert_eq!(got, expected.start as u64..expected.end as u64);
                    }
                    // Only where the kernel or the filesystem refuses reads that do not wait:
                    // files just written are in memory.
                    None => assert!(root.refused(), "{name} {range:?} was not read"),
                }
            }
        }
        if root.refused() {
            return;
        }
        // Missing names, names under a file and directories are decided here: not found, once
        // the kernel has looked the name up (a name never looked up is not in its cache).
        for missing in ["nope", "a/nope", "a", "a/b"] {
            assert!(!root_path.join(missing).is_file());
            assert!(
                matches!(read(&root, missing, None, 1 << 20), Some(Ok(None))),
                "{missing}"
            );
        }
        // A name under a file may be left to the blocking path, but is never found.
        assert!(matches!(read(&root, "a/b/c/d", None, 1 << 20), Some(Ok(None)) | None));
        // Unsatisfiable ranges are errors with the size; larger ranges than asked are left.
        assert!(matches!(
            read(&root, "a/b/c", Some(ByteRange::From(100_000)), 1 << 20),
            Some(Err(StoreError::Range { size: 100_000, .. }))
        ));
        assert!(matches!(
            read(&root, "empty", Some(ByteRange::Suffix(1)), 1 << 20),
            Some(Err(StoreError::Range { size: 0, .. }))
        ));
        let (empty, _, _) = read(&root, "empty", None, 1 << 20).unwrap().unwrap().unwrap();
        assert!(empty.is_empty());
        assert!(read(&root, "a/b/c", None, 99_999).is_none());
        assert!(read(&root, "a/b/c", Some(ByteRange::Suffix(99_999)), 99_999).is_some());
    }

    /// A symlink out of the root, or an absolute one, is never followed here: the blocking path
    /// decides (it serves absolute links that stay inside).
    #[cfg(unix)]
    #[test]
    fn symlinks_that_may_leave_the_root_are_left_to_the_blocking_path() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root_path = base.join("root");
        std::fs::create_dir_all(root_path.join("sub")).unwrap();
        std::fs::write(base.join("secret"), b"secret").unwrap();
        std::fs::write(root_path.join("sub/inside"), b"inside").unwrap();
        std::os::unix::fs::symlink(base.join("secret"), root_path.join("absolute_out")).unwrap();
        std::os::unix::fs::symlink("../secret", root_path.join("relative_out")).unwrap();
        std::os::unix::fs::symlink(root_path.join("sub/inside"), root_path.join("absolute_in")).unwrap();
        std::os::unix::fs::symlink("../../root/sub/inside", root_path.join("sub/round_trip")).unwrap();
        std::os::unix::fs::symlink("/proc/self/environ", root_path.join("proc")).unwrap();
        std::os::unix::fs::symlink("loop", root_path.join("loop")).unwrap();
        let Some(root) = Root::open(&root_path) else { return };
        for name in [
            "absolute_out",
            "relative_out",
            "absolute_in",
            "sub/round_trip",
            "proc",
            "loop",
        ] {
            assert!(
                read(&root, name, None, 1 << 20).is_none(),
                "{name} was decided without the blocking path"
            );
            assert!(matches!(root.open_file(&key(name)), Nowait::WouldBlock), "{name}");
        }
    }
}
