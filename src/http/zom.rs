//! Hierarchies over HTTP: `GET /api/v1/zom/{mount}[/{path}]?depth=N` (Zarr Object Model JSON,
//! ZEP0006), `GET /api/v1/list/{mount}[/{path}]` (the nodes in a directory, for browsing mounts
//! whose root is not a node), `GET /api/v1/zom-schema?zarr_format=2|3`,
//! `POST /api/v1/validate/{mount}[/{path}]`, and the consolidated metadata the raw-key route
//! synthesizes.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt, TryStreamExt, stream};
use serde_json::{Map, Value, json};

use super::{joined, own_task, query};
use crate::cache::{
    Caches, DETACHED_LOADS, Document, MAX_PENDING_WALKS, Rendered, WalkKey, Walked, Working, detach_working, fits,
    remembered,
};
use crate::error::ApiError;
use crate::state::{AppState, Mount};
use crate::store::{Store, StoreError, StoreKey};
use crate::zarr::hierarchy::{HierarchyError, Node, Reads, Tree, find_node, pruned, v3_node, walk};

/// Group documents larger than this are served as stored, never parsed for consolidation.
pub const MAX_GROUP_DOC: u64 = 1 << 20;

impl From<HierarchyError> for ApiError {
    fn from(e: HierarchyError) -> Self {
        match e {
            HierarchyError::Invalid { key, message } => {
                tracing::warn!(%key, %message, "invalid metadata");
                ApiError::invalid_metadata(key, &message)
            }
            HierarchyError::CannotList(m) => ApiError::Unsupported(m),
            HierarchyError::TooLarge(m) => ApiError::TooLarge(m),
            HierarchyError::Busy(m) => {
                tracing::warn!(%m, "walk refused");
                ApiError::Overloaded
            }
            HierarchyError::Store(s) => s.into(),
        }
    }
}

/// The whole hierarchy below `path` (cached; `None` when no node is there).
///
/// The walk runs in a task of its own, shared by every request for the hierarchy that comes
/// while it runs: a request that gives up waiting (its client went away, it timed out, or it
/// only waits a while: [`synthesis_tree`]) leaves it to finish and be cached for the next
/// request, rather than a large walk being started over by every request. What the walk found
/// is cached, and so is why it stopped when it would stop there again ([`remembered`]).
pub async fn tree(state: &AppState, mount: &Mount, path: &StoreKey) -> Result<Option<Arc<Tree>>, ApiError> {
    tree_as(state, mount, path, None).await
}

/// [`tree`], its node read as `format` says ([`walk`]).
async fn tree_as(
    state: &AppState,
    mount: &Mount,
    path: &StoreKey,
    format: Option<u8>,
) -> Result<Option<Arc<Tree>>, ApiError> {
    let key = (mount.cache_id.clone(), path.clone(), format);
    let caches = &state.caches;
    if let Some(walked) = caches.hierarchies.get(&key).await {
        caches.hierarchy_counters.record(false);
        return walked.map_err(ApiError::from);
    }
    let pending = {
        let mut walking = caches.walking.0.lock().unwrap_or_else(PoisonError::into_inner);
        match walking.get(&key) {
            Some(pending) => {
                caches.hierarchy_counters.record(false);
                pending.clone()
            }
            None if walking.len() >= MAX_PENDING_WALKS => return Err(ApiError::Overloaded),
            None => {
                caches.hierarchy_counters.record(true);
                let task = crate::workers::spawn(walk_and_cache(caches.clone(), mount.store.clone(), key.clone()));
                let failed = || Err(HierarchyError::Store(StoreError::Io("the walk's task failed".into())));
                let pending = async move { task.await.unwrap_or_else(|_| failed()) }.boxed().shared();
                // Inserted before the lock is let go: the task takes it to remove the walk.
                walking.insert(key, pending.clone());
                pending
            }
        }
    };
    pending.await.map_err(ApiError::from)
}

