//! Icechunk mounts (`format = "icechunk"`): each version of a repository (a branch's tip, a
//! tag, a snapshot) served as the plain Zarr v3 store it holds, read-only.
//!
//! The `icechunk` crate reads the repository's refs, snapshots and manifests; chunk bytes are
//! read here, as references are: native chunks from the repository's `chunks/` through the
//! mount's store (and its raw cache), virtual chunks below the mount's `virtual_prefixes`.
//! Spec: <https://icechunk.io/en/latest/spec/>

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::icechunk::format::manifest::{Checksum, ChunkPayload, SecondsSinceEpoch};
use ::icechunk::format::{ChunkIndices, Path, SnapshotId};
use ::icechunk::repository::VersionInfo;
use ::icechunk::session::{Session, SessionError, SessionErrorKind};
use async_trait::async_trait;
use futures::StreamExt;
use serde::Serialize;

use super::cached::{Freshness, RawCache};
use super::references::{Directories, Expected, Reference, Targets};
use super::{Backend, ByteRange, GetObject, Listing, ObjectMeta, Store, StoreError, StoreKey};
use crate::config::{MountConfig, MountSource, Remote};

/// Sessions (one per snapshot read) held at once; each keeps its snapshot's node table.
const SESSIONS_HELD: u64 = 64;

/// Snapshots listed per branch by [`Repository::versions`], newest first.
pub const SNAPSHOTS_LISTED: usize = 100;

/// Branches, and tags, listed by [`Repository::versions`].
pub const REFS_LISTED: usize = 1000;

/// Nodes of a snapshot listed ([`Backend::list`]); a larger snapshot's listing is refused.
pub const NODES_LISTED: usize = 1_000_000;

/// What icechunk's own caches may hold per repository, in its units: snapshot nodes and
/// manifest chunk references, sized from `cache.hierarchy_bytes` at these estimates of each.
const NODE_BYTES: u64 = 2048;
const CHUNK_REF_BYTES: u64 = 64;
/// icechunk's own defaults of those caches.
const ICECHUNK_SNAPSHOT_NODES: u64 = 500_000;
const ICECHUNK_CHUNK_REFS: u64 = 15_000_000;

pub use crate::version::Version;

/// What icechunk calls `version`; a snapshot id that does not parse names no version.
fn version_info(version: &Version) -> Result<VersionInfo, StoreError> {
    Ok(match version {
        Version::Branch(b) => VersionInfo::BranchTipRef(b.clone()),
        Version::Tag(t) => VersionInfo::TagRef(t.clone()),
        Version::Snapshot(id) => VersionInfo::SnapshotId(
            SnapshotId::try_from(id.as_str())
                .map_err(|_| StoreError::UnknownVersion(format!("no version {version}")))?,
        ),
    })
}

/// The repository as opened, or why it could not be (answered until the next try).
enum Opened {
    Repository(Arc<::icechunk::Repository>),
    Failed { error: StoreError, at: Instant },
}

/// An Icechunk repository, opened at its first request.
pub struct Repository {
    /// The mount's name, for messages.
    mount: Arc<str>,
    /// Where the repository is, and the settings to read it with.
    source: MountSource,
    config: MountConfig,
    /// Native chunks (`chunks/ID` in the repository's own store) and virtual ones.
    targets: Arc<Targets>,
    /// The version a request that names none reads (`mounts.NAME.version`).
    pub default_version: Version,
    /// How long a branch or tag is taken to point where it last did (`cache.ttl_seconds`).
    check_every: Duration,
    opened: tokio::sync::Mutex<Option<Opened>>,
    /// Snapshots of branches and tags, as last looked up.
    tips: moka::future::Cache<Version, SnapshotId>,
    sessions: moka::future::Cache<SnapshotId, Arc<SnapshotBackend>>,
    versions: moka::future::Cache<(), Arc<Versions>>,
    /// Bounds icechunk's caches of snapshots and manifests (`cache.hierarchy_bytes`).
    metadata_bytes: u64,
}

