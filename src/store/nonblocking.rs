//! Reads of local files that cannot wait: the path is in the kernel's lookup cache and the bytes
//! are in the page cache, so the read runs on the async worker itself.
//!
//! Every other local read is a trip to the blocking pool: a queue, a thread woken and the task
//! woken back, about three context switches and 25 µs of CPU per request on a two-core machine,
//! more than opening and reading a 64 KiB chunk file that is already in memory. Here the file
//! is opened with `openat2(RESOLVE_CACHED)` (Linux 5.12), which fails rather than wait for a
//! lookup that needs I/O, and read with `preadv2(RWF_NOWAIT)`, which fails rather than wait for
//! the disk. Whatever would wait, and whatever this path does not decide for certain, is
//! [`NonBlocking::WouldBlock`]: the caller then takes the blocking path, which gives the answer for
//! every case. Only an open regular file below the root (`RESOLVE_BENEATH`, so no symlink leaves
//! it) or a name that does not exist is decided here, as the blocking path would decide it:
//! - the root is looked up by its path on every read, as the blocking path does, so a root
//!   directory renamed or replaced while the server runs is never served from its old inode;
//! - only roots on local disk filesystems take this path (ext4, xfs, btrfs, f2fs, tmpfs,
//!   overlayfs), and no mount point below the root is crossed (`RESOLVE_NO_XDEV`): opening a file
//!   on NFS or FUSE talks to a server even when the lookup is cached.
//!
//! The blocking path opens files the same way first, without `RESOLVE_CACHED`
//! ([`Root::open_file_waiting`]), and resolves the path by hand only where that does not decide.

use std::ffi::CString;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::{ByteRange, ObjectMeta, StoreError, StoreKey, resolve_range};

/// What a read that must not wait found.
#[derive(Debug)]
pub enum NonBlocking<T> {
    /// Decided without waiting.
    Done(T),
    /// Deciding would wait (or is not certain here): use the blocking path.
    WouldBlock,
}

/// A local root whose files can be read without waiting.
#[derive(Debug)]
pub(crate) struct Root {
    /// The canonical root path.
    #[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
    path: CString,
    /// Set when the filesystem refuses reads that do not wait, so that none are tried again.
    #[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
    reads_refused: AtomicBool,
}

/// A read that gave an object's metadata and the range of it that is in the buffer.
pub type Read = Option<(ObjectMeta, Range<u64>)>;

impl Root {
    /// For a canonical root directory: `None` where reads that do not wait are not available
    /// (another platform, a kernel without `openat2` and `RESOLVE_CACHED`, a filesystem that is
    /// not a local disk).
    pub fn open(root: &Path) -> Option<Self> {
        let path = CString::new(root.as_os_str().as_encoded_bytes()).ok()?;
        imp::usable(&path).then_some(Self {
            path,
            reads_refused: AtomicBool::new(false),
        })
    }

    /// Opens `key`, with the metadata of the regular file it names; `Done(None)` when nothing
    /// by that name exists, or it is no regular file.
    pub fn open_file(&self, key: &StoreKey) -> NonBlocking<Option<(ObjectMeta, File)>> {
        self.open_file_with(key, false)
    }

    /// [`Self::open_file`] for the blocking pool: lookups may wait for the disk. One call
    /// resolves the path in the kernel, where resolving it by hand (`realpath`: a `readlink` per
    /// component) and opening it took nine. `WouldBlock` still means undecided here (a symlink
    /// out of the root or an absolute one, a mount point): the caller resolves the path itself.
    pub fn open_file_waiting(&self, key: &StoreKey) -> NonBlocking<Option<(ObjectMeta, File)>> {
        self.open_file_with(key, true)
    }

