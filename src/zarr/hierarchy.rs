//! Hierarchies: finding nodes, walking groups (by listing the store, concurrently, or from
//! consolidated metadata where the store cannot list), and rendering them as Zarr Object Model
//! JSON (ZEP0006) or as consolidated metadata.
//!
//! A node is what its stored metadata document says: v3 `zarr.json`; v2 `.zarray` / `.zgroup`
//! with `.zattrs` as `attributes`; v1 `meta` with `attrs`. v3 directories without `zarr.json`
//! are not nodes. Members of a group are nodes of the same format family (v1/v2 under v2).
//! Spec: <https://zarr.dev/zeps/draft/ZEP0006.html>

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Map, Value, json};

use crate::codec::chain::ArrayToBytes;
use crate::store::{Store, StoreError, StoreKey};

/// Errors of reading a hierarchy.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HierarchyError {
    /// A metadata document is not valid JSON (or not an object).
    #[error("metadata at '{key}' is invalid: {message}")]
    Invalid {
        /// The store key.
        key: String,
        /// What was wrong.
        message: String,
    },
    /// The store cannot list and has no consolidated metadata to go by.
    #[error("{0}")]
    CannotList(String),
    /// The hierarchy is larger or deeper than a walk may go.
    #[error("{0}")]
    TooLarge(String),
    /// The walks and listings under way hold all the memory they may ([`WALKS_MEMORY_BYTES`]):
    /// this one may be tried again later.
    #[error("{0}")]
    Busy(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One node's stored documents.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// 1, 2 or 3.
    pub zarr_format: u8,
    /// Whether it is a group.
    pub is_group: bool,
    /// The main document (`zarr.json`, `.zarray`, `.zgroup`, `meta`).
    pub doc: Map<String, Value>,
    /// The attributes document (v1 `attrs`, v2 `.zattrs`), if stored.
    pub attrs: Option<Map<String, Value>>,
}

/// A node with the members found below it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree {
    /// The node.
    pub node: Node,
    /// Members by name (empty for arrays and beyond the walked depth).
    pub members: BTreeMap<String, Tree>,
}

/// The most bytes of metadata documents one walk (or one listing) reads: past it the walk
/// stops with [`HierarchyError::TooLarge`]. With [`MAX_WALK_NODES`] it bounds the memory of a
/// walk (a tree holds about 2-4 times its documents' bytes), whatever the documents hold.
pub const MAX_WALK_DOCUMENT_BYTES: u64 = 128 << 20;

/// The memory all walks and listings under way may hold at once, as [`MemoryShare`] estimates
/// it: each is bounded on its own (its documents to [`MAX_WALK_DOCUMENT_BYTES`], about four
/// times that parsed: two such fit), but a few at once over large hierarchies held gigabytes.
/// Past it a walk stops as busy (503), to be tried again.
pub const WALKS_MEMORY_BYTES: u64 = 1 << 30;

/// The memory a parsed document holds, estimated from its bytes: a node's own fields plus
/// about four times its text (`serde_json` values of short keys and numbers).
fn parsed_bytes(len: u64) -> u64 {
    (super::NODE_BYTES as u64).saturating_add(len.saturating_mul(4))
}

/// Memory shared by the walks under way: what they hold, and the most they may.
#[derive(Debug)]
pub struct WalksMemory {
    holding: AtomicU64,
    limit: u64,
}

impl WalksMemory {
    /// A budget of `limit` bytes.
    pub const fn new(limit: u64) -> Self {
        WalksMemory {
            holding: AtomicU64::new(0),
            limit,
        }
    }

    /// Bytes held by the walks under way.
    pub fn holding(&self) -> u64 {
        self.holding.load(Ordering::Relaxed)
    }
}

/// The budget of every walk and listing of the process.
pub static WALKS_MEMORY: WalksMemory = WalksMemory::new(WALKS_MEMORY_BYTES);

/// One walk's part of a [`WalksMemory`], released when the walk is over.
#[derive(Debug)]
pub struct MemoryShare {
    of: &'static WalksMemory,
    held: AtomicU64,
    refused: std::sync::atomic::AtomicBool,
}

impl MemoryShare {
    /// A share of nothing yet.
    pub fn of(budget: &'static WalksMemory) -> Self {
        MemoryShare {
            of: budget,
            held: AtomicU64::new(0),
            refused: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Takes `bytes` more of the budget, or returns false (and remembers it) when they are not
    /// there.
    pub fn take(&self, bytes: u64) -> bool {
        let taken = self
            .of
            .holding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                h.checked_add(bytes).filter(|&total| total <= self.of.limit)
            })
            .is_ok();
        if taken {
            self.held.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.refused.store(true, Ordering::Relaxed);
        }
        taken
    }

    /// Whether a [`take`](Self::take) was refused.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for MemoryShare {
    fn drop(&mut self) {
        self.of.holding.fetch_sub(*self.held.get_mut(), Ordering::Relaxed);
    }
}

/// What one walk or listing has read so far: nodes visited, bytes of documents, and its share
/// of the memory of all walks ([`WALKS_MEMORY`]).
#[derive(Debug)]
pub struct Reads {
    nodes: AtomicUsize,
    bytes: AtomicU64,
    memory: MemoryShare,
}

impl Default for Reads {
    fn default() -> Self {
        Reads {
            nodes: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            memory: MemoryShare::of(&WALKS_MEMORY),
        }
    }
}