impl fmt::Debug for Repository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repository")
            .field("mount", &self.mount)
            .finish_non_exhaustive()
    }
}

/// A snapshot's id, and its store.
#[derive(Debug, Clone)]
pub struct AtVersion {
    pub snapshot: String,
    pub store: Store,
}

/// The error of an icechunk call, as a store error: what a missing ref or snapshot means is
/// an unknown version; what does not parse is corrupt data naming the repository.
fn repository_error(version: Option<&Version>, e: ::icechunk::repository::RepositoryError) -> StoreError {
    repository_error_kind(version, &e.kind)
}

fn repository_error_kind(version: Option<&Version>, kind: &::icechunk::repository::RepositoryErrorKind) -> StoreError {
    use ::icechunk::format::IcechunkFormatErrorKind;
    use ::icechunk::refs::RefErrorKind;
    use ::icechunk::repository::RepositoryErrorKind as K;
    let unknown = || match version {
        Some(v) => StoreError::UnknownVersion(format!("no version {v}")),
        None => StoreError::Io(kind.to_string()),
    };
    match kind {
        K::Ref(RefErrorKind::RefNotFound(_) | RefErrorKind::InvalidRefName(_) | RefErrorKind::InvalidRefType(_))
        | K::SnapshotNotFound { .. }
        | K::InvalidSnapshotId(_)
        | K::Tag(_)
        | K::FormatError(
            IcechunkFormatErrorKind::SnapshotIdNotFound { .. }
            | IcechunkFormatErrorKind::BranchNotFound { .. }
            | IcechunkFormatErrorKind::TagNotFound { .. },
        ) => unknown(),
        K::StorageError(s) | K::Ref(RefErrorKind::Storage(s)) => storage_error(s),
        K::RepositoryDoesntExist => StoreError::Corrupt {
            key: "repo".into(),
            message: "there is no Icechunk repository here".into(),
        },
        _ => StoreError::Corrupt {
            key: "repo".into(),
            message: kind.to_string(),
        },
    }
}

fn storage_error(e: &::icechunk::storage::StorageErrorKind) -> StoreError {
    use ::icechunk::storage::StorageErrorKind as S;
    match e {
        S::ObjectNotFound => StoreError::Corrupt {
            key: "repo".into(),
            message: "an object the repository names does not exist".into(),
        },
        other => StoreError::Io(other.to_string()),
    }
}

fn session_error(key: &StoreKey, e: SessionError) -> StoreError {
    match e.kind {
        SessionErrorKind::StorageError(s) => storage_error(&s),
        SessionErrorKind::RepositoryError(r) => repository_error_kind(None, &r),
        other => StoreError::Corrupt {
            key: key.as_str().to_owned(),
            message: other.to_string(),
        },
    }
}

impl Repository {
    /// The repository and its stores, opened by its first request.
    async fn repository(&self) -> Result<Arc<::icechunk::Repository>, StoreError> {
        let mut opened = self.opened.lock().await;
        match &*opened {
            Some(Opened::Repository(r)) => return Ok(r.clone()),
            Some(Opened::Failed { error, at }) if at.elapsed() < self.check_every => return Err(error.clone()),
            _ => {}
        }
        let result = match storage_of(&self.source, &self.config).await {
            Ok(storage) => ::icechunk::Repository::open(storage)
                .config(repository_config(self.metadata_bytes))
                .execute()
                .await
                .map(Arc::new)
                .map_err(|e| repository_error(None, e)),
            Err(message) => Err(StoreError::Io(message)),
        };
        *opened = Some(match &result {
            Ok(r) => Opened::Repository(r.clone()),
            Err(error) => {
                tracing::warn!(mount = %self.mount, %error, "cannot open the Icechunk repository");
                Opened::Failed {
                    error: error.clone(),
                    at: Instant::now(),
                }
            }
        });
        result
    }