/// Walks the hierarchy at `key` with a permit ([`Caches::walks`]), caches what is
/// [`remembered`], and then (or when the task ends otherwise) removes the walk from those
/// under way.
async fn walk_and_cache(caches: Arc<Caches>, store: Store, key: WalkKey) -> Walked {
    struct Done(Arc<Caches>, WalkKey);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0
                .walking
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&self.1);
        }
    }
    let done = Done(caches, key);
    let walked = {
        let _permit = done.0.walks.acquire().await.ok();
        walk(&store, &done.1.1, None, done.1.2).await.map(|t| t.map(Arc::new))
    };
    // Weighing serializes the tree's documents.
    let weight = match &walked {
        Ok(Some(tree)) => tree_work(tree.clone(), |t| t.heap_weight()).await.unwrap_or(usize::MAX),
        _ => 0,
    };
    if remembered(&walked) && fits(&done.0.hierarchies, weight) {
        done.0.hierarchies.insert(done.1.clone(), walked.clone()).await;
    }
    // Large walks, and those stopped at the limits (the largest of all).
    let large = match &walked {
        Ok(Some(tree)) => tree.node_count() > TRIM_AFTER_NODES,
        Err(e) => matches!(e, HierarchyError::TooLarge(_)),
        Ok(None) => false,
    };
    if large {
        crate::workers::spawn_blocking(release_freed_memory);
    }
    walked
}

/// Walks of more nodes than this give the memory freed since back to the system.
const TRIM_AFTER_NODES: usize = 1000;

/// Gives memory the allocator holds free back to the system. glibc keeps what is freed in the
/// arena of the thread that allocated it, for that arena's reuse, and a walk's thousands of
/// small documents, read and parsed on whichever worker and blocking thread, leave it scattered
/// over many: repeated walks of a 10,000-node hierarchy too large for the cache held 2 GB
/// (0.5 GB with this after each; one walk at a time, 480 MB against 170 MB).
fn release_freed_memory() {
    // One trim at a time: a trim takes every arena's lock, and requests may ask for many.
    static TRIMMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if TRIMMING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only hands pages of free memory in glibc's arenas back to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    TRIMMING.store(false, std::sync::atomic::Ordering::Release);
}

/// The longest a raw-key request waits for a walk to synthesize consolidated metadata: a
/// quarter of the request timeout, at most 10 s. Clients open a hierarchy by asking for it,
/// and a missing `.zmetadata` (or a `zarr.json` as stored) answered at once serves them better
/// than a 504 after a minute; the walk goes on, and later requests get the consolidated one.
fn synthesis_wait(state: &AppState) -> Duration {
    let most = Duration::from_secs(10);
    Duration::try_from_secs_f64(state.config.limits.request_timeout_s / 4.0).map_or(most, |d| d.min(most))
}

/// [`tree_as`] for synthesizing consolidated metadata: `Unsupported` when the walk takes longer
/// than [`synthesis_wait`].
async fn synthesis_tree(
    state: &AppState,
    mount: &Mount,
    group: &StoreKey,
    format: Option<u8>,
) -> Result<Option<Arc<Tree>>, ApiError> {
    tokio::time::timeout(synthesis_wait(state), tree_as(state, mount, group, format))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::Unsupported(format!(
                "the hierarchy at '{group}' is still being walked"
            )))
        })
}

/// Runs `work` over `tree`: on the blocking pool for a tree of more than 100 nodes (rendering
/// or weighing thousands of documents would hold up the async worker), inline for a smaller one.
async fn tree_work<T: Send + 'static>(
    tree: Arc<Tree>,
    work: impl FnOnce(&Tree) -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if tree.node_count() > 100 {
        crate::workers::spawn_blocking(move || work(&tree)).await
    } else {
        Ok(work(&tree))
    }
}

