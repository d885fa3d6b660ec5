//! Versions of an Icechunk repository as URLs and the config name them: `branch.NAME`,
//! `tag.NAME`, `snapshot.ID`. A leaf, so that the config checks them without the stores.

use std::fmt;

use icechunk::format::SnapshotId;

/// A version of a repository, as URLs and the config name it: `branch.NAME`, `tag.NAME`,
/// `snapshot.ID`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Version {
    Branch(String),
    Tag(String),
    Snapshot(String),
}

impl Version {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (kind, name) = text.split_once('.').unwrap_or((text, ""));
        if name.is_empty() {
            return Err(format!(
                "'{text}' is not a version (branch.NAME, tag.NAME or snapshot.ID)"
            ));
        }
        match kind {
            "branch" => Ok(Version::Branch(name.to_owned())),
            "tag" => Ok(Version::Tag(name.to_owned())),
            "snapshot" => match SnapshotId::try_from(name) {
                Ok(_) => Ok(Version::Snapshot(name.to_owned())),
                Err(_) => Err(format!("'{name}' is not a snapshot id")),
            },
            _ => Err(format!(
                "'{text}' is not a version (branch.NAME, tag.NAME or snapshot.ID)"
            )),
        }
    }

    /// Whether what it names never changes: a snapshot (a tag may be deleted and made again).
    pub fn is_immutable(&self) -> bool {
        matches!(self, Version::Snapshot(_))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Branch(b) => write!(f, "branch.{b}"),
            Version::Tag(t) => write!(f, "tag.{t}"),
            Version::Snapshot(s) => write!(f, "snapshot.{s}"),
        }
    }
}
