//! `StoreKey::from_url_path` on arbitrary text: an accepted key has no empty, `.` or `..`
//! segment, no backslash and no NUL, and stays a valid key through `parent` and `join`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate::store::StoreKey;

fn check(key: &StoreKey, raw: &str) {
    let s = key.as_str();
    assert!(!s.contains('\\'), "backslash in {s:?} from {raw:?}");
    assert!(!s.contains('\0'), "NUL in {s:?} from {raw:?}");
    if !key.is_root() {
        for seg in s.split('/') {
            assert!(!seg.is_empty(), "empty segment in {s:?} from {raw:?}");
            assert!(seg != "." && seg != "..", "dot segment in {s:?} from {raw:?}");
        }
    }
    assert_eq!(key.segments().count(), if key.is_root() { 0 } else { s.split('/').count() });
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else { return };
    if let Ok((key, _dir)) = StoreKey::from_url_path(raw) {
        check(&key, raw);
        let parent = key.parent();
        check(&parent, raw);
        assert!(key.starts_with(&parent));
        assert_eq!(StoreKey::new(key.as_str()).as_ref(), Ok(&key), "a key re-checks as itself");
        if let Ok(joined) = parent.join(key.name()) {
            assert_eq!(joined, key, "parent + name is the key");
        }
    }
});