/// The consolidated document of `tree` (the group at `group`): rendered once per walked tree
/// (and, for v3, per stored document of the group, `own`) and shared by every response until
/// either changes, rather than rendered per request (a 10,000-node hierarchy is megabytes of
/// JSON; concurrent clients opening it held a copy each).
async fn rendered(
    state: &AppState,
    mount: &Mount,
    group: &StoreKey,
    tree: Arc<Tree>,
    own: Option<Map<String, Value>>,
) -> Result<Bytes, ApiError> {
    let document = match own {
        Some(_) => Document::ZarrJson,
        None => Document::Zmetadata,
    };
    rendered_as(state, mount, group, tree, own, document).await
}

/// [`rendered`], of `document` (for the ZOM, `own` is `None`).
async fn rendered_as(
    state: &AppState,
    mount: &Mount,
    group: &StoreKey,
    tree: Arc<Tree>,
    own: Option<Map<String, Value>>,
    document: Document,
) -> Result<Bytes, ApiError> {
    let key = (mount.cache_id.clone(), group.clone(), document);
    let caches = state.caches.clone();
    if let Some(done) = caches.consolidated.get(&key).await
        && same_rendering(&done, &tree, own.as_ref())
    {
        caches.consolidated_counters.record(false);
        return Ok(done.bytes);
    }
    // Rendered in a task of its own: when this request goes while rendering, the rendering
    // runs on (one of the server's few orphaned loads) and the requests waiting for it, or the
    // next, take it rather than render again. A task that only waits is stopped with its request.
    let render = |working: Working| async move {
        // One rendering at a time per document and walked tree: the requests that missed
        // together (they waited for the same walk) take the one rendered first, from the cache
        // or, for a document too large for it, from the slot they share.
        let permit = caches.rendering.enter((key.clone(), Arc::as_ptr(&tree) as usize));
        let mut slot = permit.slot().ok_or(ApiError::Internal)?.lock().await;
        let done = match slot.as_ref() {
            Some(done) if same_rendering(done, &tree, own.as_ref()) => Some(done.clone()),
            _ => caches
                .consolidated
                .get(&key)
                .await
                .filter(|done| same_rendering(done, &tree, own.as_ref())),
        };
        if let Some(done) = done {
            caches.consolidated_counters.record(false);
            return Ok(done.bytes);
        }
        working.begin();
        caches.consolidated_counters.record(true);
        let own = own.map(Arc::new);
        let with = own.clone();
        let bytes = tree_work(tree.clone(), move |from| {
            let doc = match (&with, document) {
                (_, Document::Zom) => return Bytes::from(zom_of(from).to_string()),
                (Some(own), _) => from.consolidated_zarr_json(own),
                (None, _) => from.zmetadata(),
            };
            Bytes::from(crate::json_text::bare_non_finite(doc.to_string()))
        })
        .await
        .map_err(|_| ApiError::Internal)?;
        // Rendering a large tree allocated its JSON values, now freed, on the blocking pool's
        // threads: give that memory back, as after a large walk.
        if tree.node_count() > TRIM_AFTER_NODES {
            crate::workers::spawn_blocking(release_freed_memory);
        }
        let done = Rendered {
            from: Arc::downgrade(&tree),
            own,
            bytes: bytes.clone(),
        };
        *slot = Some(done.clone());
        if fits(&caches.consolidated, bytes.len()) {
            caches.consolidated.insert(key, done).await;
        }
        Ok(bytes)
    };
    detach_working(&DETACHED_LOADS, render)
        .await
        .map_err(|_| ApiError::Internal)?
}

/// Whether `done` was rendered from `tree` (and the group's stored document `own`).
fn same_rendering(done: &Rendered, tree: &Arc<Tree>, own: Option<&Map<String, Value>>) -> bool {
    std::sync::Weak::ptr_eq(&done.from, &Arc::downgrade(tree)) && done.own.as_deref() == own
}