impl Reads {
    /// Whether a document of `len` bytes may be read, counting it if so.
    fn admit(&self, len: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |read| {
                read.checked_add(len).filter(|&total| total <= MAX_WALK_DOCUMENT_BYTES)
            })
            .is_ok()
            && self.memory.take(parsed_bytes(len))
    }
}

async fn json_object(
    store: &Store,
    key: &StoreKey,
    reads: &Reads,
) -> Result<Option<Map<String, Value>>, HierarchyError> {
    let bytes = match store.get_document_admitted(key, |len| reads.admit(len)).await? {
        None => return Ok(None),
        Some(Ok(bytes)) => bytes,
        Some(Err(_)) if reads.memory.refused() => {
            return Err(HierarchyError::Busy(format!(
                "the hierarchy walks under way hold {} MiB of metadata, all they may; try again later",
                WALKS_MEMORY_BYTES >> 20
            )));
        }
        Some(Err(_)) => {
            return Err(HierarchyError::TooLarge(format!(
                "the metadata documents of this hierarchy hold more than {} MiB; ask for a part \
                 of it (a path below; for ZOM, depth=N)",
                MAX_WALK_DOCUMENT_BYTES >> 20
            )));
        }
    };
    let invalid = |message: String| HierarchyError::Invalid {
        key: key.to_string(),
        message,
    };
    match super::parse_document_off(bytes, crate::json_text::NON_FINITE_JSON).await {
        Ok(Value::Object(o)) => Ok(Some(o)),
        // v1 stored `attrs` as a JSON string holding the JSON object.
        Ok(Value::String(s)) if key.name() == "attrs" => {
            match crate::json_text::parse_document(s.as_bytes(), crate::json_text::NON_FINITE_JSON) {
                Ok(Value::Object(o)) => Ok(Some(o)),
                _ => Err(invalid("not a JSON object".into())),
            }
        }
        Ok(_) => Err(invalid("not a JSON object".into())),
        Err(e) => Err(invalid(format!("not JSON: {e}"))),
    }
}

/// The node of a v3 `zarr.json` document; what is wrong with one that names another format or
/// node type, or whose attributes are no object (zarr-python refuses it).
fn v3(doc: Map<String, Value>) -> Result<Node, String> {
    if !super::format_is(&doc, 3) {
        return Err("zarr_format is not 3".into());
    }
    let is_group = match doc.get("node_type").and_then(Value::as_str) {
        Some("group") => true,
        Some("array") => false,
        _ => return Err("node_type is neither 'array' nor 'group'".into()),
    };
    // zarr-python reads null as no attributes.
    if doc.get("attributes").is_some_and(|a| !a.is_object() && !a.is_null()) {
        return Err("attributes is not a JSON object".into());
    }
    Ok(Node {
        zarr_format: 3,
        is_group,
        doc,
        attrs: None,
    })
}

/// The node a stored `zarr.json` describes, read as [`find_node`] reads it; `None` when it is
/// not a valid node's document.
pub fn v3_node(stored: &[u8]) -> Option<Node> {
    match crate::json_text::parse_document(stored, crate::json_text::NON_FINITE_JSON) {
        Ok(Value::Object(doc)) => v3(doc).ok(),
        _ => None,
    }
}

fn child(path: &StoreKey, name: &str) -> Result<StoreKey, HierarchyError> {
    path.join(name).map_err(|e| HierarchyError::Invalid {
        key: format!("{path}/{name}"),
        message: e.to_string(),
    })
}

/// Finds the node at `path`: v3, then v2, then v1. `None` when nothing is there.
/// `reads` counts the documents read, as part of a walk or listing.
pub async fn find_node(store: &Store, path: &StoreKey, reads: &Reads) -> Result<Option<Node>, HierarchyError> {
    if let Some(node) = find_v3(store, path, reads).await? {
        return Ok(Some(node));
    }
    if let Some(node) = find_v2(store, path, reads).await? {
        return Ok(Some(node));
    }
    find_v1(store, path, reads).await
}

/// The member at `path` of a group of `zarr_format`: a v3 group's members are v3 nodes, a v2
/// group's v2 nodes (v1 has no groups). Documents of the other formats there (a leftover
/// `.zarray`, a plain directory holding a file named `meta`) are not looked at.
async fn find_member(
    store: &Store,
    path: &StoreKey,
    zarr_format: u8,
    reads: &Reads,
) -> Result<Option<Node>, HierarchyError> {
    match zarr_format {
        3 => find_v3(store, path, reads).await,
        _ => find_v2(store, path, reads).await,
    }
}

async fn find_v3(store: &Store, path: &StoreKey, reads: &Reads) -> Result<Option<Node>, HierarchyError> {
    let key = child(path, "zarr.json")?;
    match json_object(store, &key, reads).await? {
        None => Ok(None),
        Some(doc) => v3(doc).map(Some).map_err(|message| HierarchyError::Invalid {
            key: key.to_string(),
            message,
        }),
    }
}

async fn find_v2(store: &Store, path: &StoreKey, reads: &Reads) -> Result<Option<Node>, HierarchyError> {
    let (zarray_key, zgroup_key) = (child(path, ".zarray")?, child(path, ".zgroup")?);
    let (zarray, zgroup) = futures::try_join!(
        json_object(store, &zarray_key, reads),
        json_object(store, &zgroup_key, reads)
    )?;
    let Some((doc, is_group)) = zarray.map(|d| (d, false)).or(zgroup.map(|d| (d, true))) else {
        return Ok(None);
    };
    if !super::format_is(&doc, 2) {
        return Err(HierarchyError::Invalid {
            key: if is_group { zgroup_key } else { zarray_key }.to_string(),
            message: "zarr_format is not 2".into(),
        });
    }
    let attrs = json_object(store, &child(path, ".zattrs")?, reads).await?;
    Ok(Some(Node {
        zarr_format: 2,
        is_group,
        doc,
        attrs,
    }))
}