    /// The snapshot `version` names now (a branch or tag as looked up within `check_every`).
    async fn snapshot_of(&self, version: &Version) -> Result<SnapshotId, StoreError> {
        let repository = self.repository().await?;
        let info = version_info(version)?;
        let lookup = async {
            repository
                .resolve_version(&info)
                .await
                .map_err(|e| repository_error(Some(version), e))
        };
        self.tips
            .try_get_with(version.clone(), lookup)
            .await
            .map_err(|e| (*e).clone())
    }

    /// The store of `version` (the mount's default when `None`) as it is now: one snapshot.
    pub async fn at(&self, version: Option<&Version>) -> Result<AtVersion, StoreError> {
        let version = version.unwrap_or(&self.default_version);
        let id = self.snapshot_of(version).await?;
        let make = async {
            let repository = self.repository().await?;
            let session = repository
                .readonly_session(&VersionInfo::SnapshotId(id.clone()))
                .await
                .map_err(|e| repository_error(Some(version), e))?;
            Ok(Arc::new(SnapshotBackend {
                snapshot: id.to_string(),
                state: crc32c::crc32c(id.to_string().as_bytes()),
                session,
                targets: self.targets.clone(),
                directories: tokio::sync::OnceCell::new(),
            }))
        };
        let backend = self
            .sessions
            .try_get_with(id.clone(), make)
            .await
            .map_err(|e: Arc<StoreError>| (*e).clone())?;
        Ok(AtVersion {
            snapshot: id.to_string(),
            store: Store(backend),
        })
    }

    /// Branches, tags and the recent snapshots of each branch, for `/api/v1/versions/`: read
    /// at most once per `check_every` (requests meanwhile share one reading).
    pub async fn versions(&self) -> Result<Arc<Versions>, StoreError> {
        self.versions
            .try_get_with((), async { self.read_versions().await.map(Arc::new) })
            .await
            .map_err(|e: Arc<StoreError>| (*e).clone())
    }

    /// At most [`REFS_LISTED`] branches and tags each, and [`SNAPSHOTS_LISTED`] ancestors of
    /// each branch.
    async fn read_versions(&self) -> Result<Versions, StoreError> {
        let repository = self.repository().await?;
        let error = |e| repository_error(None, e);
        let mut truncated = false;
        let mut listed = |names: std::collections::BTreeSet<String>| {
            truncated |= names.len() > REFS_LISTED;
            names.into_iter().take(REFS_LISTED).collect::<Vec<_>>()
        };
        let branch_names = listed(repository.list_branches().await.map_err(error)?);
        let tag_names = listed(repository.list_tags().await.map_err(error)?);
        let mut branches = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut snapshots = Vec::<SnapshotEntry>::new();
        for name in branch_names {
            let snapshot = repository.lookup_branch(&name).await.map_err(error)?;
            let ancestry = repository
                .ancestry(&VersionInfo::SnapshotId(snapshot.clone()))
                .await
                .map_err(error)?
                .take(SNAPSHOTS_LISTED);
            futures::pin_mut!(ancestry);
            while let Some(info) = ancestry.next().await {
                let info = info.map_err(error)?;
                let id = info.id.to_string();
                // The rest of this branch's history is another's, listed already.
                if !seen.insert(id.clone()) {
                    break;
                }
                snapshots.push(SnapshotEntry {
                    id,
                    parent: info.parent_id.map(|p| p.to_string()),
                    time: info.flushed_at.to_rfc3339(),
                    message: info.message,
                });
            }
            branches.push(Named {
                name,
                snapshot: snapshot.to_string(),
            });
        }
        let mut tags = Vec::new();
        for name in tag_names {
            let snapshot = repository.lookup_tag(&name).await.map_err(error)?;
            tags.push(Named {
                name,
                snapshot: snapshot.to_string(),
            });
        }
        snapshots.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| a.id.cmp(&b.id)));
        Ok(Versions {
            default: self.default_version.to_string(),
            branches,
            tags,
            snapshots,
            truncated,
        })
    }
}