    fn open_file_with(&self, key: &StoreKey, wait: bool) -> NonBlocking<Option<(ObjectMeta, File)>> {
        let file = match imp::open_beneath(self, key.as_str(), wait) {
            NonBlocking::Done(Some(file)) => file,
            NonBlocking::Done(None) => return NonBlocking::Done(None),
            NonBlocking::WouldBlock => return NonBlocking::WouldBlock,
        };
        match file.metadata() {
            Ok(m) if m.is_file() => NonBlocking::Done(Some((super::local::local_meta(&m), file))),
            Ok(_) => NonBlocking::Done(None),
            Err(_) => NonBlocking::WouldBlock,
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
    ) -> NonBlocking<Result<Read, StoreError>> {
        if self.reads_refused.load(std::sync::atomic::Ordering::Relaxed) {
            return NonBlocking::WouldBlock;
        }
        let (meta, file) = match self.open_file(key) {
            NonBlocking::Done(Some(found)) => found,
            NonBlocking::Done(None) => return NonBlocking::Done(Ok(None)),
            NonBlocking::WouldBlock => return NonBlocking::WouldBlock,
        };
        let range = match resolve_range(range, meta.size) {
            Ok(r) => r,
            Err(e) => return NonBlocking::Done(Err(e)),
        };
        let Some(want) = Some(range.end - range.start)
            .filter(|n| *n <= max)
            .and_then(|n| usize::try_from(n).ok())
        else {
            return NonBlocking::WouldBlock;
        };
        buf.clear();
        if buf.try_reserve(want).is_err() {
            return NonBlocking::WouldBlock;
        }
        match imp::read_at(self, &file, buf, want, range.start) {
            NonBlocking::Done(()) if buf.len() == want => NonBlocking::Done(Ok(Some((meta, range)))),
            // Short (the file shrank since its metadata was read) or not in memory.
            _ => NonBlocking::WouldBlock,
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::ffi::{CStr, CString};
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd, RawFd};
    use std::sync::atomic::Ordering;

    use super::{NonBlocking, Root};

    /// Filesystems whose opens and metadata never leave the machine.
    const LOCAL: [libc::c_long; 6] = [
        libc::EXT4_SUPER_MAGIC, // also ext2 and ext3
        libc::XFS_SUPER_MAGIC,
        libc::BTRFS_SUPER_MAGIC,
        libc::F2FS_SUPER_MAGIC,
        libc::TMPFS_MAGIC,
        libc::OVERLAYFS_SUPER_MAGIC,
    ];

    /// `openat2(dir, path, flags, resolve)`: the new descriptor, or the error number.
    fn openat2(dir: RawFd, path: &CStr, flags: libc::c_int, resolve: u64) -> Result<File, i32> {
        // SAFETY: `open_how` is a plain C struct of integers; all zero is its empty value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.resolve = resolve;
        // SAFETY: the arguments are a directory descriptor (or AT_FDCWD), a NUL-terminated path
        // and a pointer to `how` with its size, as openat2(2) takes them; nothing is kept after
        // the call returns.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                &raw const how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let fd = RawFd::try_from(fd).map_err(|_| 0)?;
        // SAFETY: openat2 returned a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Opens the root directory by its path (a path only, no reading), if the lookup is cached.
    /// The path is canonical: a symlink on it means the root (or a parent) was replaced by one
    /// since, where the blocking path, which checks canonical paths, serves nothing; so does
    /// this one (ELOOP: the blocking path decides).
    fn open_root(root: &Root, wait: bool) -> Result<File, i32> {
        openat2(
            libc::AT_FDCWD,
            &root.path,
            libc::O_PATH | libc::O_DIRECTORY,
            libc::RESOLVE_NO_SYMLINKS | cached(wait),
        )
    }

    /// `RESOLVE_CACHED` unless the caller may `wait` for lookups.
    fn cached(wait: bool) -> u64 {
        if wait { 0 } else { libc::RESOLVE_CACHED }
    }

    /// Whether the kernel offers cached lookups and the root is on a local disk filesystem.
    pub fn usable(path: &CStr) -> bool {
        let probe = Root {
            path: CString::from(path),
            reads_refused: Default::default(),
        };
        // Anything but these means the call and its flags exist (EAGAIN: not cached yet).
        if matches!(open_root(&probe, false), Err(libc::ENOSYS | libc::EINVAL | libc::EPERM)) {
            return false;
        }
        // SAFETY: `statfs` is a plain C struct that the call fills in.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a pointer to a `statfs` to fill.
        if unsafe { libc::statfs(path.as_ptr(), &raw mut fs) } != 0 {
            return false;
        }
        LOCAL.contains(&fs.f_type)
    }

    /// Opens `key` (relative, already checked by [`crate::store::StoreKey`]) below the root,
    /// following symlinks only where they stay below it and on its filesystem, if no lookup has
    /// to wait (or if the caller may `wait`).
    pub fn open_beneath(root: &Root, key: &str, wait: bool) -> NonBlocking<Option<File>> {
        let Ok(path) = CString::new(key) else {
            return NonBlocking::WouldBlock;
        };
        let Ok(dir) = open_root(root, wait) else {
            return NonBlocking::WouldBlock;
        };
        // Non-blocking, as on the blocking path: opening a FIFO must not wait for a writer.
        let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_XDEV | libc::RESOLVE_NO_MAGICLINKS | cached(wait);
        match openat2(dir.as_raw_fd(), &path, libc::O_RDONLY | libc::O_NONBLOCK, resolve) {
            Ok(file) => NonBlocking::Done(Some(file)),
            // Nothing by that name (a cached negative lookup), or a file in the way.
            Err(libc::ENOENT | libc::ENOTDIR) => NonBlocking::Done(None),
            // EAGAIN (not cached, or a symlink whose access time needs updating), EXDEV (a
            // symlink out of the root or an absolute one, which may still point inside it, or a
            // mount point), ELOOP, and the rest: the blocking path decides.
            Err(_) => NonBlocking::WouldBlock,
        }
    }

    /// Appends `want` bytes of `file` from `offset` to `buf` (which has room for them) as far as
    /// the page cache holds them; `WouldBlock` when a read would wait for the disk.
    pub fn read_at(root: &Root, file: &File, buf: &mut Vec<u8>, want: usize, offset: u64) -> NonBlocking<()> {
        let start = buf.len();
        while buf.len() - start < want {
            let done = buf.len() - start;
            let spare = &mut buf.spare_capacity_mut()[..want - done];
            let iov = libc::iovec {
                iov_base: spare.as_mut_ptr().cast(),
                iov_len: spare.len(),
            };
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                return NonBlocking::WouldBlock;
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
                    // The filesystem (all of it: no mount point is crossed) refuses such reads.
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
                        root.reads_refused.store(true, Ordering::Relaxed);
                    }
                    return NonBlocking::WouldBlock;
                }
            }
        }
        NonBlocking::Done(())
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    use std::ffi::CStr;
    use std::fs::File;

    use super::{NonBlocking, Root};

    pub fn usable(_: &CStr) -> bool {
        false
    }

    pub fn open_beneath(_: &Root, _: &str, _: bool) -> NonBlocking<Option<File>> {
        NonBlocking::WouldBlock
    }

    pub fn read_at(_: &Root, _: &File, _: &mut Vec<u8>, _: usize, _: u64) -> NonBlocking<()> {
        NonBlocking::WouldBlock
    }
}

#[cfg(test)]
pub(in crate::store) mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    fn key(k: &str) -> StoreKey {
        StoreKey::new(k).unwrap()
    }