async fn find_v1(store: &Store, path: &StoreKey, reads: &Reads) -> Result<Option<Node>, HierarchyError> {
    let meta = match json_object(store, &child(path, "meta")?, reads).await {
        // A `meta` that is no JSON object is some other file (a name plain directories use).
        Err(HierarchyError::Invalid { .. }) => None,
        other => other?,
    };
    if let Some(doc) = meta
        && doc.get("zarr_format").and_then(Value::as_u64) == Some(1)
    {
        let attrs = json_object(store, &child(path, "attrs")?, reads).await?;
        return Ok(Some(Node {
            zarr_format: 1,
            is_group: false,
            doc,
            attrs,
        }));
    }
    Ok(None)
}

/// How many member lookups run at once while walking.
const WALK_CONCURRENCY: usize = 32;
/// The most nodes one walk visits. A symlink back up a local tree makes the hierarchy
/// endless; a real one this large is better served by its own consolidated metadata.
pub const MAX_WALK_NODES: usize = 100_000;
/// The most levels of members one walk descends.
pub const MAX_WALK_DEPTH: u32 = 64;

/// Walks the hierarchy at `path` down to `depth` levels of members (`None`: all of them), up
/// to [`MAX_WALK_NODES`] nodes, [`MAX_WALK_DEPTH`] levels and [`MAX_WALK_DOCUMENT_BYTES`].
/// The node at `path` is read as `format` says: `None` takes v3, then v2, then v1 (its members
/// are of its format); `Some(2)` takes its v2 documents only, as a v2 client sees a group that
/// also has v3 metadata beside them (`zarr migrate v3` leaves both).
pub async fn walk(
    store: &Store,
    path: &StoreKey,
    depth: Option<u32>,
    format: Option<u8>,
) -> Result<Option<Tree>, HierarchyError> {
    let reads = Reads::default();
    let found = match format {
        Some(format) => find_member(store, path, format, &reads).await?,
        None => find_node(store, path, &reads).await?,
    };
    let Some(node) = found else {
        return Ok(None);
    };
    reads.nodes.store(1, Ordering::Relaxed);
    let members = if node.is_group && depth != Some(0) {
        members(store, path, &node, depth.map(|d| d - 1), 1, &reads).await?
    } else {
        BTreeMap::new()
    };
    Ok(Some(Tree { node, members }))
}