/// What `/api/v1/versions/{mount}` answers.
#[derive(Debug, Serialize)]
pub struct Versions {
    pub default: String,
    pub branches: Vec<Named>,
    pub tags: Vec<Named>,
    /// The last [`SNAPSHOTS_LISTED`] snapshots of each branch, newest first.
    pub snapshots: Vec<SnapshotEntry>,
    /// Whether more than [`REFS_LISTED`] branches or tags were left out.
    pub truncated: bool,
}

/// A branch or tag, and the snapshot it points to.
#[derive(Debug, Serialize)]
pub struct Named {
    pub name: String,
    pub snapshot: String,
}

#[derive(Debug, Serialize)]
pub struct SnapshotEntry {
    pub id: String,
    pub parent: Option<String>,
    /// When it was written (RFC 3339, UTC).
    pub time: String,
    pub message: String,
}

/// One snapshot of a repository as a store: `zarr.json` of each node, and its chunks at
/// `{node}/c/{i}/{j}...` (Icechunk's default chunk key encoding).
struct SnapshotBackend {
    snapshot: String,
    /// Names the snapshot in the versions of its keys.
    state: u32,
    session: Session,
    targets: Arc<Targets>,
    directories: tokio::sync::OnceCell<Arc<Directories>>,
}

impl fmt::Debug for SnapshotBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBackend")
            .field("snapshot", &self.snapshot)
            .finish_non_exhaustive()
    }
}

/// What a key of a snapshot names: a node's metadata document, or one of an array's chunks.
#[derive(Debug, PartialEq)]
enum SnapshotKey {
    Metadata(Path),
    Chunk(Path, ChunkIndices),
}

fn node_path(prefix: &[&str]) -> Option<Path> {
    Path::new(&format!("/{}", prefix.join("/"))).ok()
}

fn snapshot_key(key: &StoreKey) -> Option<SnapshotKey> {
    let segments: Vec<&str> = key.as_str().split('/').collect();
    let (last, parents) = segments.split_last()?;
    if *last == "zarr.json" {
        return node_path(parents).map(SnapshotKey::Metadata);
    }
    // The last `c` segment followed by indices only (none for a 0-d array's one chunk).
    let at = segments.iter().rposition(|s| *s == "c")?;
    let coords = segments[at + 1..]
        .iter()
        // One spelling per chunk: digits, without leading zeros.
        .map(
            |s| match s.bytes().all(|b| b.is_ascii_digit()) && (s.len() == 1 || !s.starts_with('0')) {
                true => s.parse::<u32>().ok(),
                false => None,
            },
        )
        .collect::<Option<Vec<u32>>>()?;
    Some(SnapshotKey::Chunk(node_path(&segments[..at])?, ChunkIndices(coords)))
}

impl SnapshotBackend {
    /// What `key` reads, and what a virtual chunk's source must still be: `None` when the
    /// snapshot holds no such key.
    async fn reference(&self, key: &StoreKey) -> Result<Option<(Reference, Option<Expected>)>, StoreError> {
        let missing = |e: &SessionError| {
            matches!(
                e.kind,
                SessionErrorKind::NodeNotFound { .. } | SessionErrorKind::NotAnArray { .. }
            )
        };
        match snapshot_key(key) {
            None => Ok(None),
            Some(SnapshotKey::Metadata(path)) => match self.session.get_node(&path).await {
                Ok(node) => Ok(Some((Reference::Inline(node.user_data), None))),
                Err(e) if missing(&e) => Ok(None),
                Err(e) => Err(session_error(key, e)),
            },
            Some(SnapshotKey::Chunk(path, coords)) => match self.session.get_chunk_ref(&path, &coords).await {
                Ok(None) => Ok(None),
                Ok(Some(ChunkPayload::Inline(bytes))) => Ok(Some((Reference::Inline(bytes), None))),
                Ok(Some(ChunkPayload::Ref(chunk))) => Ok(Some((
                    Reference::Range {
                        url: format!("{}/{}", ::icechunk::format::CHUNKS_FILE_PATH, chunk.id).into(),
                        offset: chunk.offset,
                        length: chunk.length,
                    },
                    None,
                ))),
                Ok(Some(ChunkPayload::Virtual(chunk))) => {
                    let url =
                        self.session
                            .resolve_virtual_location(&chunk.location)
                            .map_err(|e| StoreError::Corrupt {
                                key: key.as_str().to_owned(),
                                message: e.to_string(),
                            })?;
                    // Only absolute URLs: a relative one would read the repository's own files.
                    if !url.contains("://") {
                        return Err(StoreError::NotAllowed(format!(
                            "a virtual chunk's location '{url}' is not a URL"
                        )));
                    }
                    let expected = chunk.checksum.map(|checksum| match checksum {
                        Checksum::ETag(etag) => Expected::ETag(etag.0),
                        Checksum::LastModified(SecondsSinceEpoch(seconds)) => {
                            Expected::UnmodifiedSince(std::time::UNIX_EPOCH + Duration::from_secs(u64::from(seconds)))
                        }
                    });
                    Ok(Some((
                        Reference::Range {
                            url: url.into(),
                            offset: chunk.offset,
                            length: chunk.length,
                        },
                        expected,
                    )))
                }
                Ok(Some(other)) => Err(StoreError::Corrupt {
                    key: key.as_str().to_owned(),
                    message: format!("a chunk reference of a kind not read here: {other:?}"),
                }),
                Err(e) if missing(&e) => Ok(None),
                Err(e) => Err(session_error(key, e)),
            },
        }
    }