    /// What the blocking path reads: the bytes of the file and its metadata.
    fn blocking(path: &Path, range: Range<usize>) -> (Vec<u8>, ObjectMeta) {
        let bytes = std::fs::read(path).unwrap();
        let meta = super::super::local::local_meta(&std::fs::metadata(path).unwrap());
        (bytes[range].to_vec(), meta)
    }

    /// The bytes read, the object's metadata and the range read.
    type Found = (Vec<u8>, ObjectMeta, Range<u64>);

    /// Reads with [`Root::read`]; `None` when it left the read to the blocking path.
    fn read(root: &Root, k: &str, range: Option<ByteRange>, max: u64) -> Option<Result<Option<Found>, StoreError>> {
        let mut buf = b"old bytes".to_vec();
        match root.read(&key(k), range, max, &mut buf) {
            NonBlocking::Done(read) => Some(read.map(|found| found.map(|(meta, range)| (buf, meta, range)))),
            NonBlocking::WouldBlock => None,
        }
    }

    /// A temporary root (canonical) holding `a/b/c` (100,000 bytes), `empty` and (on Unix) a
    /// symlink `alias` to `a/b/c`, and the root for reads that do not wait where this machine
    /// has them.
    fn tree() -> (tempfile::TempDir, std::path::PathBuf, Option<Root>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let root_path = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root_path.join("a/b")).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(root_path.join("a/b/c"), &data).unwrap();
        std::fs::write(root_path.join("empty"), b"").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("a/b/c", root_path.join("alias")).unwrap();
        let root = Root::open(&root_path);
        (dir, root_path, root, data)
    }

    /// Where the fast path is available, a regular file just written (in memory) is read by it,
    /// and equals what the blocking path reads, range by range.
    #[test]
    fn files_in_memory_read_as_the_blocking_path_reads_them() {
        let (_dir, root_path, root, _) = tree();
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
                    // A symlink may be left to the blocking path (following it can need its
                    // access time updated); a regular file only where the filesystem refuses
                    // reads that do not wait.
                    None => assert!(
                        name == "alias" || root.reads_refused.load(Ordering::Relaxed),
                        "{name} {range:?} was not read"
                    ),
                }
            }
        }
        if root.reads_refused.load(Ordering::Relaxed) {
            return;
        }
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

    /// Directories are decided here (no regular file); names that do not exist are decided
    /// here or left (a filesystem may not cache failed lookups), never found.
    #[test]
    fn what_is_no_regular_file_is_not_found() {
        let (_dir, root_path, root, _) = tree();
        let Some(root) = root else { return };
        for dir in ["a", "a/b"] {
            assert!(root_path.join(dir).is_dir());
            assert!(matches!(root.open_file(&key(dir)), NonBlocking::Done(None)), "{dir}");
        }
        for missing in ["nope", "a/nope", "a/b/c/d"] {
            assert!(!root_path.join(missing).exists());
            assert!(
                matches!(
                    root.open_file(&key(missing)),
                    NonBlocking::Done(None) | NonBlocking::WouldBlock
                ),
                "{missing}"
            );
        }
    }

    /// A root directory replaced while the server runs: its new files are read, not the old
    /// directory's (the root is looked up by its path, as the blocking path does).
    #[test]
    fn a_replaced_root_is_read_anew() {
        let (_dir, root_path, root, data) = tree();
        let Some(root) = root else { return };
        let first = read(&root, "a/b/c", None, 1 << 20);
        let name = root_path.file_name().unwrap().to_string_lossy().into_owned();
        let old = root_path.with_file_name(format!("{name}-old"));
        std::fs::rename(&root_path, &old).unwrap();
        std::fs::create_dir_all(root_path.join("a/b")).unwrap();
        std::fs::write(root_path.join("a/b/c"), b"new").unwrap();
        match first {
            Some(found) => assert_eq!(found.unwrap().unwrap().0, data),
            None => assert!(!expected(), "the first file was not read"),
        }
        match read(&root, "a/b/c", None, 1 << 20) {
            Some(found) => assert_eq!(found.unwrap().unwrap().0, b"new"),
            None => assert!(!expected(), "the new file was not read"),
        }
        std::fs::remove_dir_all(&root_path).unwrap();
        std::fs::create_dir_all(&root_path).unwrap();
        assert!(matches!(read(&root, "a/b/c", None, 1 << 20), Some(Ok(None)) | None));
        // Replaced by a symlink (to the old tree): not followed here; the blocking path, which
        // checks canonical paths, decides.
        std::fs::remove_dir_all(&root_path).unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&old, &root_path).unwrap();
            assert!(
                read(&root, "a/b/c", None, 1 << 20).is_none(),
                "served through a symlinked root"
            );
            std::fs::remove_file(&root_path).unwrap();
        }
        std::fs::remove_dir_all(&old).unwrap();
    }

    /// A canonical root `root` holding `sub/inside` ("inside"), next to `secret` ("secret"),
    /// with symlinks: `relative_in` and `absolute_in` to `sub/inside`, `sub/round_trip` out of
    /// the root and back to it, `relative_out` and `absolute_out` to `secret`, `proc` to
    /// `/proc/self/environ` and `loop` to itself. The temporary directory, and the root.
    #[cfg(unix)]
    pub(in crate::store) fn link_tree() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(base.join("secret"), b"secret").unwrap();
        std::fs::write(root.join("sub/inside"), b"inside").unwrap();
        for (target, name) in [
            (root.join("sub/inside"), "absolute_in"),
            ("sub/inside".into(), "relative_in"),
            ("../../root/sub/inside".into(), "sub/round_trip"),
            (base.join("secret"), "absolute_out"),
            ("../secret".into(), "relative_out"),
            ("/proc/self/environ".into(), "proc"),
            ("loop".into(), "loop"),
        ] {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        }
        (dir, root)
    }

    /// A symlink out of the root, or an absolute one, is never followed here: the blocking path
    /// decides (it serves absolute links that stay inside).
    #[cfg(unix)]
    #[test]
    fn symlinks_that_may_leave_the_root_are_left_to_the_blocking_path() {
        let (_dir, root_path) = link_tree();
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
            assert!(matches!(root.open_file(&key(name)), NonBlocking::WouldBlock), "{name}");
            assert!(
                matches!(root.open_file_waiting(&key(name)), NonBlocking::WouldBlock),
                "{name} was decided by the waiting open"
            );
        }
    }

    /// The open for the blocking pool decides files below the root, relative symlinks that
    /// stay below it, and names that resolve to nothing, as the canonical path would.
    #[test]
    fn the_waiting_open_decides_files_below_the_root_and_missing_names() {
        let (_dir, root_path, root, data) = tree();
        let Some(root) = root else { return };
        let names: &[&str] = if cfg!(unix) { &["a/b/c", "alias"] } else { &["a/b/c"] };
        for name in names {
            let NonBlocking::Done(Some((meta, mut file))) = root.open_file_waiting(&key(name)) else {
                panic!("{name} was not opened");
            };
            let (want, want_meta) = blocking(&root_path.join("a/b/c"), 0..data.len());
            assert_eq!(meta, want_meta, "{name}");
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut got).unwrap();
            assert_eq!(got, want, "{name}");
        }
        // Missing, under a file, and a directory (no key): nothing, decided here.
        for name in ["nothing", "a/b/c/under", "a/b"] {
            assert!(
                matches!(root.open_file_waiting(&key(name)), NonBlocking::Done(None)),
                "{name}"
            );
        }
    }

    /// Whether this machine is known to have the fast path (`.ci/run` sets
    /// `ZARRGATE_EXPECT_NOWAIT`: Linux 6 and ext4), so that the tests above cannot all skip.
    fn expected() -> bool {
        std::env::var_os("ZARRGATE_EXPECT_NOWAIT").is_some()
    }

    #[test]
    fn the_fast_path_is_available_where_expected() {
        let (_dir, _, root, _) = tree();
        if expected() {
            let root = root.expect("reads that do not wait are not available here");
            assert!(read(&root, "a/b/c", None, 1 << 20).is_some());
            assert!(!root.reads_refused.load(Ordering::Relaxed));
        }
    }
}
