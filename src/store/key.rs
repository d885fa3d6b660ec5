//! Store keys: the one place where untrusted paths become keys.
//!
//! A URL path is percent-decoded exactly once, then checked segment by segment. Nothing that
//! could step outside a mount (`.`/`..` segments, absolute paths, backslashes, NUL) survives,
//! so every backend can join a key under its root without further checks.

use std::fmt;
use std::sync::Arc;

use percent_encoding::percent_decode_str;

/// Why a path was refused as a store key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the path is not valid UTF-8 once percent-decoded")]
    NotUtf8,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("the path contains a backslash")]
    Backslash,
    #[error("the path contains a '.' or '..' segment")]
    DotSegment,
    #[error("the path is absolute or contains an empty segment")]
    EmptySegment,
    #[error("the path contains a control character")]
    Control,
}

/// A validated, relative key inside a store: `/`-separated, non-empty segments, none of them
/// `.` or `..`. The empty key is the store root.
///
/// Shared text: a key is cloned into each cache id a read looks up (two or three a chunk), and
/// a clone is a count, not an allocation and a copy.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StoreKey(Arc<str>);

impl StoreKey {
    /// The root of a store.
    pub fn root() -> Self {
        Self::default()
    }

    /// Checks an already-decoded key.
    pub fn new(key: &str) -> Result<Self, KeyError> {
        Self::check(key)?;
        Ok(Self(key.into()))
    }