/// A `.zmetadata` for the v2 group at `group`, if it is one.
pub async fn synthesized_zmetadata(
    state: &AppState,
    mount: &Mount,
    group: &StoreKey,
) -> Result<Option<Bytes>, ApiError> {
    let is_v2_group = |t: &Arc<Tree>| t.node.zarr_format == 2 && t.node.is_group;
    let tree = match synthesis_tree(state, mount, group, None).await? {
        Some(t) if is_v2_group(&t) => Some(t),
        // v3 metadata beside a v2 group's (`zarr migrate v3` leaves both): the v2 clients that
        // ask for `.zmetadata` see the v2 group, walked as such.
        Some(t) if t.node.zarr_format == 3 => synthesis_tree(state, mount, group, Some(2)).await?.filter(is_v2_group),
        _ => None,
    };
    match tree {
        Some(t) => rendered(state, mount, group, t, None).await.map(Some),
        None => Ok(None),
    }
}

/// The `zarr.json` of the v3 group at `group` with `consolidated_metadata`, if it is a group
/// whose stored document has none.
pub async fn synthesized_zarr_json(
    state: &AppState,
    mount: &Mount,
    group: &StoreKey,
    stored: &[u8],
) -> Result<Option<Bytes>, ApiError> {
    // The stored document first: arrays, already consolidated groups and documents that do not
    // parse are served as stored without walking anything.
    let stored = match v3_node(stored) {
        Some(n) if n.is_group && !n.has_consolidated_metadata() => n,
        _ => return Ok(None),
    };
    // The group's document as stored now goes into the consolidated one, so that a change to
    // it (new attributes, say) shows at once rather than when the hierarchy is walked again.
    match synthesis_tree(state, mount, group, None).await? {
        Some(t) => rendered(state, mount, group, t, Some(stored.doc)).await.map(Some),
        None => Ok(None),
    }
}

/// Splits `/api/v1/{route}/{mount}[/{path}]` into the mount and the decoded key.
async fn mount_and_path<'a>(
    state: &'a AppState,
    uri: &Uri,
    route: &str,
) -> Result<(std::borrow::Cow<'a, Mount>, StoreKey), ApiError> {
    let tail = uri.path().strip_prefix(route).unwrap_or("");
    let (name, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let mount = state.mount_at(name).await?;
    let (key, _) = StoreKey::from_url_path(rest)?;
    Ok((mount, key))
}

/// The hierarchy at `path` down to `depth` levels of members (`None`: all of them, walked and
/// cached whole), or a 404.
async fn zom_tree(state: &AppState, mount: &Mount, path: &StoreKey, depth: Option<u32>) -> Result<Arc<Tree>, ApiError> {
    let not_found = || ApiError::NotFound(format!("no Zarr node at '{path}' in mount '{}'", mount.name));
    let tree = match depth {
        None => tree(state, mount, path).await?.ok_or_else(not_found)?,
        Some(d) => {
            let cached = state
                .caches
                .hierarchies
                .get(&(mount.cache_id.clone(), path.clone(), None))
                .await;
            match cached {
                Some(Ok(Some(t))) => Arc::new(pruned(&t, d)),
                Some(Ok(None)) => return Err(not_found()),
                // Not walked yet, or too large as a whole: walk down to the depth asked, in a
                // walk permit as whole walks are (the request limit alone lets as many walks run
                // as requests).
                Some(Err(_)) | None => {
                    let _permit = state.caches.walks.acquire().await.ok();
                    let walked = walk(&mount.store, path, Some(d), None).await;
                    if matches!(walked, Err(HierarchyError::TooLarge(_))) {
                        crate::workers::spawn_blocking(release_freed_memory);
                    }
                    Arc::new(walked?.ok_or_else(not_found)?)
                }
            }
        }
    };
    Ok(tree)
}

/// The ZOM JSON of `tree`, its non-finite numbers as the strings slices use.
fn zom_of(tree: &Tree) -> Value {
    let mut zom = tree.zom();
    crate::json_text::unmark_non_finite(&mut zom);
    zom
}

/// `GET /api/v1/zom/{mount}[/{path}]?depth=N`
pub async fn zom(State(state): State<AppState>, uri: Uri) -> Result<Response, ApiError> {
    let [depth] = query(&uri, ["depth"])?;
    let depth = match depth.as_deref() {
        None | Some("") => None,
        Some(d) => Some(
            d.parse::<u32>()
                .map_err(|_| ApiError::BadRequest(format!("depth must be a non-negative integer, got '{d}'")))?,
        ),
    };
    own_task(async move {
        let (mount, path) = mount_and_path(&state, &uri, "/api/v1/zom/").await?;
        // A whole hierarchy's ZOM is rendered once per walked tree and shared, as consolidated
        // documents are: each request for 20,000 nodes built its own 85 MB of JSON values.
        let tree = zom_tree(&state, &mount, &path, depth).await?;
        if depth.is_none() {
            let bytes = rendered_as(&state, &mount, &path, tree, None, Document::Zom).await?;
            return Ok(([(header::CONTENT_TYPE, "application/json")], bytes).into_response());
        }
        let large = tree.node_count() > TRIM_AFTER_NODES;
        let zom = Json(zom_of(&tree)).into_response();
        drop(tree);
        if large {
            crate::workers::spawn_blocking(release_freed_memory);
        }
        Ok(zom)
    })
    .await
}

/// Listings run at once in the server ([`listing`]).
static LISTINGS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);

