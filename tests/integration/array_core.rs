//! Every fixture array, read whole and through strided selections, compared value for value
//! with what zarr-python (or zarr 2) read from the same files. The zarrita fixtures in
//! ../shared are read too when present.

use crate::common::cases::{open, run_manifest_on, runtime};
use crate::common::expected::{Expected, load, slice_naive};
use proptest::prelude::*;
use zarrgate::array::{ReadContext, Selection, load_region, read_region};
use zarrgate::dtype::elements::Elements;
use zarrgate::store::{Store, StoreKey, open_local};

#[test]
fn every_fixture_matches_zarr_python() {
    let root = crate::common::fixtures();
    let store = Store::new(open_local(&root).unwrap());
    let (n, failures) = run_manifest_on(&store, &crate::common::repo().join("tests/fixtures/cases.json"), |p| {
        Some(p.to_owned())
    });
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
    let root = crate::common::repo().join("../shared/fixtures/zarrita");
    if !root.is_dir() {
        eprintln!("skipped: ../shared/fixtures/zarrita is absent");
        return;
    }
    let store = Store::new(open_local(&root).unwrap());
    let (n, failures) = run_manifest_on(
        &store,
        &crate::common::repo().join("tests/fixtures/zarrita_expected/cases.json"),
        |p| Some(p.to_owned()),
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
    load(&crate::common::repo().join(format!("tests/fixtures/expected/{path}.npy")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Any selection of a 2-D array (sharded with ragged inner chunks or the index at the start,
    /// missing shards, chunks and inner chunks read as non-zero fills, F order, transposes)
    /// equals slicing the whole array; so does the same region loaded and written out in two
    /// ranges of rows (as streamed responses are).
    #[test]
    fn random_selections_equal_slicing(
        a in 0u64..12, b in 0u64..12, s0 in 1u64..4, c in 0u64..12, d in 0u64..12, s1 in 1u64..4,
        cut in 0u64..12,
        case in prop::sample::select(vec![
            "v3/sharding_start_i4", "v3/sharding_nested_ragged_u1", "v2/order_F_2d_i4", "v3/transpose_2d_10",
            "v3/sharding_missing_shard_f8", "v2/fill_nonzero_i2", "v3/sharding_empty_inner_chunks_i4",
        ]),
    ) {
        let expected = expected_case(case);
        let store = Store::new(open_local(&crate::common::fixtures()).unwrap());
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
        let path = StoreKey::new(case).unwrap();
        let loaded = rt.block_on(load_region(&ctx, &path, meta.clone(), &sel)).unwrap();
        let cut = cut.min(loaded.rows());
        let mut rows = loaded.write_rows(0..cut).unwrap();
        rows.extend(loaded.write_rows(cut..loaded.rows()).unwrap());
        let Elements::Fixed(want_bytes) = &want else { panic!("fixed-size fixtures") };
        prop_assert_eq!(&rows, want_bytes, "{} select {} rows cut at {}", case, text, cut);
        prop_assert_eq!(got, want, "{} select {}", case, text);
    }
}