    /// The directories of the snapshot's metadata documents (chunk keys are not listed).
    async fn directories(&self) -> Result<Arc<Directories>, StoreError> {
        self.directories
            .get_or_try_init(|| async {
                let nodes = self
                    .session
                    .list_nodes(&Path::root())
                    .await
                    .map_err(|e| session_error(&StoreKey::root(), e))?;
                let mut keys = Vec::new();
                for node in nodes {
                    if keys.len() == NODES_LISTED {
                        return Err(StoreError::NotSupported(format!(
                            "listing snapshot {}, of more than {NODES_LISTED} nodes",
                            self.snapshot
                        )));
                    }
                    let node = node.map_err(|e| session_error(&StoreKey::root(), e))?;
                    let path = node.path.to_string();
                    let path = path.trim_start_matches('/');
                    keys.push(match path.is_empty() {
                        true => "zarr.json".to_owned(),
                        false => format!("{path}/zarr.json"),
                    });
                }
                Ok(Arc::new(Directories::new(keys.iter().map(String::as_str))))
            })
            .await
            .cloned()
    }
}

#[async_trait]
impl Backend for SnapshotBackend {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        match self.reference(key).await? {
            Some((reference, expected)) => self
                .targets
                .head(key, &reference, self.state, expected.as_ref())
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        match self.reference(key).await? {
            Some((reference, expected)) => self
                .targets
                .get(key, &reference, self.state, expected.as_ref(), range)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        Ok(self.directories().await?.list(prefix))
    }
}

/// The store of a repository's default version, as it is at each request: what a mount's
/// `store` reads where no version is named.
#[derive(Debug)]
struct DefaultVersion(Arc<Repository>);

#[async_trait]
impl Backend for DefaultVersion {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        self.0.at(None).await?.store.head(key).await
    }

    fn resolves_ranges(&self) -> bool {
        true
    }

    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        self.0.at(None).await?.store.get(key, range).await
    }

    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        self.0.at(None).await?.store.list(prefix).await
    }
}

/// What zarrgate asks of icechunk beyond the repository's own config: its caches sized from
/// `metadata_bytes`, and no manifests preloaded (work no request asked for, not bounded by one).
fn repository_config(metadata_bytes: u64) -> ::icechunk::RepositoryConfig {
    use ::icechunk::config::{CachingConfig, ManifestConfig, ManifestPreloadConfig};
    let caching = CachingConfig {
        // icechunk keeps no snapshot or manifest larger than its cache: never below its own
        // defaults, else a large one is fetched and decoded again for every key.
        num_snapshot_nodes: Some((metadata_bytes / NODE_BYTES).max(ICECHUNK_SNAPSHOT_NODES)),
        num_chunk_refs: Some((metadata_bytes / CHUNK_REF_BYTES).max(ICECHUNK_CHUNK_REFS)),
        ..Default::default()
    };
    let preload = ManifestPreloadConfig {
        max_total_refs: Some(0),
        ..Default::default()
    };
    let manifest = ManifestConfig {
        preload: Some(preload),
        ..Default::default()
    };
    ::icechunk::RepositoryConfig {
        caching: Some(caching),
        manifest: Some(manifest),
        ..Default::default()
    }
}

