//! Every fixture array, read whole and through strided selections, compared value for value
//! with what zarr-python (or zarr 2) read from the same files. The zarrita fixtures in
//! ../shared are read too when present.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::expected::{Expected, load, slice_naive};
use proptest::prelude::*;
use serde_json::Value;
use zarrgate::array::{DimSelection, ReadContext, Selection, read_region};
use zarrgate::store::{Store, StoreKey, open_local};
use zarrgate::zarr::elements::Elements;
use zarrgate::zarr::{ArrayMeta, open_array};

struct Case {
    path: String,
    expected: PathBuf,
}

fn cases(manifest: &Path) -> Vec<Case> {
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn open(store: &Store, path: &str) -> Result<Arc<ArrayMeta>, String> {
    let key = StoreKey::new(path).unwrap();
    open_array(store, &key).await.map(Arc::new).map_err(|e| e.to_string())
}

/// Same values: fixed-size data byte for byte (so NaN payloads count too), others by value.
/// An object array of strings (json2) equals the same strings read back as a string array.
fn same(a: &Elements, b: &Elements) -> bool {
    let as_strings = |o: &[Value]| -> Option<Vec<Option<String>>> {
        o.iter().map(|v| v.as_str().map(|s| Some(s.to_owned()))).collect()
    };
    match (a, b) {
        (Elements::Objects(o), Elements::Strings(s)) | (Elements::Strings(s), Elements::Objects(o)) => {
            as_strings(o).as_ref() == Some(s)
        }
        _ => a == b,
    }
}

fn check_case(rt: &tokio::runtime::Runtime, store: &Store, case: &Case) -> Result<(), String> {
    let expected = load(&case.expected);
    rt.block_on(async {
        let meta = open(store, &case.path).await?;
        if meta.shape != expected.shape {
            return Err(format!("shape {:?} != {:?}", meta.shape, expected.shape));
        }
        if let Some(dt) = &expected.dtype {
            if dt.item_size() != meta.dtype.item_size() {
                return Err(format!("dtype {} != expected {}", meta.dtype.typestr(), dt.typestr()));
            }
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

fn run_manifest(root: &Path, manifest: &Path) -> (usize, Vec<String>) {
    let store = Store::new(open_local(root).unwrap());
    let rt = runtime();
    let cases = cases(manifest);
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(e) = check_case(&rt, &store, case) {
            failures.push(format!("{}: {e}", case.path));
        }
    }
    (cases.len(), failures)
}

#[test]
fn every_fixture_matches_zarr_python() {
    let root = common::fixtures();
    let (n, failures) = run_manifest(&root, &common::repo().join("tests/fixtures/cases.json"));
    assert!(n > 150, "the manifest lists the fixtures ({n})");
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_zarrita_fixture_matches_zarr_python() {
    let root = common::repo().join("../shared/fixtures/zarrita");
    if !root.is_dir() {
        eprintln!("skipped: ../shared/fixtures/zarrita is absent");
        return;
    }
    let (n, failures) = run_manifest(
        &root,
        &common::repo().join("tests/fixtures/zarrita_expected/cases.json"),
    );
    assert!(n > 50, "{n}");
    assert!(
        failures.is_empty(),
        "{} of {n} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn expected_case(path: &str) -> Expected {
    load(&common::repo().join(format!("tests/fixtures/expected/{path}.npy")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any selection of a sharded 2-D array (ragged inner chunks, index at the start) equals
    /// slicing the whole array.
    #[test]
    fn random_selections_equal_slicing(
        a in 0u64..12, b in 0u64..12, s0 in 1u64..4, c in 0u64..12, d in 0u64..12, s1 in 1u64..4,
        case in prop::sample::select(vec!["v3/sharding_start_i4", "v3/sharding_nested_ragged_u1", "v2/order_F_2d_i4", "v3/transpose_2d_10"]),
    ) {
        let expected = expected_case(case);
        let store = Store::new(open_local(&common::fixtures()).unwrap());
        let rt = runtime();
        let meta = rt.block_on(open(&store, case)).unwrap();
        let shape = meta.shape.clone();
        prop_assume!(shape.len() >= 2);
        let text = format!("{a}:{b}:{s0},{c}:{d}:{s1}");
        let sel = Selection::parse(&text, &shape).unwrap();
        let ctx = ReadContext::uncached(store.clone());
        let got = rt.block_on(read_region(&ctx, &StoreKey::new(case).unwrap(), meta.clone(), &sel)).unwrap();
        let spans: Vec<(u64, u64, u64)> = sel.0.iter().map(|d| d.span()).collect();
        let mut starts: Vec<u64> = spans.iter().map(|s| s.0).collect();
        let mut steps: Vec<u64> = spans.iter().map(|s| s.1).collect();
        let mut counts: Vec<u64> = spans.iter().map(|s| s.2).collect();
        for _ in 2..shape.len() {
            starts.push(0);
            steps.push(1);
        }
        counts.extend(&shape[2..]);
        let want = slice_naive(&expected, meta.dtype.item_size().unwrap(), &starts, &steps, &counts);
        prop_assert_eq!(got, want, "{} select {}", case, text);
    }
}
