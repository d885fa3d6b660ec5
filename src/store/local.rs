//! Local directories as stores: file metadata as the store reports it, which errors name no
//! file, and listings that stay below the root and leave loops out.

use std::path::Path as FsPath;

use super::{Listing, ObjectMeta, StoreError, StoreKey};

/// Metadata of a local file as the store reports it; the version changes with the inode,
/// modification time or size.
pub fn local_meta(m: &std::fs::Metadata) -> ObjectMeta {
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(m);
    #[cfg(not(unix))]
    let inode = 0u64;
    let mtime = m.modified().ok();
    let nanos = mtime
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    ObjectMeta {
        size: m.len(),
        last_modified: mtime,
        version: Some(format!("{inode:x}-{nanos:x}-{:x}", m.len())),
    }
}

/// Whether resolving a path failed because it names no file: missing, under a file, a name
/// too long for the filesystem, or a symlink loop. Those are 404s, not store errors.
pub fn names_nothing(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    if matches!(e.raw_os_error(), Some(libc::ENAMETOOLONG | libc::ELOOP)) {
        return true;
    }
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// The entries of directory `dir` below `root`, following symlinks that stay below `root`. An
/// entry that cannot be a key (a name that is not UTF-8 or not a valid key segment, a dangling
/// link, a link out of the root, a FIFO) is left out rather than failing the whole listing, and
/// so is a link to a directory on the way from `root` to `dir` (`dir` itself included, by the
/// real path of each step): a loop, which would make the hierarchy endless for every walk. A
/// walk that goes on for ever must come back to a directory it is in, and only through a link.
pub fn list_local(root: &FsPath, dir: &FsPath) -> Result<Listing, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if names_nothing(&e) => return Ok(Listing::default()),
        Err(e) => return Err(e.into()),
    };
    // Found at the first link listed.
    let mut on_the_way: Option<Vec<std::path::PathBuf>> = None;
    let mut listing = Listing::default();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if StoreKey::new(&name).is_err() {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            // Reads refuse what a link leads to outside the root: so does the listing.
            let Ok(real) = std::fs::canonicalize(entry.path()) else {
                continue;
            };
            if !real.starts_with(root)
                || on_the_way
                    .get_or_insert_with(|| real_paths_on_the_way(root, dir))
                    .contains(&real)
            {
                continue;
            }
        }
        match std::fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() => listing.prefixes.push(name),
            Ok(m) if m.is_file() => listing.objects.push(name),
            _ => {}
        }
    }
    listing.prefixes.sort();
    listing.objects.sort();
    Ok(listing)
}

/// The real paths of `dir` and of each directory above it, up to `root`.
fn real_paths_on_the_way(root: &FsPath, dir: &FsPath) -> Vec<std::path::PathBuf> {
    dir.ancestors()
        .take_while(|step| step.starts_with(root))
        .filter_map(|step| std::fs::canonicalize(step).ok())
        .collect()
}