/// Children `/api/v1/list` describes at most: each is looked up in the store (a few reads), so
/// a directory of chunk rows would otherwise cost millions of reads for one request.
pub const MAX_LIST_CHILDREN: usize = 10_000;

/// A node `/api/v1/list` cannot describe, with why.
fn invalid(error: ApiError) -> Value {
    json!({"node_type": "invalid", "error": {"code": error.code(), "message": error.to_string()}})
}

/// How `/api/v1/list` describes what is at a path: a node, or `None`. A node whose metadata
/// does not parse (or is too large to read) is described as `invalid` with the error, rather
/// than failing the listing of everything beside it; store failures fail the request.
fn described(found: Result<Option<Node>, HierarchyError>) -> Result<Option<Value>, ApiError> {
    match found {
        Ok(node) => Ok(node
            .map(|n| json!({"zarr_format": n.zarr_format, "node_type": if n.is_group { "group" } else { "array" }}))),
        // Built here rather than through `ApiError::from`, which logs: a listing of thousands
        // of such nodes would log thousands of lines per request.
        Err(HierarchyError::Invalid { key, message }) => {
            tracing::debug!(%key, %message, "invalid metadata in a listing");
            Ok(Some(invalid(ApiError::invalid_metadata(key, &message))))
        }
        Err(HierarchyError::Store(e @ (StoreError::TooLarge { .. } | StoreError::TooManyValues { .. }))) => {
            Ok(Some(invalid(ApiError::TooLarge(e.to_string()))))
        }
        Err(e) => Err(e.into()),
    }
}