fn members<'a>(
    store: &'a Store,
    path: &'a StoreKey,
    node: &'a Node,
    depth: Option<u32>,
    level: u32,
    reads: &'a Reads,
) -> futures::future::BoxFuture<'a, Result<BTreeMap<String, Tree>, HierarchyError>> {
    Box::pin(async move {
        let listing = match store.list(path).await {
            Ok(l) => l,
            Err(StoreError::NotSupported(_)) => {
                return consolidated_members(store, path, node, depth, reads)
                    .await?
                    .ok_or_else(|| {
                        HierarchyError::CannotList(format!(
                            "this store cannot list '{path}' and the group has no consolidated metadata"
                        ))
                    });
            }
            // A listing refused (a public bucket that grants reads but not listing) or failing:
            // the group's consolidated metadata, where it has some, names its members all the
            // same; without it, the listing's error stands.
            Err(e @ (StoreError::Denied(_) | StoreError::Io(_))) => {
                return match consolidated_members(store, path, node, depth, reads).await {
                    Ok(Some(members)) => Ok(members),
                    _ => Err(e.into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        let found: Vec<Option<(String, Tree)>> = stream::iter(listing.prefixes)
            .map(|name| async move {
                if reads.nodes.fetch_add(1, Ordering::Relaxed) >= MAX_WALK_NODES {
                    return Err(HierarchyError::TooLarge(format!(
                        "the hierarchy has more than {MAX_WALK_NODES} nodes; ask for a part of it \
                         (a deeper path, or depth=N)"
                    )));
                }
                // A listed name that cannot be a key is not a member.
                let Ok(key) = child(path, &name) else {
                    return Ok(None);
                };
                let Some(child_node) = find_member(store, &key, node.zarr_format, reads).await? else {
                    return Ok(None);
                };
                if level > MAX_WALK_DEPTH {
                    return Err(HierarchyError::TooLarge(format!(
                        "'{key}' is more than {MAX_WALK_DEPTH} levels below the walk's start (a symlink loop?)"
                    )));
                }
                let members = if child_node.is_group && depth != Some(0) {
                    members(store, &key, &child_node, depth.map(|d| d - 1), level + 1, reads).await?
                } else {
                    BTreeMap::new()
                };
                Ok::<_, HierarchyError>(Some((
                    name,
                    Tree {
                        node: child_node,
                        members,
                    },
                )))
            })
            .buffer_unordered(WALK_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(found.into_iter().flatten().collect())
    })
}

/// Members of the group `node` at `path` from consolidated metadata, for stores that cannot
/// list: the group's own (`consolidated_metadata` in its `zarr.json`, or its `.zmetadata`), or
/// else that of the nearest ancestor that has some (writers consolidate at the root only).
async fn consolidated_members(
    store: &Store,
    path: &StoreKey,
    node: &Node,
    depth: Option<u32>,
    reads: &Reads,
) -> Result<Option<BTreeMap<String, Tree>>, HierarchyError> {
    let mut at_key = path.clone();
    loop {
        let tree = match node.zarr_format {
            3 if at_key == *path => tree_from_consolidated(node)?,
            3 => match find_node(store, &at_key, reads).await? {
                Some(n) if n.zarr_format == 3 && n.is_group => tree_from_consolidated(&n)?,
                _ => None,
            },
            _ => match json_object(store, &child(&at_key, ".zmetadata")?, reads).await? {
                Some(z) => tree_from_zmetadata(&Value::Object(z))?,
                None => None,
            },
        };
        if let Some(tree) = tree {
            let relative = path.as_str()[at_key.as_str().len()..].trim_start_matches('/');
            let mut at = &tree;
            for name in relative.split('/').filter(|n| !n.is_empty()) {
                match at.members.get(name) {
                    Some(next) => at = next,
                    None => return Ok(None), // consolidated without this group
                }
            }
            return Ok(Some(match depth {
                Some(d) => pruned(at, d.saturating_add(1)).members,
                None => at.members.clone(),
            }));
        }
        if at_key.is_root() {
            return Ok(None);
        }
        at_key = at_key.parent();
    }
}

/// The tree a v3 group's own `consolidated_metadata` describes (v2 groups use their
/// `.zmetadata`, through [`tree_from_zmetadata`]). `None` when it has none (`null` included).
fn tree_from_consolidated(node: &Node) -> Result<Option<Tree>, HierarchyError> {
    let Some(metadata) = node
        .doc
        .get("consolidated_metadata")
        .and_then(|c| c.get("metadata"))
        .and_then(Value::as_object)
    else {
        return Ok(None);
    };
    let mut tree = Consolidated::new(node.clone());
    let mut keys: Vec<&String> = metadata.keys().collect();
    parents_first(&mut keys);
    for key in keys {
        let Some(Value::Object(doc)) = metadata.get(key) else {
            continue;
        };
        let is_group = doc.get("node_type").and_then(Value::as_str) == Some("group");
        tree.insert(
            key,
            Node {
                zarr_format: 3,
                is_group,
                doc: doc.clone(),
                attrs: None,
            },
        )?;
    }
    Ok(Some(tree.root))
}

/// A tree built from a v2 `.zmetadata` document (for stores that cannot list); `None` when
/// the document describes no root group.
pub fn tree_from_zmetadata(zmetadata: &Value) -> Result<Option<Tree>, HierarchyError> {
    let Some(metadata) = zmetadata.get("metadata").and_then(Value::as_object) else {
        return Ok(None);
    };
    let doc = |k: &str| metadata.get(k).and_then(Value::as_object).cloned();
    let Some(root_doc) = doc(".zgroup") else {
        return Ok(None);
    };
    let mut tree = Consolidated::new(Node {
        zarr_format: 2,
        is_group: true,
        doc: root_doc,
        attrs: doc(".zattrs"),
    });
    let mut keys: Vec<&String> = metadata.keys().collect();
    parents_first(&mut keys);
    for key in keys {
        for (suffix, is_group) in [("/.zgroup", true), ("/.zarray", false)] {
            if let Some(path) = key.strip_suffix(suffix) {
                let Some(node_doc) = doc(key) else { continue };
                let attrs = doc(&format!("{path}/.zattrs"));
                tree.insert(
                    path,
                    Node {
                        zarr_format: 2,
                        is_group,
                        doc: node_doc,
                        attrs,
                    },
                )?;
            }
        }
    }
    Ok(Some(tree.root))
}

/// Orders metadata keys so that every node comes after its parent: by depth, then by name.
/// (By name alone, `g/-x/.zarray` sorts before `g/.zgroup`: `-` is below `.`.)
fn parents_first(keys: &mut [&String]) {
    keys.sort_by_key(|k| (k.matches('/').count(), *k));
}

/// A tree being built from consolidated metadata. The document is stored data like any other:
/// it gets the limits of a walk ([`MAX_WALK_NODES`], [`MAX_WALK_DEPTH`]), so that a crafted one
/// cannot make a tree too deep to render or drop without overflowing the stack.
struct Consolidated {
    root: Tree,
    nodes: usize,
}

impl Consolidated {
    fn new(node: Node) -> Self {
        Consolidated {
            root: Tree {
                node,
                members: BTreeMap::new(),
            },
            nodes: 1,
        }
    }

    /// Inserts a node at a relative `/`-separated path (parents must come first:
    /// [`parents_first`]). A path that cannot be a key, or whose parent is not a node, is not
    /// part of the hierarchy and is left out.
    fn insert(&mut self, path: &str, node: Node) -> Result<(), HierarchyError> {
        if path.is_empty() || StoreKey::new(path).is_err() {
            return Ok(());
        }
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (Some(parent), name),
            None => (None, path),
        };
        let mut at = &mut self.root;
        for step in parent.into_iter().flat_map(|p| p.split('/')) {
            match at.members.get_mut(step) {
                Some(next) => at = next,
                None => return Ok(()),
            }
        }
        let fresh = Tree {
            node,
            members: BTreeMap::new(),
        };
        if let Some(there) = at.members.get_mut(name) {
            *there = fresh; // `x/.zarray` beside `x/.zgroup`: one node
            return Ok(());
        }
        // Its parent is a node: the path is one level below a node the limits let in.
        if path.split('/').count() > MAX_WALK_DEPTH as usize {
            return Err(HierarchyError::TooLarge(format!(
                "consolidated metadata describes '{}/...', more than {MAX_WALK_DEPTH} levels deep",
                path.split('/').take(4).collect::<Vec<_>>().join("/")
            )));
        }
        if self.nodes >= MAX_WALK_NODES {
            return Err(HierarchyError::TooLarge(format!(
                "consolidated metadata describes more than {MAX_WALK_NODES} nodes; ask for a \
                 part of the hierarchy (a deeper path, or depth=N)"
            )));
        }
        at.members.insert(name.to_owned(), fresh);
        self.nodes += 1;
        Ok(())
    }
}

/// A copy of `tree` down to `depth` levels of members: only what is kept is copied (a cached
/// tree of 100,000 nodes asked at depth 0 copies one node).
pub fn pruned(tree: &Tree, depth: u32) -> Tree {
    Tree {
        node: tree.node.clone(),
        members: match depth {
            0 => BTreeMap::new(),
            d => tree
                .members
                .iter()
                .map(|(k, t)| (k.clone(), pruned(t, d - 1)))
                .collect(),
        },
    }
}

impl Node {
    /// Whether this v3 group's document holds consolidated metadata. zarr-python writes
    /// `"consolidated_metadata": null` into groups it has not consolidated: that is none.
    pub fn has_consolidated_metadata(&self) -> bool {
        self.doc.get("consolidated_metadata").is_some_and(|c| !c.is_null())
    }

    /// The ZOM fields of this node (without `members`): the stored document with `attributes`.
    /// A v3 group's `consolidated_metadata` is left out: `members` says the same, and the ZOM
    /// of a hierarchy does not depend on whether its store happens to be consolidated.
    pub fn zom(&self) -> Map<String, Value> {
        let mut out = self.doc.clone();
        match self.zarr_format {
            3 => {
                out.remove("consolidated_metadata");
                match out.get_mut("attributes") {
                    Some(a) if a.is_object() => {}
                    Some(a) => *a = json!({}),
                    None => {
                        out.insert("attributes".into(), json!({}));
                    }
                }
            }
            _ => {
                // zarr-python 3 writes an empty one into the .zgroup entries of .zmetadata.
                out.remove("consolidated_metadata");
                out.insert(
                    "attributes".into(),
                    Value::Object(self.attrs.clone().unwrap_or_default()),
                );
            }
        }
        out
    }

    /// Whether zarr-python (3.1) opens this node from consolidated metadata naming it: a v2
    /// group, a v3 group of the fields it knows, or an array whose document zarrgate's own
    /// parsers read (a codec it does not support may be zarr-python's) and whose data type,
    /// grid, chunk keys and codecs zarr-python knows. It fails to open a whole group whose
    /// consolidated metadata names one it does not, so such nodes (and what is below them) are
    /// left out of it, as zarr-python's own consolidation leaves out documents that do not
    /// parse; they are still served, and open by their path.
    fn opens(&self) -> bool {
        self.consolidated_doc_opens(&self.consolidated_doc())
    }

    /// The node's document as consolidated metadata holds it: as stored, but for the fill of a
    /// v2 `|S` / `<U` array stored as a number (zarr-python 2's default, 0), which is written
    /// as the text both zarr-python 2 and 3 read as the value zarr 2 reads
    /// ([`crate::dtype::fill::v2_numeric_string_fill`]). The stored `.zarray` stays as it is.
    pub fn consolidated_doc(&self) -> std::borrow::Cow<'_, Map<String, Value>> {
        if self.zarr_format != 2 || self.is_group {
            return std::borrow::Cow::Borrowed(&self.doc);
        }
        let dtype = self.doc.get("dtype");
        let text_fill = dtype
            .zip(self.doc.get("fill_value"))
            .and_then(|(dtype, fill)| crate::dtype::fill::v2_numeric_string_fill(dtype, fill));
        // A type spelt another way than NumPy's `dtype.str` ("int32", "i4"), which zarr 2 reads
        // as that type and zarr 3 refuses, is spelt as NumPy does.
        let spelling = match dtype {
            Some(Value::String(t)) => numpy_typestr(t).filter(|numpy| numpy != t),
            _ => None,
        };
        if text_fill.is_none() && spelling.is_none() {
            return std::borrow::Cow::Borrowed(&self.doc);
        }
        let mut doc = self.doc.clone();
        if let Some(fill) = text_fill {
            doc.insert("fill_value".into(), fill);
        }
        if let Some(spelling) = spelling {
            doc.insert("dtype".into(), Value::String(spelling));
        }
        std::borrow::Cow::Owned(doc)
    }

    fn consolidated_doc_opens(&self, doc: &Map<String, Value>) -> bool {
        if self.is_group {
            const GROUP_FIELDS: &[&str] = &["zarr_format", "node_type", "attributes", "consolidated_metadata"];
            return self.zarr_format != 3 || self.doc.keys().all(|k| GROUP_FIELDS.contains(&k.as_str()));
        }
        let mut doc = Value::Object(doc.clone());
        crate::json_text::unmark_non_finite(&mut doc);
        let parsed = match self.zarr_format {
            // An extension field it must understand: zarr-python refuses the array.
            3 if super::unknown_extension(&doc).is_some() => return false,
            3 => {
                let name = |field: &str| doc.pointer(field).and_then(Value::as_str);
                let dims = doc.get("dimension_names").and_then(Value::as_array).map(Vec::len);
                let ndim = doc.get("shape").and_then(Value::as_array).map(Vec::len);
                if !doc.get("data_type").is_some_and(|t| zarr_python_v3_type(t, false))
                    || !doc.get("codecs").is_some_and(zarr_python_v3_codecs)
                    || name("/chunk_grid/name") != Some("regular")
                    || !matches!(name("/chunk_key_encoding/name"), Some("default" | "v2"))
                    || dims.is_some_and(|d| Some(d) != ndim)
                {
                    return false;
                }
                super::parse_v3(&doc)
            }
            // Fields the v2 spec requires and zarr-python does not default (the parsing here
            // takes a missing order as "C" and fill value as null).
            2 if !zarr_python_v2_type(&doc) || doc.get("fill_value").is_none() || doc.get("order").is_none() => {
                return false;
            }
            2 => super::parse_v2(&doc, None),
            _ => return false,
        };
        match parsed {
            Err(super::MetaError::Invalid(_)) => false,
            // A chain without an array->bytes codec (ZEP0007 strings) zarr-python refuses.
            Ok(meta) => !matches!(meta.chain.array_to_bytes, ArrayToBytes::Zep0007 { .. }),
            Err(_) => true,
        }
    }
}

/// Whether zarr-python 3.1 knows the v3 data type `value` (its registry): the names of core
/// and variable-length types as strings, those with a configuration as objects, a structured
/// type's fields too (which cannot be variable-length: `in_structure`).
fn zarr_python_v3_type(value: &Value, in_structure: bool) -> bool {
    const PLAIN: &[&str] = &[
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ];
    const VARIABLE: &[&str] = &["string", "variable_length_bytes"];
    const CONFIGURED: &[&str] = &[
        "numpy.datetime64",
        "numpy.timedelta64",
        "fixed_length_utf32",
        "null_terminated_bytes",
        "raw_bytes",
        "structured",
    ];
    match value {
        Value::String(s) => PLAIN.contains(&s.as_str()) || (!in_structure && VARIABLE.contains(&s.as_str())),
        Value::Object(o) => match o.get("name").and_then(Value::as_str) {
            Some("structured") => value
                .pointer("/configuration/fields")
                .and_then(Value::as_array)
                .is_some_and(|fields| {
                    fields
                        .iter()
                        .all(|f| f.get(1).is_some_and(|t| zarr_python_v3_type(t, true)))
                }),
            Some(name) => CONFIGURED.contains(&name),
            None => false,
        },
        _ => false,
    }
}

/// Whether zarr-python 3.1 parses the configurations of the v3 codec list `codecs` (codecs it
/// does not know are its registry's business, and may be registered): a transpose's order must
/// be a list of axes (the older zarrita form `"F"` fails), inside shards too.
fn zarr_python_v3_codecs(codecs: &Value) -> bool {
    let Some(codecs) = codecs.as_array() else {
        return false;
    };
    codecs.iter().all(|codec| {
        let config = codec.get("configuration");
        match codec.get("name").and_then(Value::as_str) {
            Some("transpose") => config.and_then(|c| c.get("order")).is_some_and(Value::is_array),
            Some("sharding_indexed") => ["codecs", "index_codecs"]
                .iter()
                .all(|field| config.and_then(|c| c.get(*field)).is_none_or(zarr_python_v3_codecs)),
            _ => true,
        }
    })
}

/// Whether Python's `base64.standard_b64decode` decodes `text`: it drops the characters outside
/// the alphabet, and takes padded groups with any trailing bits.
fn python_base64(text: &str) -> bool {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='))
        .collect();
    base64::Engine::decode(&LENIENT, kept).is_ok()
}

/// The v2 data type `t` as NumPy's `dtype.str` spells it (`<i4` for `int32`, `i4` or `<i4`);
/// `None` for objects and what is not a data type here.
fn numpy_typestr(t: &str) -> Option<String> {
    if t == "|O" {
        return None;
    }
    let d = super::DType::from_v2(&Value::from(t)).ok()?;
    let canonical = d.typestr();
    Some(match canonical.strip_prefix('<') {
        Some(rest) if d.big_endian => format!(">{rest}"),
        _ => canonical.into_owned(),
    })
}

/// Whether zarr-python 3.1 knows the data type of the v2 array document `doc`: types spelt as
/// NumPy writes them (`dtype.str`: `<i4`, not `int32`, `i4` or `|i4`), objects only when the
/// first object codec among the filters and compressor is `vlen-utf8` or `vlen-bytes` and the
/// fill value is one zarr-python reads for it, structured types only of such plain fields (no
/// nested types, sub-arrays or objects).
fn zarr_python_v2_type(doc: &Value) -> bool {
    const OBJECT_CODECS: &[&str] = &[
        "vlen-utf8",
        "vlen-bytes",
        "vlen-array",
        "pickle",
        "json2",
        "msgpack2",
        "categorize",
    ];
    let numpy_spelling = |t: &str| numpy_typestr(t).is_some_and(|numpy| numpy == t);
    match doc.get("dtype") {
        Some(Value::String(t)) if t == "|O" => {
            let codecs = doc.get("filters").and_then(Value::as_array).into_iter().flatten();
            let first = codecs
                .chain(doc.get("compressor"))
                .filter_map(|c| c.get("id").and_then(Value::as_str))
                .find(|id| OBJECT_CODECS.contains(id));
            // The fill value of its type: zarr 2 wrote 0 for every object array by default,
            // which zarr-python 3 reads as text ("0") but refuses as bytes.
            match (first, doc.get("fill_value")) {
                (
                    Some("vlen-utf8"),
                    None | Some(Value::Null | Value::String(_) | Value::Number(_) | Value::Bool(_)),
                ) => true,
                (Some("vlen-bytes"), None | Some(Value::Null)) => true,
                (Some("vlen-bytes"), Some(Value::String(s))) => python_base64(s),
                _ => false,
            }
        }
        Some(Value::String(t)) => numpy_spelling(t),
        Some(Value::Array(fields)) => fields.iter().all(|f| {
            f.as_array()
                .is_some_and(|f| f.len() == 2 && f[1].as_str().is_some_and(numpy_spelling))
        }),
        _ => false,
    }
}

impl Tree {
    /// Nodes in the tree, this one included.
    pub fn node_count(&self) -> usize {
        1 + self.members.values().map(Tree::node_count).sum::<usize>()
    }

    /// About the bytes the tree holds in memory: 1 KiB a node besides its documents, and the
    /// documents (attributes can be megabytes) as they are parsed ([`super::parsed_weight`]).
    pub fn heap_weight(&self) -> usize {
        let own = super::NODE_BYTES
            .saturating_add(super::fields_weight(&self.node.doc))
            .saturating_add(self.node.attrs.as_ref().map_or(0, super::fields_weight));
        self.members
            .values()
            .fold(own, |n, t| n.saturating_add(t.heap_weight()))
    }

    /// ZOM JSON: the node's fields, and for groups `members` mapping names to nodes.
    pub fn zom(&self) -> Value {
        let mut out = self.node.zom();
        if self.node.is_group {
            let members: Map<String, Value> = self.members.iter().map(|(k, t)| (k.clone(), t.zom())).collect();
            out.insert("members".into(), Value::Object(members));
        }
        Value::Object(out)
    }

    /// The descendants zarr-python opens ([`Node::opens`]), below groups it opens, with their
    /// paths relative to this node, parents first.
    fn opening_descendants(&self) -> Vec<(String, &Tree)> {
        let mut out = Vec::new();
        for (name, t) in &self.members {
            if t.node.opens() {
                out.push((name.clone(), t));
                out.extend(
                    t.opening_descendants()
                        .into_iter()
                        .map(|(sub, d)| (format!("{name}/{sub}"), d)),
                );
            }
        }
        out
    }

    /// A v2 `.zmetadata` document for this (v2 group) tree.
    pub fn zmetadata(&self) -> Value {
        let mut metadata = Map::new();
        let mut add = |prefix: &str, node: &Node| {
            let name = if node.is_group { ".zgroup" } else { ".zarray" };
            metadata.insert(
                format!("{prefix}{name}"),
                Value::Object(node.consolidated_doc().into_owned()),
            );
            if let Some(attrs) = &node.attrs {
                metadata.insert(format!("{prefix}.zattrs"), Value::Object(attrs.clone()));
            }
        };
        add("", &self.node);
        for (path, t) in self.opening_descendants() {
            if t.node.zarr_format == 2 {
                add(&format!("{path}/"), &t.node);
            }
        }
        json!({"metadata": metadata, "zarr_consolidated_format": 1})
    }

    /// This (v3 group) node's `zarr.json`, `own` (the document as stored now, which may be
    /// newer than the walk), with `consolidated_metadata` describing every descendant that
    /// zarr-python opens ([`Node::opens`]), as zarr-python writes it: a group below holds an
    /// empty one (whatever it stores; its members are listed here). Stored fields of `own` are
    /// untouched.
    pub fn consolidated_zarr_json(&self, own: &Map<String, Value>) -> Value {
        let mut metadata = Map::new();
        for (path, t) in self.opening_descendants() {
            let mut doc = t.node.doc.clone();
            if t.node.is_group {
                doc.insert(
                    "consolidated_metadata".into(),
                    json!({"kind": "inline", "must_understand": false, "metadata": {}}),
                );
            }
            metadata.insert(path, Value::Object(doc));
        }
        let mut out = own.clone();
        out.insert(
            "consolidated_metadata".into(),
            json!({"kind": "inline", "must_understand": false, "metadata": metadata}),
        );
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(is_group: bool, fmt: u8, doc: Value) -> Node {
        Node {
            zarr_format: fmt,
            is_group,
            doc: doc.as_object().cloned().unwrap(),
            attrs: None,
        }
    }

    fn v2_array(dtype: Value) -> Value {
        json!({"zarr_format": 2, "shape": [1], "chunks": [1], "dtype": dtype, "compressor": null,
               "fill_value": null, "order": "C", "filters": null})
    }

    #[test]
    fn zmetadata_round_trips() {
        let mut built = Consolidated::new(node(true, 2, json!({"zarr_format": 2})));
        let mut arr = node(false, 2, v2_array(json!("<i4")));
        arr.attrs = Some(json!({"a": 1}).as_object().cloned().unwrap());
        built.insert("sub", node(true, 2, json!({"zarr_format": 2}))).unwrap();
        built.insert("sub/x", arr).unwrap();
        // Not part of the hierarchy: no parent node, or not a key.
        built
            .insert("none/y", node(true, 2, json!({"zarr_format": 2})))
            .unwrap();
        built
            .insert("sub/../x", node(true, 2, json!({"zarr_format": 2})))
            .unwrap();
        built
            .insert("sub//x", node(true, 2, json!({"zarr_format": 2})))
            .unwrap();
        assert_eq!(built.nodes, 3);
        let tree = built.root;
        assert_eq!(tree.node_count(), 3);
        let z = tree.zmetadata();
        assert_eq!(z["metadata"]["sub/x/.zarray"]["shape"], json!([1]));
        assert_eq!(z["metadata"]["sub/x/.zattrs"], json!({"a": 1}));
        assert_eq!(z["metadata"].as_object().unwrap().len(), 4);
        assert_eq!(tree_from_zmetadata(&z).unwrap().unwrap(), tree);
        let zom = tree.zom();
        assert_eq!(zom["members"]["sub"]["members"]["x"]["attributes"], json!({"a": 1}));
        assert_eq!(zom["attributes"], json!({}));
        let one = pruned(&tree, 1);
        assert_eq!(one.zom()["members"]["sub"]["members"], json!({}));
        assert_eq!(one.members["sub"].node, tree.members["sub"].node);
        assert!(pruned(&tree, 0).members.is_empty());
        assert_eq!(pruned(&tree, 5), tree);
    }

    #[test]
    fn members_whose_names_sort_before_dot_are_kept() {
        let z = json!({"zarr_consolidated_format": 1, "metadata": {
            ".zgroup": {"zarr_format": 2},
            "g/.zgroup": {"zarr_format": 2},
            "g/-x/.zarray": {"zarr_format": 2, "shape": [1]},
            "g/-x/.zattrs": {"a": 1},
            "g/+y/.zgroup": {"zarr_format": 2},
            "g/+y/z/.zarray": {"zarr_format": 2, "shape": [2]}
        }});
        let t = tree_from_zmetadata(&z).unwrap().unwrap();
        let g = &t.members["g"];
        assert_eq!(g.members.keys().collect::<Vec<_>>(), ["+y", "-x"]);
        assert_eq!(g.members["-x"].node.attrs, json!({"a": 1}).as_object().cloned());
        assert_eq!(g.members["+y"].members["z"].node.doc["shape"], json!([2]));
        // The same through a v3 group's consolidated metadata.
        let root = node(
            true,
            3,
            json!({"zarr_format": 3, "node_type": "group", "consolidated_metadata": {
                "kind": "inline", "must_understand": false, "metadata": {
                    "g": {"zarr_format": 3, "node_type": "group"},
                    "g/-x": {"zarr_format": 3, "node_type": "array", "shape": [1]}
                }
            }}),
        );
        let tree = tree_from_consolidated(&root).unwrap().unwrap();
        assert!(tree.members["g"].members.contains_key("-x"));
    }

    #[test]
    fn null_or_missing_consolidated_metadata_is_none() {
        let group = |doc: Value| node(true, 3, doc);
        let null = group(json!({"zarr_format": 3, "node_type": "group", "consolidated_metadata": null}));
        assert_eq!(tree_from_consolidated(&null).unwrap(), None);
        let absent = group(json!({"zarr_format": 3, "node_type": "group"}));
        assert_eq!(tree_from_consolidated(&absent).unwrap(), None);
        assert_eq!(tree_from_zmetadata(&json!({"metadata": {}})).unwrap(), None);
    }

    /// A chain of groups `g`, `g/g`, ... `levels` deep, as `.zmetadata`.
    fn chain(levels: usize) -> Value {
        let mut metadata = Map::new();
        metadata.insert(".zgroup".into(), json!({"zarr_format": 2}));
        for level in 1..=levels {
            metadata.insert(format!("{}.zgroup", "g/".repeat(level)), json!({"zarr_format": 2}));
        }
        json!({"metadata": metadata, "zarr_consolidated_format": 1})
    }

    #[test]
    fn consolidated_metadata_gets_the_limits_of_a_walk() {
        let deepest = tree_from_zmetadata(&chain(MAX_WALK_DEPTH as usize)).unwrap().unwrap();
        assert_eq!(deepest.node_count(), MAX_WALK_DEPTH as usize + 1);
        // One level more, as a crafted document could have thousands: refused, not recursed.
        let e = tree_from_zmetadata(&chain(MAX_WALK_DEPTH as usize + 1)).unwrap_err();
        assert!(
            matches!(&e, HierarchyError::TooLarge(m) if m.contains("levels deep")),
            "{e}"
        );
        let mut wide = Map::new();
        wide.insert(".zgroup".into(), json!({"zarr_format": 2}));
        for i in 0..MAX_WALK_NODES {
            wide.insert(format!("a{i}/.zarray"), json!({}));
        }
        let e = tree_from_zmetadata(&json!({"metadata": wide.clone()})).unwrap_err();
        assert!(
            matches!(&e, HierarchyError::TooLarge(m) if m.contains("100000 nodes")),
            "{e}"
        );
        wide.remove("a0/.zarray");
        // At the limit, what adds no node is no reason to refuse: a second document of a node,
        // an orphan however deep.
        wide.insert("a1/.zgroup".into(), json!({"zarr_format": 2}));
        wide.insert(format!("{}x/.zarray", "o/".repeat(100)), json!({}));
        let fits = tree_from_zmetadata(&json!({"metadata": wide})).unwrap().unwrap();
        assert_eq!(fits.node_count(), MAX_WALK_NODES);
    }
}
