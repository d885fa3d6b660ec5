//! Runs fixture manifests (tests/fixtures/cases.json and the zarrita one) against any store:
//! every array read whole and through a strided selection, compared with zarr-python's values.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use zarrgate::array::{DimSelection, ReadContext, Selection, read_region};
use zarrgate::dtype::elements::Elements;
use zarrgate::store::{Store, StoreKey};
use zarrgate::zarr::{ArrayMeta, open_array};

use super::expected::{load, slice_naive};

pub struct Case {
    pub path: String,
    pub expected: PathBuf,
}

pub fn cases(manifest: &Path) -> Vec<Case> {
    let dir = manifest.parent().unwrap();
    let list: Vec<Value> = serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    list.into_iter()
        .filter_map(|c| {
            Some(Case {
                path: c["path"].as_str()?.to_owned(),
                expected: dir.join(c["expected"].as_str()?),
            })
        })
        .collect()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub async fn open(store: &Store, path: &str) -> Result<Arc<ArrayMeta>, String> {
    let key = StoreKey::new(path).unwrap();
    open_array(store, &key).await.map(Arc::new).map_err(|e| e.to_string())
}

/// Same values: fixed-size data byte for byte (so NaN payloads count too), others by value.
/// An object array of strings (json2) equals the same strings read back as a string array.
/// A missing variable-length string or bytes value (None) equals the empty one: zarr 2 reads
/// the elements of a missing chunk of such an array with fill_value null as None, where
/// zarr-python 3, and zarrgate with it, reads "" (b"").
pub fn same(a: &Elements, b: &Elements) -> bool {
    let as_strings = |o: &[Value]| -> Option<Vec<Option<String>>> {
        o.iter().map(|v| v.as_str().map(|s| Some(s.to_owned()))).collect()
    };
    fn empty_or_missing<T: Default + PartialEq>(x: &Option<T>, y: &Option<T>) -> bool {
        let empty = T::default();
        x.as_ref().unwrap_or(&empty) == y.as_ref().unwrap_or(&empty)
    }
    fn alike<T: Default + PartialEq>(x: &[Option<T>], y: &[Option<T>]) -> bool {
        x.len() == y.len() && x.iter().zip(y).all(|(x, y)| empty_or_missing(x, y))
    }
    match (a, b) {
        (Elements::Objects(o), Elements::Strings(s)) | (Elements::Strings(s), Elements::Objects(o)) => {
            as_strings(o).as_ref() == Some(s)
        }
        (Elements::Strings(x), Elements::Strings(y)) => alike(x, y),
        (Elements::Bytes(x), Elements::Bytes(y)) => alike(x, y),
        _ => a == b,
    }
}

pub fn check_case(rt: &tokio::runtime::Runtime, store: &Store, case: &Case) -> Result<(), String> {
    let expected = load(&case.expected);
    rt.block_on(async {
        let meta = open(store, &case.path).await?;
        if meta.shape != expected.shape {
            return Err(format!("shape {:?} != {:?}", meta.shape, expected.shape));
        }
        if let Some(dt) = &expected.dtype
            && dt.item_size() != meta.dtype.item_size()
        {
            return Err(format!("dtype {} != expected {}", meta.dtype.typestr(), dt.typestr()));
        }
        let key = StoreKey::new(&case.path).unwrap();
        let ctx = ReadContext::uncached(store.clone());
        let whole = read_region(&ctx, &key, meta.clone(), &Selection::all(&meta.shape))
            .await
            .map_err(|e| e.to_string())?;
        if !same(&whole, &expected.elements) {
            return Err(format!(
                "whole array differs:\n got {whole:?}\nwant {:?}",
                expected.elements
            ));
        }
        // A strided selection that crosses chunk (and shard) boundaries: from 1, step 2.
        let item = meta.dtype.item_size().unwrap_or(0);
        let sel = Selection(
            meta.shape
                .iter()
                .map(|&n| {
                    let start = n.min(1);
                    DimSelection::Slice {
                        start,
                        step: 2,
                        count: (n - start).div_ceil(2),
                    }
                })
                .collect(),
        );
        let part = read_region(&ctx, &key, meta.clone(), &sel)
            .await
            .map_err(|e| e.to_string())?;
        let (starts, steps, counts): (Vec<u64>, Vec<u64>, Vec<u64>) =
            sel.0
                .iter()
                .map(|d| d.span())
                .fold((vec![], vec![], vec![]), |(mut a, mut b, mut c), (s, st, n)| {
                    a.push(s);
                    b.push(st);
                    c.push(n);
                    (a, b, c)
                });
        let want = slice_naive(&expected, item, &starts, &steps, &counts);
        if !same(&part, &want) {
            return Err(format!("strided selection differs:\n got {part:?}\nwant {want:?}"));
        }
        Ok(())
    })
}

/// Checks every case of a manifest against `store`; `map` turns a manifest path into the path
/// in the store (`None`: not in this store).
pub fn run_manifest_on(store: &Store, manifest: &Path, map: impl Fn(&str) -> Option<String>) -> (usize, Vec<String>) {
    let rt = runtime();
    let cases: Vec<Case> = cases(manifest)
        .into_iter()
        .filter_map(|c| {
            map(&c.path).map(|path| Case {
                path,
                expected: c.expected,
            })
        })
        .collect();
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(e) = check_case(&rt, store, case) {
            failures.push(format!("{}: {e}", case.path));
        }
    }
    (cases.len(), failures)
}