    /// Refuses what [`StoreKey::new`] refuses.
    ///
    /// Every request's path comes through here. Refuses in this order: a NUL anywhere, a
    /// backslash anywhere, then the first bad segment (empty, `.` or `..`, or holding a control
    /// character).
    fn check(key: &str) -> Result<(), KeyError> {
        if key.is_empty() {
            return Ok(());
        }
        // Nearly every key holds no byte that could be refused in itself (a control byte, a
        // backslash, DEL, or 0xC2, which leads the C1 controls): then only its segments are
        // looked at, without the full pass's bookkeeping for every byte.
        let suspect = key
            .bytes()
            .fold(false, |s, b| s | (b < 0x20) | (b == b'\\') | (b == 0x7f) | (b == 0xc2));
        if !suspect {
            // Cut at a byte: splitting on a `char` sets up a search for each segment, more work
            // than the segments' few bytes.
            let bad = key
                .as_bytes()
                .split(|&b| b == b'/')
                .find_map(|segment| Self::bad_segment(segment, false));
            return bad.map_or(Ok(()), Err);
        }
        let (mut nul, mut backslash, mut bad) = (false, false, None);
        for segment in key.as_bytes().split(|&b| b == b'/') {
            let mut control = false;
            let mut previous = 0u8;
            for &b in segment {
                nul |= b == 0;
                backslash |= b == b'\\';
                // Unicode's control characters: U+0000-U+001F, U+007F, and U+0080-U+009F
                // (0xC2 0x80-0x9F in UTF-8; 0xC2 is only ever a lead byte).
                control |= b < 0x20 || b == 0x7f || (previous == 0xc2 && (0x80..=0x9f).contains(&b));
                previous = b;
            }
            if bad.is_none() {
                bad = Self::bad_segment(segment, control);
            }
        }
        match (nul, backslash, bad) {
            (true, _, _) => Err(KeyError::Nul),
            (_, true, _) => Err(KeyError::Backslash),
            (_, _, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// What is wrong with a segment in itself, if anything (`control`: it holds a control
    /// character).
    fn bad_segment(segment: &[u8], control: bool) -> Option<KeyError> {
        match segment {
            b"" => Some(KeyError::EmptySegment),
            b"." | b".." => Some(KeyError::DotSegment),
            _ if control => Some(KeyError::Control),
            _ => None,
        }
    }

    /// Decodes a raw URL path (the part after the mount name) once and checks it.
    ///
    /// Returns the key and whether the path ended with `/` (it then names a directory, which is
    /// never an object).
    pub fn from_url_path(raw: &str) -> Result<(Self, bool), KeyError> {
        // A path with no escape is its own decoding (and already UTF-8).
        let decoded = match raw.contains('%') {
            true => percent_decode_str(raw).decode_utf8().map_err(|_| KeyError::NotUtf8)?,
            false => raw.into(),
        };
        // `m//` (the path "/"): an empty segment, as in `m/a//b`, not the root with a slash.
        if decoded.starts_with('/') {
            return Err(KeyError::EmptySegment);
        }
        let (body, trailing_slash) = match decoded.strip_suffix('/') {
            Some(body) => (body, true),
            None => (&*decoded, false),
        };
        Ok((Self::new(body)?, trailing_slash))
    }

    /// The key as a `/`-separated string (empty for the root).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the store root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The key's segments.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The last segment (empty for the root).
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or("")
    }

    /// The parent key (the root is its own parent).
    pub fn parent(&self) -> Self {
        match self.0.rfind('/') {
            Some(i) => Self(self.0[..i].into()),
            None => Self::root(),
        }
    }

    /// A child key; `name` may itself hold several `/`-separated segments.
    pub fn join(&self, name: &str) -> Result<Self, KeyError> {
        if self.is_root() {
            Self::new(name)
        } else if name.is_empty() {
            Ok(self.clone())
        } else {
            // `self` is a key already: only `name` needs checking.
            Self::check(name)?;
            // The usual key is put together on the stack and copied once, into its `Arc`.
            use std::fmt::Write;
            let mut joined = crate::buffers::StackText::<256>::new();
            let parts = [&*self.0, "/", name];
            if parts.iter().all(|part| joined.write_str(part).is_ok()) {
                return Ok(Self(joined.as_str().into()));
            }
            let mut key = String::with_capacity(self.0.len() + 1 + name.len());
            key.push_str(&self.0);
            key.push('/');
            key.push_str(name);
            Ok(Self(key.into()))
        }
    }

    /// Whether `self` equals `prefix` or lies below it.
    pub fn starts_with(&self, prefix: &StoreKey) -> bool {
        prefix.is_root()
            || self.0 == prefix.0
            || (self.0.starts_with(&*prefix.0) && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }

    /// The part of `self` below `prefix`, if it lies below it.
    pub fn strip_prefix(&self, prefix: &StoreKey) -> Option<&str> {
        if prefix.is_root() {
            Some(&self.0)
        } else if self.0 == prefix.0 {
            Some("")
        } else {
            self.0.strip_prefix(&*prefix.0).and_then(|rest| rest.strip_prefix('/'))
        }
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreKey({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::{Component, Path};

    #[test]
    fn accepts_ordinary_keys() {
        let (k, dir) = StoreKey::from_url_path("a/b%20c/.zarray").unwrap();
        assert_eq!(k.as_str(), "a/b c/.zarray");
        assert!(!dir);
        let (k, dir) = StoreKey::from_url_path("group/").unwrap();
        assert_eq!(k.as_str(), "group");
        assert!(dir);
        assert_eq!(StoreKey::new("a/b/c").unwrap().parent().as_str(), "a/b");
        assert_eq!(StoreKey::new("a/b/c").unwrap().name(), "c");
        assert_eq!(StoreKey::new("a").unwrap().parent(), StoreKey::root());
    }

    #[test]
    fn rejects_escapes() {
        for bad in [
            "..",
            "../x",
            "a/../b",
            ".",
            "./a",
            "a/.",
            "%2e%2e/x",
            "%2E%2E",
            "a%2f..%2fb",
            "/etc/passwd",
            "%2fetc",
            "a//b",
            "/",
            "%2F",
            "a\\b",
            "a%5cb",
            "a%00b",
            "%ff",
        ] {
            assert!(StoreKey::from_url_path(bad).is_err(), "{bad} must be rejected");
        }
    }

    #[test]
    fn decodes_once() {
        // %252e is "%2e" after one decode: a literal name, not a dot segment.
        let (k, _) = StoreKey::from_url_path("%252e%252e").unwrap();
        assert_eq!(k.as_str(), "%2e%2e");
    }

    #[test]
    fn prefixes() {
        let a = StoreKey::new("a/b").unwrap();
        assert!(StoreKey::new("a/b/c").unwrap().starts_with(&a));
        assert!(!StoreKey::new("a/bc").unwrap().starts_with(&a));
        assert_eq!(StoreKey::new("a/b/c/d").unwrap().strip_prefix(&a), Some("c/d"));
        assert_eq!(StoreKey::new("a/bc").unwrap().strip_prefix(&a), None);
    }

    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("%2e%2e".to_string()),
            Just("%2E.".to_string()),
            Just("%2f".to_string()),
            Just("%5c".to_string()),
            Just("%00".to_string()),
            Just("\\".to_string()),
            Just("".to_string()),
            Just("%252e%252e".to_string()),
            "[a-z.%/]{0,6}",
            "\\PC{0,4}",
        ]
    }

    /// What `check` refuses, written plainly: its one pass must agree with this.
    fn check_plainly(key: &str) -> Result<(), KeyError> {
        if key.is_empty() {
            return Ok(());
        }
        if key.contains('\0') {
            return Err(KeyError::Nul);
        }
        if key.contains('\\') {
            return Err(KeyError::Backslash);
        }
        for segment in key.split('/') {
            match segment {
                "" => return Err(KeyError::EmptySegment),
                "." | ".." => return Err(KeyError::DotSegment),
                s if s.chars().any(char::is_control) => return Err(KeyError::Control),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every control character is refused, and no other character is.
    #[test]
    fn control_characters_are_exactly_unicodes() {
        for c in (0..0x800u32)
            .filter_map(char::from_u32)
            .chain(['\u{2028}', '\u{feff}', '\u{10ffff}'])
        {
            let key = format!("a/b{c}c");
            let refused = StoreKey::check(&key).is_err();
            assert_eq!(refused, c.is_control() || c == '\\', "{:?}", c);
            assert_eq!(StoreKey::check(&key), check_plainly(&key), "{c:?}");
        }
    }

    proptest! {
        /// The one-pass check refuses what the plain one does, with the same error.
        #[test]
        fn the_one_pass_check_is_the_plain_one(key in "[a./\\\\\u{0}\u{7f}\u{85}\u{9f}\u{a0}\u{c2}\u{100}]{0,8}") {
            prop_assert_eq!(StoreKey::check(&key), check_plainly(&key));
        }

        /// Whatever the URL path, an accepted key joined under a root stays under it lexically:
        /// no component of the joined path is `..`, a root or a prefix.
        #[test]
        fn no_key_escapes_the_root(parts in prop::collection::vec(segment(), 0..8), lead in any::<bool>()) {
            let raw = format!("{}{}", if lead { "/" } else { "" }, parts.join("/"));
            if let Ok((key, _)) = StoreKey::from_url_path(&raw) {
                let root = Path::new("/srv/root");
                let joined = root.join(key.as_str());
                prop_assert!(joined.starts_with(root));
                for c in Path::new(key.as_str()).components() {
                    prop_assert!(matches!(c, Component::Normal(_)), "component {:?} in {:?}", c, key);
                }
            }
        }
    }
}