/// `GET /api/v1/list/{mount}[/{path}]`: the node at a path (if any) and the nodes and plain
/// directories below it.
pub async fn list(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, ApiError> {
    let [] = query(&uri, [])?;
    own_task(listing(state, uri)).await
}

async fn listing(state: AppState, uri: Uri) -> Result<Json<Value>, ApiError> {
    let (mount, path) = mount_and_path(&state, &uri, "/api/v1/list/").await?;
    // A listing reads up to thousands of documents: a few at once (not behind the whole
    // walks, which may run long), and within the walks' memory budget.
    let _permit = LISTINGS.acquire().await.map_err(|_| ApiError::Internal)?;
    // One bound on the documents read for the node and all it lists.
    let reads = Reads::default();
    let node = described(find_node(&mount.store, &path, &reads).await)?;
    let listing = mount.store.list(&path).await?;
    let nothing_below = listing.prefixes.is_empty() && listing.objects.is_empty();
    // An empty directory is what its parent's listing says it is: a directory there (a local
    // disk keeps empty ones; a bucket has no such thing).
    if node.is_none()
        && !path.is_root()
        && nothing_below
        && !(mount.store.reads_locally()
            && mount
                .store
                .list(&path.parent())
                .await?
                .prefixes
                .iter()
                .any(|p| p == path.name()))
    {
        return Err(ApiError::NotFound(format!(
            "nothing at '{}' in mount '{}'",
            path.as_str(),
            mount.name
        )));
    }
    if listing.prefixes.len() > MAX_LIST_CHILDREN {
        return Err(ApiError::TooLarge(format!(
            "'{}' holds {} directories; /api/v1/list describes at most {MAX_LIST_CHILDREN} (list a path below it)",
            path.as_str(),
            listing.prefixes.len()
        )));
    }
    let (store, reads) = (&mount.store, &reads);
    let children: Vec<Value> = stream::iter(listing.prefixes)
        .filter_map(|name| {
            // A name that cannot be a key (stores list what they hold) is not listed.
            let key = path.join(&name).ok();
            std::future::ready(key.map(|key| (name, key)))
        })
        .map(|(name, key)| async move {
            let mut entry =
                described(find_node(store, &key, reads).await)?.unwrap_or_else(|| json!({"node_type": "directory"}));
            entry["name"] = Value::from(name);
            Ok::<Value, ApiError>(entry)
        })
        .buffered(32)
        .try_collect()
        .await?;
    let mut listing = json!({
        "mount": mount.name,
        "path": path.as_str(),
        "node": node,
        "children": children,
    });
    crate::json_text::unmark_non_finite(&mut listing);
    Ok(Json(listing))
}

/// `GET /api/v1/zom-schema?zarr_format=2|3`: the JSON Schema of ZOM nodes of that version.
pub async fn zom_schema(uri: Uri) -> Result<Json<Value>, ApiError> {
    let [zarr_format] = query(&uri, ["zarr_format"])?;
    let text = match zarr_format.as_deref() {
        Some("2") => include_str!("../../schemas/zom-v2.json"),
        Some("3") | None => include_str!("../../schemas/zom-v3.json"),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "zarr_format must be 2 or 3, got '{other}'"
            )));
        }
    };
    serde_json::from_str(text).map(Json).map_err(|_| ApiError::Internal)
}