/// The icechunk storage of a mount's URL, with the mount's settings; credentials from each
/// cloud's environment, as the mount's own store takes them.
async fn storage_of(
    source: &MountSource,
    config: &MountConfig,
) -> Result<Arc<dyn ::icechunk::Storage + Send + Sync>, String> {
    use ::icechunk::storage::{S3Credentials, S3Options};
    let url = match source {
        MountSource::Remote(_, url) => url.as_str(),
        _ => "",
    };
    let (bucket, prefix) = super::open::bucket_and_prefix(url);
    let prefix = prefix.trim_matches('/');
    let (bucket, prefix) = (bucket.to_owned(), (!prefix.is_empty()).then(|| prefix.to_owned()));
    let failed = |e: ::icechunk::StorageError| e.to_string();
    match source {
        MountSource::Local(dir) => ::icechunk::new_local_filesystem_storage(dir).await.map_err(failed),
        MountSource::Remote(Remote::S3, _) => {
            let mut options = S3Options::default();
            options.region = config.region.clone().or_else(|| std::env::var("AWS_REGION").ok());
            options.endpoint_url = config
                .endpoint
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
            options.anonymous = config.anonymous;
            options.allow_http = config.allow_http;
            options.force_path_style = options.endpoint_url.is_some();
            options.network_stream_timeout_seconds = Some(config.timeout_s.ceil() as u32);
            let credentials = match config.anonymous {
                true => S3Credentials::Anonymous,
                false => S3Credentials::FromEnv,
            };
            ::icechunk::storage::new_s3_object_store_storage(
                options,
                bucket,
                prefix,
                Some(credentials),
                Vec::new(),
                Vec::new(),
            )
            .await
            .map_err(failed)
        }
        MountSource::Remote(Remote::Gcs, _) => {
            let mut settings = std::collections::HashMap::new();
            if let Some(e) = &config.endpoint {
                settings.insert("google_base_url".to_owned(), e.trim_end_matches('/').to_owned());
            }
            let credentials = config
                .anonymous
                .then_some(::icechunk::storage::GcsCredentials::Anonymous);
            ::icechunk::storage::new_gcs_storage(bucket, prefix, credentials, Some(settings), Vec::new(), Vec::new())
                .map_err(failed)
        }
        MountSource::Remote(Remote::Azure, _) => {
            // As the mount's own store names them (`container@account.host`, else the environment).
            let (container, account) = super::open::azure_container(&bucket);
            let account = account
                .map(str::to_owned)
                .unwrap_or_else(|| std::env::var("AZURE_STORAGE_ACCOUNT_NAME").unwrap_or_default());
            let container = container.to_owned();
            let credentials = match config.anonymous {
                true => ::icechunk::storage::AzureCredentials::Anonymous,
                false => ::icechunk::storage::AzureCredentials::FromEnv,
            };
            let mut settings = std::collections::HashMap::new();
            if let Some(e) = &config.endpoint {
                settings.insert("azure_storage_endpoint".to_owned(), e.clone());
            }
            if config.allow_http {
                settings.insert("azure_allow_http".to_owned(), "true".to_owned());
            }
            ::icechunk::storage::new_azure_blob_storage(account, container, prefix, Some(credentials), Some(settings))
                .await
                .map_err(failed)
        }
        MountSource::Remote(Remote::Http, url) => {
            let mut settings = std::collections::HashMap::new();
            if config.allow_http {
                settings.insert("allow_http".to_owned(), "true".to_owned());
            }
            ::icechunk::storage::new_http_storage(url, Some(settings), None).map_err(failed)
        }
        MountSource::Zip(..) => {
            Err("an Icechunk repository is a directory or a bucket prefix, not a zip archive".into())
        }
    }
}