/// Subschemas a schema may apply to one place of the document, at most (see [`schema_fanout`]).
pub const MAX_SCHEMA_FANOUT: u64 = 1_000;
/// Validation errors reported, at most.
const MAX_VALIDATION_ERRORS: usize = 1000;
/// Bytes of one validation error's message, at most: a message shows the value it is about,
/// which may be the whole hierarchy (megabytes), and a small schema can fail it many times.
const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// `value` as text, cut (on a character boundary, marked with `…`) after `most` bytes; what is
/// past them is never written.
fn text_upto(value: &impl std::fmt::Display, most: usize) -> String {
    struct Upto {
        text: String,
        most: usize,
        cut: bool,
    }
    impl std::fmt::Write for Upto {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            if self.cut {
                return Err(std::fmt::Error);
            }
            let room = self.most - self.text.len();
            if s.len() <= room {
                self.text.push_str(s);
                return Ok(());
            }
            let end = (0..=room).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
            self.text.push_str(&s[..end]);
            self.cut = true;
            Err(std::fmt::Error)
        }
    }
    let mut out = Upto {
        text: String::new(),
        most,
        cut: false,
    };
    let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{value}"));
    if out.cut {
        out.text.push('…');
    }
    out.text
}
/// Validations run at once in the whole server.
static VALIDATIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// An upper bound of the subschemas `schema` applies to one place of a document: every
/// subschema counts, and a local `$ref` counts what it points to (each definition once, a
/// reference back into its own chain as 1). Validators do not share work between the branches
/// of `anyOf` / `oneOf` / `allOf`, so definitions that each refer twice to the one before take
/// twice as long each: 2 KB of them is 2^30 evaluations (18 levels took ~40 s here). The
/// schemas in `schemas/` apply 20-51; the limit lets 7 such levels through, and the work of a
/// document is that for each of its values.
pub fn schema_fanout(schema: &Value) -> u64 {
    fn walk<'a>(
        v: &'a Value,
        root: &'a Value,
        memo: &mut std::collections::HashMap<String, u64>,
        open: &mut Vec<String>,
    ) -> u64 {
        match v {
            Value::Object(map) => map.iter().fold(1u64, |n, (k, sub)| {
                let more = match (k.as_str(), sub) {
                    ("$defs" | "definitions", _) => 0,
                    ("$ref", Value::String(r)) => match r.strip_prefix('#') {
                        Some(pointer) if open.iter().any(|o| o == pointer) => 1,
                        Some(pointer) => match memo.get(pointer) {
                            Some(&c) => c,
                            None => {
                                let target = if pointer.is_empty() {
                                    Some(root)
                                } else {
                                    root.pointer(pointer)
                                };
                                open.push(pointer.to_string());
                                let c = target.map_or(1, |t| walk(t, root, memo, open));
                                open.pop();
                                memo.insert(pointer.to_string(), c);
                                c
                            }
                        },
                        None => 1,
                    },
                    _ => walk(sub, root, memo, open),
                };
                n.saturating_add(more)
            }),
            Value::Array(items) => items
                .iter()
                .fold(0u64, |n, sub| n.saturating_add(walk(sub, root, memo, open))),
            _ => 0,
        }
    }
    walk(schema, schema, &mut std::collections::HashMap::new(), &mut Vec::new())
}

/// Regular expressions one schema may hold, at most: each compiles to a program of up to
/// [`PATTERN_PROGRAM_BYTES`] and matches with a cache of up to [`PATTERN_CACHE_BYTES`], so
/// that a validation's memory stays within a few hundred MiB, whatever its patterns say.
pub const MAX_SCHEMA_PATTERNS: usize = 64;
/// The compiled program of one pattern, at most; a pattern whose program is larger (a nested
/// repetition such as `(.{1,100}){1,100}`) is a malformed schema.
pub const PATTERN_PROGRAM_BYTES: usize = 1 << 20;
/// The lazy DFA's cache of one pattern, at most (it falls back to slower matching beyond).
pub const PATTERN_CACHE_BYTES: usize = 1 << 20;
/// Backtracking steps of one match of a pattern that needs backtracking (look-around,
/// back-references), at most; past them the value fails to validate.
pub const PATTERN_BACKTRACKS: usize = 100_000;
/// Subschema applications one validation may make, at most (the schema's [`schema_fanout`]
/// times the values of the document): the work cannot be stopped once started, so it is
/// bounded before it starts.
pub const MAX_VALIDATION_STEPS: u64 = 500_000_000;

/// How many regular expressions `schema` holds: `pattern` strings and the keys of
/// `patternProperties`, wherever they stand (an over-count where a property is named
/// `pattern`, never an under-count).
pub fn schema_patterns(schema: &Value) -> usize {
    match schema {
        Value::Object(map) => map
            .iter()
            .map(|(k, sub)| match (k.as_str(), sub) {
                ("pattern", Value::String(_)) => 1,
                ("patternProperties", Value::Object(p)) => p.len().saturating_add(schema_patterns(sub)),
                _ => schema_patterns(sub),
            })
            .fold(0usize, usize::saturating_add),
        Value::Array(items) => items.iter().map(schema_patterns).fold(0usize, usize::saturating_add),
        _ => 0,
    }
}