/// Opens an Icechunk mount: its repository (read at the first request), native chunks read
/// through the mount's store (remote ones through `raw`, keyed under `cache_id`), virtual ones
/// below each of `config.virtual_prefixes`.
pub fn open(
    name: &str,
    config: &MountConfig,
    (check_every, metadata_bytes): (Duration, u64),
    (raw, cache_id, freshness): (&Arc<RawCache>, &Arc<str>, Freshness),
) -> Result<(Store, Arc<Repository>), String> {
    let default_version = Version::parse(config.version.as_deref().unwrap_or("branch.main"))?;
    let source = config.source(name).map_err(|e| e.to_string())?;
    if let MountSource::Zip(..) = source {
        return Err("an Icechunk repository is a directory or a bucket prefix, not a zip archive".into());
    }
    let own = super::open::open_cached(&source, config, check_every, (raw, name, cache_id, freshness))?;
    let prefixes = super::references::prefix_stores(name, config, check_every, (raw, cache_id, freshness))?;
    let repository = Arc::new(Repository {
        mount: name.into(),
        source,
        config: config.clone(),
        targets: Arc::new(Targets { own, prefixes }),
        default_version,
        check_every,
        opened: tokio::sync::Mutex::new(None),
        tips: moka::future::Cache::builder()
            .time_to_live(check_every)
            .max_capacity(1024)
            .build(),
        sessions: moka::future::Cache::builder().max_capacity(SESSIONS_HELD).build(),
        versions: moka::future::Cache::builder()
            .time_to_live(check_every)
            .max_capacity(1)
            .build(),
        metadata_bytes,
    });
    Ok((Store::new(DefaultVersion(repository.clone())), repository))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_print() {
        for text in ["branch.main", "tag.v1.2", "snapshot.PP1VE9WPQCY0KNH9GXZ0", "branch.a.b"] {
            assert_eq!(Version::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(Version::parse("tag.v1.2").unwrap(), Version::Tag("v1.2".into()));
        for bad in ["main", "branch.", "head.main", "", "snapshot", "snapshot.not-an-id"] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
        assert!(Version::parse("snapshot.PP1VE9WPQCY0KNH9GXZ0").unwrap().is_immutable());
        assert!(!Version::parse("tag.x").unwrap().is_immutable());
    }

    #[test]
    fn keys_name_documents_and_chunks() {
        let key = |k: &str| snapshot_key(&StoreKey::new(k).unwrap());
        let path = |p: &str| Path::new(p).unwrap();
        assert_eq!(key("zarr.json"), Some(SnapshotKey::Metadata(Path::root())));
        assert_eq!(key("a/b/zarr.json"), Some(SnapshotKey::Metadata(path("/a/b"))));
        assert_eq!(
            key("a/c/0/12"),
            Some(SnapshotKey::Chunk(path("/a"), ChunkIndices(vec![0, 12])))
        );
        // A group named `c` holds arrays too; a 0-d array's one chunk is `c`.
        assert_eq!(
            key("c/x/c/3"),
            Some(SnapshotKey::Chunk(path("/c/x"), ChunkIndices(vec![3])))
        );
        assert_eq!(
            key("scalar/c"),
            Some(SnapshotKey::Chunk(path("/scalar"), ChunkIndices(vec![])))
        );
        assert_eq!(
            key("c/0"),
            Some(SnapshotKey::Chunk(Path::root(), ChunkIndices(vec![0])))
        );
        for none in [
            "a/.zarray",
            "a/c/x",
            "a/c/-1",
            "a/c/+1",
            "a/b",
            "a/c/99999999999",
            "a/c/07",
            "a/c/1/00",
        ] {
            assert_eq!(key(none), None, "{none}");
        }
    }
}