/// The values of `document` (objects, arrays and scalars alike).
fn value_count(document: &Value) -> u64 {
    let mut count = 0u64;
    let mut open = vec![document];
    while let Some(v) = open.pop() {
        count += 1;
        match v {
            Value::Object(map) => open.extend(map.values()),
            Value::Array(items) => open.extend(items.iter()),
            _ => {}
        }
    }
    count
}

/// A validator of `schema` whose regular expressions are compiled within the limits above.
pub fn bounded_validator(schema: &Value) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex()
                .size_limit(PATTERN_PROGRAM_BYTES)
                .dfa_size_limit(PATTERN_CACHE_BYTES)
                .backtrack_limit(PATTERN_BACKTRACKS),
        )
        .build(schema)
}

/// `POST /api/v1/validate/{mount}[/{path}]` with a JSON Schema body: validates the node's ZOM
/// JSON against it. Validation runs on the blocking pool, one at a time in the server (a
/// schema can make it long, and it cannot be stopped once started), after a schema whose
/// [`schema_fanout`] passes [`MAX_SCHEMA_FANOUT`] is refused.
pub async fn validate(
    State(state): State<AppState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let [] = query(&uri, [])?;
    // axum's own answer to a body over its limit (2 MiB) is plain text: errors here are JSON.
    let body = body.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::TooLarge("the schema is larger than 2 MiB".into()),
        _ => ApiError::BadRequest(format!("cannot read the body: {}", e.body_text())),
    })?;
    let schema: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("the body is not a JSON Schema: {e}")))?;
    let fanout = schema_fanout(&schema);
    if fanout > MAX_SCHEMA_FANOUT {
        return Err(ApiError::BadRequest(format!(
            "the schema can apply {fanout} subschemas to one value (its references multiply); at most {MAX_SCHEMA_FANOUT} are validated"
        )));
    }
    let patterns = schema_patterns(&schema);
    if patterns > MAX_SCHEMA_PATTERNS {
        return Err(ApiError::BadRequest(format!(
            "the schema holds {patterns} regular expressions (pattern, patternProperties); at most {MAX_SCHEMA_PATTERNS} are compiled"
        )));
    }
    let (mount, path) = mount_and_path(&state, &uri, "/api/v1/validate/").await?;
    // Compiling a schema (its regular expressions above all) and validating are CPU work of
    // any length: both run on the blocking pool, one validation's at a time, and never on the
    // async workers that serve everything else. The permit goes with the work: a request that
    // times out or is dropped while its work runs on does not let another start beside it.
    let permit = VALIDATIONS.acquire().await.map_err(|_| ApiError::Internal)?;
    let validator = joined(
        crate::workers::spawn_blocking(move || {
            let _permit = permit;
            bounded_validator(&schema)
        })
        .await,
    )?
    .map_err(|e| ApiError::BadRequest(format!("malformed schema: {e}")))?;
    let zom = zom_of(&*zom_tree(&state, &mount, &path, None).await?);
    let values = value_count(&zom);
    if fanout.saturating_mul(values) > MAX_VALIDATION_STEPS {
        return Err(ApiError::TooLarge(format!(
            "validating {values} values against a schema that applies up to {fanout} subschemas to each is more than \
             {MAX_VALIDATION_STEPS} steps; validate a part of the hierarchy (a path below) or a smaller schema"
        )));
    }
    let permit = VALIDATIONS.acquire().await.map_err(|_| ApiError::Internal)?;
    let errors = crate::workers::spawn_blocking(move || {
        let _permit = permit;
        validator
            .iter_errors(&zom)
            .take(MAX_VALIDATION_ERRORS)
            .map(|e| {
                json!({
                    "path": e.instance_path().to_string(),
                    "message": text_upto(&e, MAX_ERROR_MESSAGE_BYTES),
                })
            })
            .collect::<Vec<Value>>()
    })
    .await;
    let errors = joined(errors)?;
    Ok(Json(json!({"valid": errors.is_empty(), "errors": errors})))
}
