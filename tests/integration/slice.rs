//! The slice API: every format checked value for value against the .npy that zarr-python
//! wrote, every error code, the 413 on a huge sparse array, streaming, and the caches.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::expected::{load, load_npy, slice_naive};
use crate::common::*;
use serde_json::{Value, json};
use zarrgate::config::Config;
use zarrgate::dtype::elements::Elements;

fn expected(path: &str) -> crate::common::expected::Expected {
    let dir = repo().join("tests/fixtures/expected");
    let npy = dir.join(format!("{path}.npy"));
    if npy.exists() {
        load_npy(&npy)
    } else {
        load(&dir.join(format!("{path}.json")))
    }
}

fn f64s(e: &Elements, kind: &str) -> Vec<f64> {
    let Elements::Fixed(b) = e else { panic!("fixed") };
    match kind {
        "f4" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        "f8" => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "i4" => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        _ => unreachable!(),
    }
}

fn json_number(v: &Value) -> f64 {
    match v {
        Value::String(s) if s == "NaN" => f64::NAN,
        Value::String(s) if s == "Infinity" => f64::INFINITY,
        Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        v => v.as_f64().unwrap(),
    }
}

fn same_f64(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x.is_nan() && y.is_nan()) || x == y)
}

#[tokio::test]
async fn json_values_match_zarr_python() {
    let app = fixture_app();
    // A float array with a NaN fill and missing chunks, whole and strided.
    let e = expected("v2/fill_nan_f4");
    let r = get(&app, "/api/v1/slice/fx/v2/fill_nan_f4", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v = r.json();
    assert_eq!(v["shape"], json!(e.shape));
    assert_eq!(v["dtype"], "<f4");
    let got: Vec<f64> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| match row {
            Value::Array(r) => r.iter().map(json_number).collect::<Vec<_>>(),
            x => vec![json_number(x)],
        })
        .collect();
    // float32 values are written with the shortest digits that round-trip as float32.
    let got: Vec<f64> = got.iter().map(|&x| x as f32 as f64).collect();
    assert!(same_f64(&got, &f64s(&e.elements, "f4")), "{got:?}");

    // 2-D ints with an integer index dropping a dimension.
    let e = expected("v3/sharding_start_i4");
    let r = get(&app, "/api/v1/slice/fx/v3/sharding_start_i4?select=[1,::2]", &[]).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let want = slice_naive(&e, 4, &[1, 0], &[1, 2], &[1, e.shape[1].div_ceil(2)]);
    assert_eq!(v["shape"], json!([e.shape[1].div_ceil(2)]));
    let got: Vec<f64> = v["data"].as_array().unwrap().iter().map(json_number).collect();
    assert_eq!(got, f64s(&want, "i4"));

    // Strings, complex, datetimes (NaT -> null), a 0-d array.
    let r = get(&app, "/api/v1/slice/fx/v3/vlen_utf8", &[]).await;
    let want = expected("v3/vlen_utf8");
    let Elements::Strings(s) = want.elements else { panic!() };
    assert_eq!(r.json()["data"], json!(s));
    let r = get(&app, "/api/v1/slice/fx/v2/fill_complex_c8?select=0:2", &[]).await;
    let e = expected("v2/fill_complex_c8");
    let parts: Vec<f32> = f64s(&e.elements, "f4").iter().map(|&x| x as f32).collect();
    let got: Vec<f32> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p.as_array()
                .unwrap()
                .iter()
                .map(|x| json_number(x) as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(got, parts[..4]);
    let r = get(&app, "/api/v1/slice/fx/v2/zarr2_dtype_M8_ns_fill_nat", &[]).await;
    let e = expected("v2/zarr2_dtype_M8_ns_fill_nat");
    let Elements::Fixed(b) = &e.elements else { panic!() };
    let want: Vec<Value> = b
        .chunks_exact(8)
        .map(|c| {
            let v = i64::from_le_bytes(c.try_into().unwrap());
            if v == i64::MIN { Value::Null } else { json!(v) }
        })
        .collect();
    assert_eq!(r.json()["data"], json!(want));
    let r = get(&app, "/api/v1/slice/fx/v3/zero_dim_f8", &[]).await;
    let v = r.json();
    assert_eq!(v["shape"], json!([]));
    assert_eq!(
        json_number(&v["data"]),
        f64s(&expected("v3/zero_dim_f8").elements, "f8")[0]
    );
}

#[tokio::test]
async fn bin_and_npy_are_the_bytes_zarr_python_read() {
    let app = fixture_app();
    for path in [
        "v2/order_F_3d_f4",
        "v3/sharding_nested_i4",
        "v2/dtype_be_c16",
        "v2/dtype_struct_nested_subarray",
        "v3/transpose_3d_201",
    ] {
        let e = expected(path);
        let Elements::Fixed(want) = &e.elements else { panic!() };
        let r = get(&app, &format!("/api/v1/slice/fx/{path}?format=bin"), &[]).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
        assert_eq!(&r.body[..], &want[..], "{path}");
        let shape: Vec<String> = e.shape.iter().map(u64::to_string).collect();
        assert_eq!(r.header("x-zarr-shape"), Some(shape.join(",").as_str()));
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        // npy, by the Accept header, read back with an independent parser.
        let r = get(
            &app,
            &format!("/api/v1/slice/fx/{path}"),
            &[("accept", "application/x-npy")],
        )
        .await;
        assert_eq!(r.status, 200);
        // The body depends on Accept: caches are told (beside CORS's own Vary), in one line.
        let vary = vary_tokens(&r);
        assert!(vary.contains(&"accept".to_owned()), "{vary:?}");
        assert!(vary.contains(&"origin".to_owned()), "{vary:?}");
        assert_eq!(r.headers.get_all("vary").iter().count(), 1);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &r.body).unwrap();
        let back = load_npy(file.path());
        assert_eq!(back.shape, e.shape, "{path}");
        assert_eq!(back.elements, e.elements, "{path}");
    }
    // Variable-length strings become fixed width.
    let r = get(&app, "/api/v1/slice/fx/v3/vlen_utf8?format=bin", &[]).await;
    assert!(r.header("x-zarr-dtype").unwrap().starts_with("<U"));
}

/// Lone surrogates in a `<U` array (as zarr-python wrote them): JSON escapes them as Python's
/// json.dumps does, so a JSON reader gets NumPy's strings; CSV, UTF-8 text, has U+FFFD.
#[tokio::test]
async fn lone_surrogates_are_escaped_in_json() {
    let app = fixture_app();
    let r = get(&app, "/api/v1/slice/fx/v2/dtype_U3_lone_surrogates?format=json", &[]).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.ends_with(r#""data":["a\udc80b","ok","\ud800","\udfff\u0001"]}"#),
        "{text}"
    );
    let r = get(&app, "/api/v1/slice/fx/v2/dtype_U3_lone_surrogates?format=csv", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        String::from_utf8(r.body.to_vec()).unwrap(),
        "a\u{FFFD}b\nok\n\u{FFFD}\n\u{FFFD}\u{1}\n"
    );
}

#[tokio::test]
async fn csv_and_png() {
    let app = fixture_app();
    let e = expected("v2/compressor_none_i4");
    let r = get(&app, "/api/v1/slice/fx/v2/compressor_none_i4?format=csv", &[]).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let got: Vec<f64> = text
        .lines()
        .flat_map(|l| l.split(',').map(|v| v.parse::<f64>().unwrap()).collect::<Vec<_>>())
        .collect();
    assert_eq!(got, f64s(&e.elements, "i4"));
    assert_eq!(
        text.lines().count() as u64,
        if e.shape.len() == 2 {
            e.shape[0]
        } else {
            e.shape.iter().product()
        }
    );

    // PNG of a 2-D int array: pixel values follow (v - min) / (max - min).
    let r = get(&app, "/api/v1/slice/fx/v2/compressor_none_i4?format=png&cmap=gray", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.header("content-type"), Some("image/png"));
    let (width, height, px) = png_rgba(&r.body);
    assert_eq!((height as u64, width as u64), (e.shape[0], e.shape[1]));
    let vals = f64s(&e.elements, "i4");
    let (lo, hi) = vals
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    // The automatic range is told in headers, so a viewer can draw its colour bar.
    assert_eq!(r.header("x-zarr-vmin"), Some(lo.to_string().as_str()));
    assert_eq!(r.header("x-zarr-vmax"), Some(hi.to_string().as_str()));
    for (i, v) in vals.iter().enumerate() {
        let want = ((v - lo) / (hi - lo) * 255.0).round() as u8;
        assert_eq!(px[i * 4], want, "pixel {i}");
        assert_eq!(px[i * 4 + 3], 255);
    }
    let r = get(
        &app,
        "/api/v1/slice/fx/v2/compressor_none_i4?format=png&vmin=0&vmax=1.5&cmap=viridis",
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.header("x-zarr-vmin"), r.header("x-zarr-vmax")),
        (Some("0"), Some("1.5"))
    );
    assert_eq!(
        r.header("x-zarr-shape"),
        Some(format!("{},{}", e.shape[0], e.shape[1]).as_str())
    );
}

/// The range's headers are short however large or small its ends: exponent form past 24
/// characters.
#[tokio::test]
async fn png_range_headers_stay_short() {
    let dir = tempfile::tempdir().unwrap();
    for (name, values) in [("wide", [-1e308f64, 1e308]), ("tiny", [0.0, 5e-324])] {
        write_v3_array(
            &dir.path().join(name),
            &[1, 2],
            &[1, 2],
            "float64",
            json!("NaN"),
            json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
        );
        std::fs::create_dir_all(dir.path().join(name).join("c/0")).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.path().join(name).join("c/0/0"), bytes).unwrap();
    }
    // float32 and float16 ends in the fewest digits of their own size, as JSON writes them.
    for (name, data_type, bytes) in [
        (
            "f4",
            "float32",
            [-3.692_276_5f32, 0.1]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        (
            "f2",
            "float16",
            [half::f16::from_f64(0.1), half::f16::from_f64(1.5)]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
    ] {
        write_v3_array(
            &dir.path().join(name),
            &[1, 2],
            &[1, 2],
            data_type,
            json!("NaN"),
            json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
        );
        std::fs::create_dir_all(dir.path().join(name).join("c/0")).unwrap();
        std::fs::write(dir.path().join(name).join("c/0/0"), bytes).unwrap();
    }
    let app = app_for(&[("m", dir.path())]);
    for (name, want) in [
        ("wide", ("-1e308", "1e308")),
        ("tiny", ("0", "5e-324")),
        ("f4", ("-3.6922765", "0.1")),
        ("f2", ("0.1", "1.5")),
    ] {
        let r = get(&app, &format!("/api/v1/slice/m/{name}?format=png"), &[]).await;
        assert_eq!(r.status, 200, "{name}");
        assert_eq!(
            (r.header("x-zarr-vmin"), r.header("x-zarr-vmax")),
            (Some(want.0), Some(want.1)),
            "{name}"
        );
    }
}

#[tokio::test]
async fn png_ranges_skip_infinities_and_a_null_fill_hides_nothing() {
    // v2, fill_value null, float32 [[0, 1], [2, inf]], uncompressed.
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let zarray = json!({
        "zarr_format": 2, "shape": [2, 2], "chunks": [2, 2], "dtype": "<f4", "order": "C",
        "fill_value": null, "compressor": null, "filters": null
    });
    std::fs::write(a.join(".zarray"), zarray.to_string()).unwrap();
    let values: Vec<u8> = [0f32, 1.0, 2.0, f32::INFINITY]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(a.join("0.0"), values).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let r = get(&app, "/api/v1/slice/m/a?format=png", &[]).await;
    assert_eq!(r.status, 200);
    // The range is of the finite values, zero included: zero is data here, not fill.
    assert_eq!(
        (r.header("x-zarr-vmin"), r.header("x-zarr-vmax")),
        (Some("0"), Some("2"))
    );
    let (_, _, px) = png_rgba(&r.body);
    let gray_alpha: Vec<(u8, u8)> = px.chunks(4).map(|p| (p[0], p[3])).collect();
    assert_eq!(gray_alpha, [(0, 255), (128, 255), (255, 255), (255, 255)]);
    // A non-finite vmin or vmax is refused.
    for q in ["vmin=NaN", "vmax=inf"] {
        let r = get(&app, &format!("/api/v1/slice/m/a?format=png&{q}"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (400, "bad_request"),
            "{q}"
        );
    }
}

/// The `_=<time>` cache buster of JavaScript clients is ignored everywhere queries are read;
/// other unknown parameters are 400 (errors_have_codes).
#[tokio::test]
async fn the_cache_buster_parameter_is_ignored() {
    let app = fixture_app();
    let plain = get(&app, "/api/v1/slice/fx/v2/compressor_none_i4?select=0:2", &[]).await;
    let busted = get(
        &app,
        "/api/v1/slice/fx/v2/compressor_none_i4?select=0:2&_=1700000000000",
        &[],
    )
    .await;
    assert_eq!((busted.status.as_u16(), &busted.body), (200, &plain.body));
    for uri in [
        "/api/v1/zom/fx/v2/group_nested?_=1",
        "/api/v1/zom/fx/v2/group_nested?depth=1&_=1",
        "/api/v1/zom-schema?zarr_format=2&_=1",
        "/api/v1/list/fx/v2?_=1",
        // As often as a client adds it, with or without a value, encoded or not.
        "/api/v1/list/fx/v2?_=1&_=2",
        "/api/v1/zom/fx/v2/group_nested?_&%5F=3&depth=0",
        "/api/v1/slice/fx/v2/compressor_none_i4?_=1&select=0:2&_=2",
    ] {
        assert_eq!(get(&app, uri, &[]).await.status, 200, "{uri}");
    }
}

/// The field names of every `Vary` line of `r`, lower-cased.
fn vary_tokens(r: &Reply) -> Vec<String> {
    r.headers
        .get_all("vary")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect()
}

#[tokio::test]
async fn errors_have_codes() {
    let app = fixture_app();
    let cases = [
        (
            "/api/v1/slice/fx/v2/compressor_none_i4?select=0:2:0",
            400,
            "bad_request",
        ),
        ("/api/v1/slice/fx/v2/compressor_none_i4?select=99", 400, "bad_request"),
        (
            "/api/v1/slice/fx/v2/compressor_none_i4?select=1,2,3",
            400,
            "bad_request",
        ),
        ("/api/v1/slice/fx/v2/compressor_none_i4?format=xml", 400, "bad_request"),
        (
            "/api/v1/slice/fx/v2/compressor_none_i4?cmap=jet&format=png",
            400,
            "bad_request",
        ),
        (
            "/api/v1/slice/fx/v2/compressor_none_i4?vmin=low&format=png",
            400,
            "bad_request",
        ),
        ("/api/v1/slice/fx/v2/compressor_none_i4?bogus=1", 400, "bad_request"),
        ("/api/v1/list/fx/v2?depth=1", 400, "bad_request"),
        ("/api/v1/zom/fx/v2?bogus=1", 400, "bad_request"),
        ("/api/v1/slice/fx/v2/compressor_none_i4?_x=1", 400, "bad_request"),
        (
            "/api/v1/slice/fx/v2/compressor_none_i4?vmin=2&vmax=1&format=png",
            400,
            "bad_request",
        ),
        (
            "/api/v1/slice/fx/v3/vlen_utf8_2d_missing?format=png",
            422,
            "unsupported",
        ),
        ("/api/v1/slice/fx/v2/object_json2?format=bin", 422, "unsupported"),
        ("/api/v1/slice/fx/v2/order_F_3d_f4?format=csv", 400, "bad_request"),
        ("/api/v1/slice/nope/x", 404, "unknown_mount"),
        ("/api/v1/slice/fx/v2/no_such_array", 404, "not_found"),
        ("/api/v1/slice/fx/v2/group_nested", 404, "not_found"),
        ("/api/v1/slice/fx/..%2f..%2fetc", 400, "invalid_path"),
    ];
    for (uri, status, code) in cases {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, status, "{uri}: {:?}", r.body);
        assert_eq!(r.error_code(), code, "{uri}");
        assert!(!r.json()["error"]["message"].as_str().unwrap().is_empty());
    }
    // A format chosen by Accept may be the one refused: a shared cache must not give this error
    // to a request that accepts another format.
    let r = get(&app, "/api/v1/slice/fx/v2/order_F_3d_f4", &[("accept", "text/csv")]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (400, "bad_request"));
    let vary = vary_tokens(&r);
    assert!(vary.contains(&"accept".to_owned()), "{vary:?}");
    assert_eq!(get(&app, "/api/v1/slice/fx/v2/order_F_3d_f4", &[]).await.status, 200);
}

#[tokio::test]
async fn bad_stored_data_is_a_clear_error_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    write_v3_array(&dir.path().join("short"), &[4], &[4], "int32", json!(0), bytes.clone());
    std::fs::create_dir_all(dir.path().join("short/c")).unwrap();
    std::fs::write(dir.path().join("short/c/0"), [1, 2, 3]).unwrap();
    write_v3_array(
        &dir.path().join("weird"),
        &[4],
        &[4],
        "int32",
        json!(0),
        json!([{"name": "bytes"}, {"name": "rot13"}]),
    );
    write_v3_array(&dir.path().join("odd"), &[4], &[4], "int7", json!(0), bytes.clone());
    std::fs::create_dir_all(dir.path().join("broken")).unwrap();
    std::fs::write(dir.path().join("broken/zarr.json"), b"{not json").unwrap();
    write_v3_array(
        &dir.path().join("gz"),
        &[4],
        &[4],
        "int32",
        json!(0),
        json!([{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}]),
    );
    std::fs::create_dir_all(dir.path().join("gz/c")).unwrap();
    std::fs::write(dir.path().join("gz/c/0"), b"definitely not gzip").unwrap();
    let app = app_for(&[("t", dir.path())]);
    let r = get(&app, "/api/v1/slice/t/short", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("short/c/0"),
        "names the key"
    );
    let r = get(&app, "/api/v1/slice/t/gz", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    // An empty chunk file is read (no range fits zero bytes) and is a short chunk, locally and
    // through a store read by requests.
    write_v3_array(&dir.path().join("empty"), &[4], &[4], "int32", json!(0), bytes.clone());
    std::fs::create_dir_all(dir.path().join("empty/c")).unwrap();
    std::fs::write(dir.path().join("empty/c/0"), b"").unwrap();
    let (counted, _, _) = counting_app(dir.path(), zarrgate::config::Config::default());
    for app in [&app, &counted] {
        let uri = if std::ptr::eq(app, &counted) {
            "/api/v1/slice/m/empty"
        } else {
            "/api/v1/slice/t/empty"
        };
        let r = get(app, uri, &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (500, "corrupt_data"),
            "{uri}"
        );
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("empty/c/0"));
    }
    let r = get(&app, "/api/v1/slice/t/weird", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (422, "unsupported"));
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("rot13"));
    let r = get(&app, "/api/v1/slice/t/odd", &[]).await;
    assert_eq!(r.status, 422);
    let r = get(&app, "/api/v1/slice/t/broken", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    // Errors are not cached and nothing else is affected.
    std::fs::write(
        dir.path().join("short/c/0"),
        [1u8, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0],
    )
    .unwrap();
    let r = get(&app, "/api/v1/slice/t/short", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"], json!([1, 2, 3, 4]));
}

/// What a format cannot hold is refused before a chunk is read, and an empty selection of a
/// vast array is an empty answer when its JSON holds few lists.
#[tokio::test]
async fn formats_are_checked_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    // 100 chunks, none stored: each would be one (missing) read.
    write_v3_array(
        &dir.path().join("cube"),
        &[10, 10, 10],
        &[1, 1, 10],
        "float32",
        json!(0.0),
        json!([{"name": "bytes"}]),
    );
    write_v3_array(
        &dir.path().join("wide"),
        &[10, 100_000_000],
        &[1, 1_000_000],
        "uint8",
        json!(0),
        json!([{"name": "bytes"}]),
    );
    let (app, _, reads) = counting_app(dir.path(), config_with(&[]));
    let reads = move || reads.load(std::sync::atomic::Ordering::SeqCst);
    for (query, status) in [
        ("format=png", 400),
        ("format=csv", 400),
        ("select=0&format=png&vmin=1&vmax=0", 400),
    ] {
        let before = reads();
        let r = get(&app, &format!("/api/v1/slice/m/cube?{query}"), &[]).await;
        assert_eq!(r.status, status, "{query}: {:?}", r.body);
        assert!(reads() - before <= 2, "{query}: {} reads", reads() - before);
    }
    let r = get(&app, "/api/v1/slice/m/cube?select=0&format=png", &[]).await;
    assert_eq!(r.status, 200);
    // vmin and vmax are PNG's: other formats do not look at them.
    let r = get(&app, "/api/v1/slice/m/cube?select=0,0&vmin=2&vmax=1", &[]).await;
    assert_eq!(r.status, 200);
    // A client that accepts other formats too gets the best that can hold the result: a 3-D
    // result is no csv or png, a 2-D one is.
    for (accept, select, want) in [
        ("text/csv, application/json;q=0.9", "", "application/json"),
        ("image/png, */*;q=0.8", "", "application/json"),
        (
            "image/png, application/octet-stream;q=0.5, */*;q=0.1",
            "",
            "application/octet-stream",
        ),
        ("image/png, */*;q=0.8", "select=0", "image/png"),
        (
            "text/csv, application/json;q=0.9",
            "select=0",
            "text/csv; charset=utf-8",
        ),
    ] {
        let r = get(&app, &format!("/api/v1/slice/m/cube?{select}"), &[("accept", accept)]).await;
        assert_eq!(r.status, 200, "{accept} {select}: {:?}", r.body);
        assert_eq!(r.header("content-type"), Some(want), "{accept} {select}");
    }
    // Accept on several lines is one list (RFC 9110 section 5.3): the best of them all wins.
    let r = get(
        &app,
        "/api/v1/slice/m/cube?select=0",
        &[("accept", "text/csv;q=0.1"), ("accept", "image/png")],
    )
    .await;
    assert_eq!(r.header("content-type"), Some("image/png"));
    // One it cannot hold and nothing else: refused, saying why.
    let r = get(&app, "/api/v1/slice/m/cube", &[("accept", "text/csv")]).await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("csv"),
        "{:?}",
        r.body
    );
    // [0, 100000000] as JSON is one empty list.
    let r = get(&app, "/api/v1/slice/m/wide?select=0:0", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["data"], json!([]));
    assert_eq!(r.json()["shape"], json!([0, 100_000_000]));
}

/// Chunks that decode to more than 1 GiB each are not read: 422 for a GET and a HEAD alike,
/// whatever is selected of them, with nothing but the metadata read.
#[tokio::test]
async fn chunks_over_a_gibibyte_are_refused_by_head_and_get() {
    let dir = tempfile::tempdir().unwrap();
    // One 32768 x 32768 uint16 chunk: 2 GiB decoded.
    write_v3_array(
        &dir.path().join("big"),
        &[32768, 32768],
        &[32768, 32768],
        "uint16",
        json!(0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let (app, _, gets) = counting_app(dir.path(), Config::default());
    for method in ["GET", "HEAD"] {
        for select in ["0,0:2", "0:0,0:0"] {
            let r = request(&app, method, &format!("/api/v1/slice/m/big?select={select}"), &[]).await;
            assert_eq!(r.status, 422, "{method} {select}");
            if method == "GET" {
                assert_eq!(r.error_code(), "unsupported");
                let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
                assert!(message.contains("2147483648 bytes"), "{message}");
            }
        }
    }
    assert_eq!(gets.load(Ordering::SeqCst), 1, "only the metadata was read");
}

#[tokio::test]
async fn a_huge_sparse_request_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // 100000 x 100000 float64 = 80 GB, no chunk written.
    write_v3_array(
        &dir.path().join("huge"),
        &[100_000, 100_000],
        &[1000, 1000],
        "float64",
        json!("NaN"),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let (app, _, gets) = counting_app(dir.path(), Config::default());
    let start = std::time::Instant::now();
    let r = get(&app, "/api/v1/slice/m/huge", &[]).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.error_code(), "too_large");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("80000000000 bytes")
    );
    assert_eq!(gets.load(Ordering::SeqCst), 1, "only the metadata was read");
    assert!(start.elapsed().as_secs() < 5);
    // A small part of it reads as fill.
    let r = get(&app, "/api/v1/slice/m/huge?select=5,10:13", &[]).await;
    assert_eq!(r.json()["data"], json!(["NaN", "NaN", "NaN"]));
    // As an image, each pixel takes 4 bytes whatever the data's type: 40 MB of bytes is a
    // 160 MB image, above a 100 MB limit.
    write_v3_array(
        &dir.path().join("bytes"),
        &[100_000, 100_000],
        &[1000, 1000],
        "uint8",
        json!(0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let mut config = Config::default();
    config.limits.max_slice_bytes = 100_000_000;
    let (app, _, gets) = counting_app(dir.path(), config);
    let r = get(&app, "/api/v1/slice/m/bytes?select=0:5000,0:8000&format=png", &[]).await;
    assert_eq!(r.status, 413);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("40000000 pixels of 4 bytes, 160000000 bytes"),
        "{:?}",
        r.json()
    );
    assert_eq!(gets.load(Ordering::SeqCst), 1, "only the metadata was read");
    let r = get(&app, "/api/v1/slice/m/bytes?select=0:5000,0:8000&format=bin", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 40_000_000);
    let r = get(&app, "/api/v1/slice/m/bytes?select=0:50,0:80&format=png", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/png"));
}

#[tokio::test]
async fn json_counts_the_field_names_it_writes_with_every_element() {
    let dir = tempfile::tempdir().unwrap();
    // One byte an element, written as {"<1000 letters>":0}: 1004 bytes of JSON each.
    let name = "f".repeat(1000);
    let a = dir.path().join("named");
    std::fs::create_dir_all(&a).unwrap();
    let zarray = json!({"zarr_format": 2, "shape": [100000], "chunks": [1000], "dtype": [[name, "|u1"]],
        "compressor": null, "filters": null, "fill_value": null, "order": "C"});
    std::fs::write(a.join(".zarray"), zarray.to_string()).unwrap();
    let mut config = Config::default();
    config.limits.max_slice_bytes = 10_000_000;
    let (app, _, gets) = counting_app(dir.path(), config);
    // An empty selection reads the metadata documents (then cached) and no chunk.
    assert_eq!(get(&app, "/api/v1/slice/m/named?select=0:0", &[]).await.status, 200);
    let before = gets.load(Ordering::SeqCst);
    let r = get(&app, "/api/v1/slice/m/named", &[]).await;
    assert_eq!(r.status, 413);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("100400000 bytes") && message.contains("1003 bytes an element"),
        "{message}"
    );
    assert_eq!(gets.load(Ordering::SeqCst), before, "refused before reading a chunk");
    // As bytes it is 100 kB; a few elements as JSON are fine.
    assert_eq!(
        get(&app, "/api/v1/slice/m/named?format=bin", &[]).await.body.len(),
        100_000
    );
    let r = get(&app, "/api/v1/slice/m/named?select=0:2", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"], json!([{name.as_str(): 0}, {name.as_str(): 0}]));
}

/// An app serving `mounts` with `limits.max_slice_bytes` set to `max`.
fn limited_app(mounts: &[(&str, &std::path::Path)], max: u64) -> zarrgate::App {
    let mut config = config_with(mounts);
    config.limits.max_slice_bytes = max;
    zarrgate::app(zarrgate::AppState::from_config(config).unwrap())
}

#[tokio::test]
async fn sizes_known_only_after_reading_or_from_the_shape_are_limited_too() {
    // An empty selection of a tall array: no element, but JSON would write one `[]` for each of
    // its 2^40 rows.
    let dir = tempfile::tempdir().unwrap();
    write_v3_array(
        &dir.path().join("tall"),
        &[1 << 40, 4],
        &[1 << 20, 4],
        "float32",
        json!(0.0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let (app, _, gets) = counting_app(dir.path(), Config::default());
    let start = std::time::Instant::now();
    let r = get(&app, "/api/v1/slice/m/tall?select=:,0:0", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1099511627776 nested empty lists")
    );
    assert!(start.elapsed().as_secs() < 5);
    assert_eq!(gets.load(Ordering::SeqCst), 1, "only the metadata was read");
    // The same selection in binary is empty, and a few rows are a few lists.
    let r = get(&app, "/api/v1/slice/m/tall?select=:,0:0&format=bin", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("x-zarr-shape"), Some("1099511627776,0"));
    let r = get(&app, "/api/v1/slice/m/tall?select=0:3,0:0", &[]).await;
    assert_eq!(r.json()["data"], json!([[], [], []]));

    // Variable-length strings count what they take before reading: 24 bytes each with the
    // empty fill (168 for these 7); then, as each chunk is copied in, their 41 bytes of UTF-8.
    let limited = |max| limited_app(&[("fx", &fixtures())], max);
    let r = get(&limited(160), "/api/v1/slice/fx/v3/vlen_utf8", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("168 bytes decoded")
    );
    let r = get(&limited(208), "/api/v1/slice/fx/v3/vlen_utf8", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("limit of 208 bytes (their contents more than the 40 bytes"),
        "{message}"
    );
    let app = limited(209);
    let r = get(&app, "/api/v1/slice/fx/v3/vlen_utf8", &[]).await;
    assert_eq!(r.status, 200);
    let Elements::Strings(want) = expected("v3/vlen_utf8").elements else {
        panic!()
    };
    assert_eq!(r.json()["data"], json!(want));
    // As npy all 7 are widened to the longest ("epsilon", UTF-32): 7 x 7 x 4 = 196 bytes.
    let r = get(&app, "/api/v1/slice/fx/v3/vlen_utf8?format=npy", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-zarr-dtype"), Some("<U7"));
    // Two strings of 100 characters: 48 bytes before reading, and 200 more once read, counted
    // as each chunk is copied into the result.
    write_v3_array(
        &dir.path().join("long"),
        &[2],
        &[2],
        "string",
        json!(""),
        json!([{"name": "vlen-utf8", "configuration": {}}]),
    );
    let mut chunk = 2u32.to_le_bytes().to_vec();
    for c in ["x", "y"] {
        chunk.extend(100u32.to_le_bytes());
        chunk.extend(c.repeat(100).as_bytes());
    }
    std::fs::create_dir_all(dir.path().join("long/c")).unwrap();
    std::fs::write(dir.path().join("long/c/0"), chunk).unwrap();
    let app = limited_app(&[("m", dir.path())], 150);
    let r = get(&app, "/api/v1/slice/m/long", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("take more than the limit of 150 bytes (their contents more than the 102 bytes")
    );
    let r = get(&app, "/api/v1/slice/m/long?select=1", &[]).await;
    assert_eq!(r.json()["data"], json!("y".repeat(100)));
    // Held, they are 248 bytes; widened to fixed width for npy, 2 x 100 x 4 = 800.
    let app = limited_app(&[("m", dir.path())], 300);
    assert_eq!(get(&app, "/api/v1/slice/m/long", &[]).await.status, 200);
    let r = get(&app, "/api/v1/slice/m/long?format=npy", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("800 bytes as npy"), "{message}");
    // 200 chunks of 10 strings of 1000 characters (2 MB in all, 48 kB before reading) under a
    // 100 kB limit: refused once the chunks copied so far pass it, not after all of them are
    // in memory.
    write_v3_array(
        &dir.path().join("many"),
        &[2000],
        &[10],
        "string",
        json!(""),
        json!([{"name": "vlen-utf8", "configuration": {}}]),
    );
    std::fs::create_dir_all(dir.path().join("many/c")).unwrap();
    for k in 0..200 {
        let mut chunk = 10u32.to_le_bytes().to_vec();
        for _ in 0..10 {
            chunk.extend(1000u32.to_le_bytes());
            chunk.extend("s".repeat(1000).as_bytes());
        }
        std::fs::write(dir.path().join(format!("many/c/{k}")), chunk).unwrap();
    }
    let app = limited_app(&[("m", dir.path())], 100_000);
    let r = get(&app, "/api/v1/slice/m/many", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("limit of 100000 bytes (their contents more than the 52000 bytes"),
        "{message}"
    );
    let r = get(&app, "/api/v1/slice/m/many?select=0:40", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][39], json!("s".repeat(1000)));

    // 2^25 missing strings whose fill is 4 KiB: the result would hold 2^25 copies of the fill
    // (138 GB) before a chunk is read; refused at once.
    write_v3_array(
        &dir.path().join("filled"),
        &[1 << 25],
        &[1024],
        "string",
        json!("f".repeat(4096)),
        json!([{"name": "vlen-utf8", "configuration": {}}]),
    );
    let (app, _, gets) = counting_app(dir.path(), Config::default());
    let r = get(&app, "/api/v1/slice/m/filled", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert_eq!(gets.load(Ordering::SeqCst), 1, "only the metadata was read");
    let r = get(&app, "/api/v1/slice/m/filled?select=5:7", &[]).await;
    assert_eq!(r.json()["data"], json!(["f".repeat(4096), "f".repeat(4096)]));

    // A shard of 2^28 strings that is gzipped whole (so it is decoded whole), all of them
    // missing: 16 bytes of index that would fill 6 GiB of elements. Refused, not allocated, as
    // any stored unit that decodes past its limit is (a decompression bomb).
    write_v3_array(
        &dir.path().join("shardbomb"),
        &[1 << 28],
        &[1 << 28],
        "string",
        json!(""),
        json!([
            {"name": "sharding_indexed", "configuration": {
                "chunk_shape": [1 << 28],
                "codecs": [{"name": "vlen-utf8", "configuration": {}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]
            }},
            {"name": "gzip", "configuration": {"level": 1}}
        ]),
    );
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &[0xff; 16]).unwrap();
    std::fs::create_dir_all(dir.path().join("shardbomb/c")).unwrap();
    std::fs::write(dir.path().join("shardbomb/c/0"), gz.finish().unwrap()).unwrap();
    let start = std::time::Instant::now();
    let r = get(&app, "/api/v1/slice/m/shardbomb?select=0:2", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.error_code().as_str()),
        (500, "corrupt_data"),
        "{:?}",
        r.body
    );
    assert!(start.elapsed().as_secs() < 5);
}

/// The values of a streamed JSON or CSV response of a 2-D float result, flat in C order,
/// after checking that it was streamed (sent without a length) and that its rows have
/// `shape[1]` values each (JSON: inside `outer` lists of one element).
fn streamed_text_values(r: &Reply, format: &str, shape: [u64; 2], outer: usize) -> Vec<f64> {
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), None, "streamed: no length known in advance");
    let rows: Vec<Vec<f64>> = if format == "json" {
        let doc: Value = serde_json::from_slice(&r.body).unwrap();
        let mut want_shape = vec![1; outer];
        want_shape.extend(shape);
        assert_eq!(doc["shape"], json!(want_shape));
        let mut data = &doc["data"];
        for _ in 0..outer {
            assert_eq!(data.as_array().unwrap().len(), 1);
            data = &data[0];
        }
        let rows = data.as_array().unwrap();
        rows.iter()
            .map(|row| row.as_array().unwrap().iter().map(json_number).collect())
            .collect()
    } else {
        let text = std::str::from_utf8(&r.body).unwrap();
        assert!(text.ends_with('\n'));
        text.lines()
            .map(|line| line.split(',').map(|v| v.parse::<f64>().unwrap()).collect())
            .collect()
    };
    assert_eq!(rows.len() as u64, shape[0], "{format} rows");
    assert!(
        rows.iter().all(|row| row.len() as u64 == shape[1]),
        "{format} row lengths"
    );
    rows.concat()
}

/// Streamed responses are sent after the request limit has let their requests go: they take
/// permits of their own, held by the body until it is sent or dropped; with none left, 503.
/// Every stream permit of `state`, held until dropped: the server is as busy as it lets itself be.
async fn every_turn(state: &zarrgate::AppState) -> tokio::sync::OwnedSemaphorePermit {
    let all = zarrgate::state::MAX_STREAMS as u32;
    state.streams.clone().acquire_many_owned(all).await.unwrap()
}

#[tokio::test]
async fn streamed_responses_take_turns() {
    use tower::ServiceExt;
    use zarrgate::state::MAX_STREAMS;
    let dir = tempfile::tempdir().unwrap();
    // 12 MB of fill (no chunk stored): more than a band, so streamed.
    write_v3_array(
        &dir.path().join("big"),
        &[3000, 1000],
        &[500, 500],
        "float32",
        json!(0.0),
        json!([{"name": "bytes"}]),
    );
    let state = zarrgate::AppState::from_config(config_with(&[("m", dir.path())])).unwrap();
    let app = zarrgate::app(state.clone());
    let uri = "/api/v1/slice/m/big?format=bin";
    let request = || axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        state.streams.available_permits(),
        MAX_STREAMS - 1,
        "the body holds a permit"
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    assert_eq!(body.len(), 12_000_000);
    assert_eq!(
        state.streams.available_permits(),
        MAX_STREAMS,
        "sent: the permit is back"
    );
    let response = app.clone().oneshot(request()).await.unwrap();
    drop(response);
    assert_eq!(
        state.streams.available_permits(),
        MAX_STREAMS,
        "dropped: the permit is back"
    );
    let every = every_turn(&state).await;
    let r = get(&app, uri, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "overloaded"));
    assert!(r.header("retry-after").is_some());
    // Small slices do not stream and need no permit.
    assert_eq!(get(&app, "/api/v1/slice/m/big?select=0:10,0:10", &[]).await.status, 200);
    drop(every);
    assert_eq!(get(&app, uri, &[]).await.body.len(), 12_000_000);
}

/// A response answered whole (here a png) over a band's size takes a stream permit too, held by
/// its body, which is sent in pieces: clients that did not read held such bodies past every
/// limit.
#[tokio::test]
async fn large_whole_responses_take_turns() {
    use tower::ServiceExt;
    use zarrgate::state::MAX_STREAMS;
    let dir = tempfile::tempdir().unwrap();
    // 3000 x 3000 bytes of noise, stored raw: its png (gray and alpha) is about 9 MB (noise
    // does not compress).
    let n = 3000usize;
    write_v3_array(
        &dir.path().join("noise"),
        &[n as u64, n as u64],
        &[n as u64, n as u64],
        "uint8",
        json!(0),
        json!([{"name": "bytes"}]),
    );
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..n * n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::create_dir_all(dir.path().join("noise/c/0")).unwrap();
    std::fs::write(dir.path().join("noise/c/0/0"), &noise).unwrap();
    let state = zarrgate::AppState::from_config(config_with(&[("m", dir.path())])).unwrap();
    let app = zarrgate::app(state.clone());
    let uri = "/api/v1/slice/m/noise?format=png";
    let request = || axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap();
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    let length: usize = response.headers()["content-length"].to_str().unwrap().parse().unwrap();
    assert!(length > 8 << 20, "{length}");
    assert_eq!(
        state.streams.available_permits(),
        MAX_STREAMS - 1,
        "the body holds a permit"
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    assert_eq!(body.len(), length);
    assert_eq!(
        state.streams.available_permits(),
        MAX_STREAMS,
        "sent: the permit is back"
    );
    let (width, height, rgba) = png_rgba(&body);
    assert_eq!((width, height), (n as u32, n as u32));
    // The range spans the values besides the fill (0, transparent).
    let lo = *noise.iter().filter(|&&v| v != 0).min().unwrap();
    let hi = *noise.iter().max().unwrap();
    for k in (0..n * n).step_by(9973) {
        let v = noise[k];
        if v == 0 {
            assert_eq!(rgba[k * 4 + 3], 0, "pixel {k}");
        } else {
            let gray = ((f64::from(v) - f64::from(lo)) / f64::from(hi - lo) * 255.0).round() as u8;
            assert_eq!(rgba[k * 4..k * 4 + 4], [gray, gray, gray, 255], "pixel {k}");
        }
    }
    let every = every_turn(&state).await;
    let r = get(&app, uri, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "overloaded"));
    // The permit is taken before the region is read: a server with none left reads nothing.
    let fresh = zarrgate::AppState::from_config(config_with(&[("m", dir.path())])).unwrap();
    let fresh_app = zarrgate::app(fresh.clone());
    let _every_fresh = every_turn(&fresh).await;
    let r = get(&fresh_app, uri, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "overloaded"));
    let text = String::from_utf8(get(&fresh_app, "/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(
        text.contains("zarrgate_cache_misses_total{cache=\"chunks\"} 0"),
        "{text}"
    );
    // Smaller whole responses need no permit.
    assert_eq!(
        get(&app, "/api/v1/slice/m/noise?select=0:100,0:100&format=png", &[])
            .await
            .status,
        200
    );
    drop(every);
}

#[tokio::test]
async fn large_responses_stream_and_match() {
    let dir = tempfile::tempdir().unwrap();
    // 3000 x 1000 float32 (12 MB) in 500 x 500 chunks: more than one band.
    let (rows, cols, ch) = (3000u64, 1000u64, 500u64);
    write_v3_array(
        &dir.path().join("big"),
        &[rows, cols],
        &[ch, ch],
        "float32",
        json!(0.0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let value = |i: u64, j: u64| (i * cols + j) as f32;
    for ci in 0..rows / ch {
        for cj in 0..cols / ch {
            let mut chunk = Vec::with_capacity((ch * ch * 4) as usize);
            for i in 0..ch {
                for j in 0..ch {
                    chunk.extend(value(ci * ch + i, cj * ch + j).to_le_bytes());
                }
            }
            let p = dir.path().join(format!("big/c/{ci}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join(cj.to_string()), chunk).unwrap();
        }
    }
    let app = app_for(&[("t", dir.path())]);
    let r = get(&app, "/api/v1/slice/t/big?format=bin&select=1:2999:1,::3", &[]).await;
    assert_eq!(r.status, 200);
    let n_cols = cols.div_ceil(3);
    assert_eq!(r.body.len() as u64, 2998 * n_cols * 4);
    assert_eq!(
        r.header("content-length"),
        Some((2998 * n_cols * 4).to_string().as_str())
    );
    for (k, c) in r.body.chunks_exact(4).enumerate().step_by(997) {
        let (i, j) = (1 + k as u64 / n_cols, 3 * (k as u64 % n_cols));
        assert_eq!(f32::from_le_bytes(c.try_into().unwrap()), value(i, j), "element {k}");
    }
    let r = get(&app, "/api/v1/slice/t/big?format=npy", &[]).await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &r.body).unwrap();
    let back = load_npy(file.path());
    assert_eq!(back.shape, [rows, cols]);
    let Elements::Fixed(b) = back.elements else { panic!() };
    assert_eq!(
        f32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()),
        value(rows - 1, cols - 1)
    );

    // A plane of a 3-D array (8.4 MB) selected by an integer, or a slice of one: streamed in
    // bands along its second dimension, as a 2-D array is along its first.
    let (rows, cols) = (2100u64, 1000u64);
    let value = write_cube(dir.path());
    for (select, shape, outer) in [("1,:,:", "2100,1000", 0), ("1:2,:,:", "1,2100,1000", 1)] {
        let r = get(&app, &format!("/api/v1/slice/t/cube?format=bin&select={select}"), &[]).await;
        assert_eq!(r.status, 200, "{select}");
        assert_eq!(r.header("x-zarr-shape"), Some(shape));
        assert_eq!(r.body.len() as u64, rows * cols * 4, "{select}");
        for (k, c) in r.body.chunks_exact(4).enumerate().step_by(7919) {
            let (i, j) = (k as u64 / cols, k as u64 % cols);
            assert_eq!(
                f32::from_le_bytes(c.try_into().unwrap()),
                value(1, i, j),
                "{select} element {k}"
            );
        }
        // As JSON, with the leading dimension of length 1 kept as a list or dropped by the
        // integer; as CSV, which holds two dimensions at most (said before anything streams).
        let formats: &[&str] = if outer == 0 { &["json", "csv"] } else { &["json"] };
        for &format in formats {
            let r = get(
                &app,
                &format!("/api/v1/slice/t/cube?format={format}&select={select}"),
                &[],
            )
            .await;
            let got = streamed_text_values(&r, format, [rows, cols], outer);
            for (k, &v) in got.iter().enumerate() {
                let (i, j) = (k as u64 / cols, k as u64 % cols);
                assert_eq!(v, value(1, i, j) as f64, "{format} {select} ({i}, {j})");
            }
        }
    }
    let r = get(&app, "/api/v1/slice/t/cube?format=csv&select=1:2,:,:", &[]).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_code(), "bad_request");
}

/// Writes `cube`, a 2 x 2100 x 1000 float32 array in 1 x 300 x 500 chunks whose element
/// (p, i, j) is the value the returned function gives.
fn write_cube(root: &std::path::Path) -> impl Fn(u64, u64, u64) -> f32 {
    let (planes, rows, cols) = (2u64, 2100u64, 1000u64);
    let (crow, ccol) = (300u64, 500u64);
    write_v3_array(
        &root.join("cube"),
        &[planes, rows, cols],
        &[1, crow, ccol],
        "float32",
        json!(0.0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    let value = move |p: u64, i: u64, j: u64| (p * 10_000_000 + i * cols + j) as f32;
    for p in 0..planes {
        for ci in 0..rows / crow {
            for cj in 0..cols / ccol {
                let mut chunk = Vec::with_capacity((crow * ccol * 4) as usize);
                for i in 0..crow {
                    for j in 0..ccol {
                        chunk.extend(value(p, ci * crow + i, cj * ccol + j).to_le_bytes());
                    }
                }
                let d = root.join(format!("cube/c/{p}/{ci}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join(cj.to_string()), chunk).unwrap();
            }
        }
    }
    value
}

/// Writes `big` (chunked) and `big_sharded` (shards of 200 x 10000 holding 50 x 5000 inner
/// chunks, index at the end without checksum) of a 300 x 20000 float32 array with values
/// `i * 20000 + j`, leaving out the chunks and inner chunks `missing` says; the fill is 7.5.
fn write_wide_arrays(root: &std::path::Path, missing: impl Fn(u64, u64) -> bool) {
    let (rows, cols) = (300u64, 20000u64);
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    let block = |r0: u64, c0: u64, nr: u64, nc: u64| -> Vec<u8> {
        let mut out = Vec::with_capacity((nr * nc * 4) as usize);
        for i in r0..r0 + nr {
            for j in c0..c0 + nc {
                out.extend(((i * cols + j) as f32).to_le_bytes());
            }
        }
        out
    };
    write_v3_array(
        &root.join("big"),
        &[rows, cols],
        &[100, 5000],
        "float32",
        json!(7.5),
        raw.clone(),
    );
    for ci in 0..3 {
        for cj in 0..4 {
            if !missing(ci * 100, cj * 5000) {
                let p = root.join(format!("big/c/{ci}"));
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join(cj.to_string()), block(ci * 100, cj * 5000, 100, 5000)).unwrap();
            }
        }
    }
    let sharding = json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [50, 5000], "codecs": raw, "index_location": "end",
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}]);
    write_v3_array(
        &root.join("big_sharded"),
        &[rows, cols],
        &[200, 10000],
        "float32",
        json!(7.5),
        sharding,
    );
    for si in 0..2 {
        for sj in 0..2 {
            let (mut data, mut index) = (Vec::new(), Vec::new());
            for ii in 0..4 {
                for ij in 0..2 {
                    let (r0, c0) = (si * 200 + ii * 50, sj * 10000 + ij * 5000);
                    if r0 >= rows || missing(r0, c0) {
                        index.extend([u64::MAX.to_le_bytes(), u64::MAX.to_le_bytes()].concat());
                        continue;
                    }
                    let b = block(r0, c0, 50, 5000);
                    index.extend([(data.len() as u64).to_le_bytes(), (b.len() as u64).to_le_bytes()].concat());
                    data.extend(b);
                }
            }
            data.extend(index);
            let p = root.join(format!("big_sharded/c/{si}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join(sj.to_string()), data).unwrap();
        }
    }
}

#[tokio::test]
async fn streamed_responses_hold_every_element_of_wide_sharded_and_sparse_arrays() {
    let dir = tempfile::tempdir().unwrap();
    // Missing: the chunk at rows 100..200, columns 5000..10000, and the inner chunks it holds.
    let missing = |r0: u64, c0: u64| (100..200).contains(&r0) && (5000..10000).contains(&c0);
    write_wide_arrays(dir.path(), missing);
    let app = app_for(&[("t", dir.path())]);
    let value = |i: u64, j: u64| {
        if missing(i / 50 * 50, j / 5000 * 5000) {
            7.5
        } else {
            (i * 20000 + j) as f32
        }
    };
    // Rows of 80 KB (more than one body buffer each), steps on either dimension; all above
    // the 8 MiB that makes a response stream: as bytes, and as JSON or CSV text.
    for array in ["big", "big_sharded"] {
        for (select, starts, steps, counts, text) in [
            ("1:300,::2", [1u64, 0], [1u64, 2], [299u64, 10000], "json"),
            ("1:300:2,:", [1, 0], [2, 1], [150, 20000], "csv"),
            (":,:", [0, 0], [1, 1], [300, 20000], ""),
        ] {
            let at = |k: usize| {
                let (a, b) = (k as u64 / counts[1], k as u64 % counts[1]);
                (starts[0] + a * steps[0], starts[1] + b * steps[1])
            };
            if !text.is_empty() {
                let url = format!("/api/v1/slice/t/{array}?format={text}&select={select}");
                let got = streamed_text_values(&get(&app, &url, &[]).await, text, counts, 0);
                for (k, &v) in got.iter().enumerate() {
                    let (i, j) = at(k);
                    assert_eq!(v, value(i, j) as f64, "{array} {text} {select}: element ({i}, {j})");
                }
            }
            let r = get(
                &app,
                &format!("/api/v1/slice/t/{array}?format=bin&select={select}"),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "{array} {select}");
            assert_eq!(r.body.len() as u64, counts[0] * counts[1] * 4, "{array} {select}");
            for (k, c) in r.body.chunks_exact(4).enumerate() {
                let (i, j) = at(k);
                let got = f32::from_le_bytes(c.try_into().unwrap());
                assert_eq!(got, value(i, j), "{array} {select}: element ({i}, {j})");
            }
        }
        let r = get(&app, &format!("/api/v1/slice/t/{array}?format=npy"), &[]).await;
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &r.body).unwrap();
        let back = load_npy(file.path());
        assert_eq!(back.shape, [300, 20000]);
        let Elements::Fixed(b) = back.elements else { panic!() };
        for (k, c) in b.chunks_exact(4).enumerate() {
            let (i, j) = (k as u64 / 20000, k as u64 % 20000);
            assert_eq!(
                f32::from_le_bytes(c.try_into().unwrap()),
                value(i, j),
                "{array} npy ({i}, {j})"
            );
        }
    }
}

/// A strided selection that takes little of each of many chunks (here 1/8 of a row of 64
/// chunks of 4 MiB) streams the values of a region assembled as the chunks arrive, not one
/// held whole: the same bytes, as bin and CSV, with the fill where chunks are missing.
#[tokio::test]
async fn sparse_strided_streams_hold_the_region_not_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    let (rows, cols, chunk_cols) = (4096u64, 65536u64, 1024u64);
    write_v3_array(
        &dir.path().join("wide"),
        &[rows, cols],
        &[rows, chunk_cols],
        "uint8",
        json!(9),
        raw,
    );
    let value = |r: u64, c: u64| ((r * 31 + c * 7) % 251) as u8;
    let stored = [0u64, 5, 17, 63];
    std::fs::create_dir_all(dir.path().join("wide/c/0")).unwrap();
    for &cj in &stored {
        let mut chunk = Vec::with_capacity((rows * chunk_cols) as usize);
        for r in 0..rows {
            chunk.extend((0..chunk_cols).map(|c| value(r, cj * chunk_cols + c)));
        }
        std::fs::write(dir.path().join(format!("wide/c/0/{cj}")), chunk).unwrap();
    }
    let want = |r: u64, c: u64| {
        if stored.contains(&(c / chunk_cols)) {
            value(r, c)
        } else {
            9
        }
    };
    let app = app_for(&[("t", dir.path())]);
    // 32 MiB of result from 256 MiB of chunks.
    let r = get(&app, "/api/v1/slice/t/wide?format=bin&select=:,3::8", &[]).await;
    assert_eq!(r.status, 200);
    let width = cols / 8;
    assert_eq!(r.body.len() as u64, rows * width);
    for (k, &got) in r.body.iter().enumerate() {
        let (i, j) = (k as u64 / width, 3 + k as u64 % width * 8);
        assert_eq!(got, want(i, j), "element ({i}, {j})");
    }
    // As text, in rows: a few rows checked.
    let r = get(&app, "/api/v1/slice/t/wide?format=csv&select=100:4000:1300,::64", &[]).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    for (a, line) in lines.iter().enumerate() {
        let i = 100 + a as u64 * 1300;
        let got: Vec<u8> = line.split(',').map(|v| v.parse().unwrap()).collect();
        let expect: Vec<u8> = (0..cols / 64).map(|b| want(i, b * 64)).collect();
        assert_eq!(got, expect, "row {i}");
    }
}

#[tokio::test]
async fn streamed_text_of_bands_of_one_row() {
    // A band is whole rows of chunks; when the last one, or every one, holds a single row of
    // the result, its text is still written as rows of the result.
    let dir = tempfile::tempdir().unwrap();
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    // 601 x 4096 float32 in 100 x 100 chunks: bands of 600 rows, then row 600 alone. Only the
    // chunk at rows 600.., columns 300..400 is stored (values 7 + j); the rest is fill 1.5.
    write_v3_array(
        &dir.path().join("tail"),
        &[601, 4096],
        &[100, 100],
        "float32",
        json!(1.5),
        raw.clone(),
    );
    std::fs::create_dir_all(dir.path().join("tail/c/6")).unwrap();
    let chunk: Vec<u8> = (0..100 * 100)
        .flat_map(|k| (7.0 + (k % 100) as f32).to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("tail/c/6/3"), chunk).unwrap();
    // 512 x 600000 float64 in 256 x 1000 chunks, every 256th row: each band is one row (its
    // row of chunks holds 1.2 GB); the chunk at rows 256.., columns 5000.. holds 2 + j.
    write_v3_array(
        &dir.path().join("wide"),
        &[512, 600_000],
        &[256, 1000],
        "float64",
        json!(1.5),
        raw,
    );
    std::fs::create_dir_all(dir.path().join("wide/c/1")).unwrap();
    let chunk: Vec<u8> = (0..256 * 1000)
        .flat_map(|k| (2.0 + (k % 1000) as f64).to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("wide/c/1/5"), chunk).unwrap();
    let app = app_for(&[("t", dir.path())]);
    let tail = |i: u64, j: u64| {
        if i == 600 && (300..400).contains(&j) {
            7.0 + (j - 300) as f64
        } else {
            1.5
        }
    };
    let wide = |i: u64, j: u64| {
        if i == 1 && (5000..6000).contains(&j) {
            2.0 + (j - 5000) as f64
        } else {
            1.5
        }
    };
    for format in ["json", "csv"] {
        let r = get(&app, &format!("/api/v1/slice/t/tail?format={format}"), &[]).await;
        let got = streamed_text_values(&r, format, [601, 4096], 0);
        for (k, &v) in got.iter().enumerate() {
            let (i, j) = (k as u64 / 4096, k as u64 % 4096);
            assert_eq!(v, tail(i, j), "tail {format} ({i}, {j})");
        }
        let r = get(
            &app,
            &format!("/api/v1/slice/t/wide?format={format}&select=::256,:"),
            &[],
        )
        .await;
        let got = streamed_text_values(&r, format, [2, 600_000], 0);
        for (k, &v) in got.iter().enumerate() {
            let (i, j) = (k as u64 / 600_000, k as u64 % 600_000);
            assert_eq!(v, wide(i, j), "wide {format} ({i}, {j})");
        }
    }
}

/// Rows of more than one dimension too long to write at once are cut along their first
/// dimension longer than one (past a dimension an integer dropped): the JSON is still the
/// nested lists of the result.
#[tokio::test]
async fn streamed_json_of_rows_cut_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    // [2, 2, 3000, 400] float64 in [1, 1, 1000, 400] chunks, fill 1.5; the chunk at
    // [1, 1, 2000.., 0..] holds 3 + its index. `:,1,:,:` is [2, 3000, 400]: 19.2 MB, rows of
    // 1.2 million elements.
    write_v3_array(
        &dir.path().join("deep"),
        &[2, 2, 3000, 400],
        &[1, 1, 1000, 400],
        "float64",
        json!(1.5),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    std::fs::create_dir_all(dir.path().join("deep/c/1/1/2")).unwrap();
    let chunk: Vec<u8> = (0..1000 * 400).flat_map(|k| (3.0 + k as f64).to_le_bytes()).collect();
    std::fs::write(dir.path().join("deep/c/1/1/2/0"), chunk).unwrap();
    let app = app_for(&[("t", dir.path())]);
    let r = get(&app, "/api/v1/slice/t/deep?select=:,1,:,:&format=json", &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-length").is_none(), "streamed");
    let doc = r.json();
    assert_eq!(doc["shape"], json!([2, 3000, 400]));
    let rows = doc["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (i, row) in rows.iter().enumerate() {
        let lines = row.as_array().unwrap();
        assert_eq!(lines.len(), 3000);
        for (j, line) in lines.iter().enumerate() {
            let values = line.as_array().unwrap();
            assert_eq!(values.len(), 400, "[{i}][{j}]");
            for (k, v) in values.iter().enumerate() {
                let want = if i == 1 && j >= 2000 {
                    3.0 + ((j - 2000) * 400 + k) as f64
                } else {
                    1.5
                };
                assert_eq!(json_number(v), want, "[{i}][{j}][{k}]");
            }
        }
    }
    // Rows [3, 200000]: each index of their first dimension is itself too long, so they are
    // cut along the second, an index of the first at a time.
    write_v3_array(
        &dir.path().join("stack"),
        &[2, 3, 200_000],
        &[1, 3, 100_000],
        "float64",
        json!(1.5),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    std::fs::create_dir_all(dir.path().join("stack/c/1/0")).unwrap();
    let chunk: Vec<u8> = (0..3 * 100_000).flat_map(|k| (3.0 + k as f64).to_le_bytes()).collect();
    std::fs::write(dir.path().join("stack/c/1/0/1"), chunk).unwrap();
    let stack = |i: usize, j: usize, k: usize| {
        if i == 1 && k >= 100_000 {
            3.0 + (j * 100_000 + k - 100_000) as f64
        } else {
            1.5
        }
    };
    let doc = get(&app, "/api/v1/slice/t/stack?format=json", &[]).await.json();
    assert_eq!(doc["shape"], json!([2, 3, 200_000]));
    for (i, row) in doc["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(row.as_array().unwrap().len(), 3);
        for (j, line) in row.as_array().unwrap().iter().enumerate() {
            let values = line.as_array().unwrap();
            assert_eq!(values.len(), 200_000);
            for (k, v) in values.iter().enumerate() {
                assert_eq!(json_number(v), stack(i, j, k), "[{i}][{j}][{k}]");
            }
        }
    }
    let r = get(&app, "/api/v1/slice/t/stack?format=bin", &[]).await;
    assert_eq!(r.body.len(), 2 * 3 * 200_000 * 8);
    for (n, b) in r.body.chunks_exact(8).enumerate() {
        let (i, j, k) = (n / 600_000, n / 200_000 % 3, n % 200_000);
        assert_eq!(
            f64::from_le_bytes(b.try_into().unwrap()),
            stack(i, j, k),
            "[{i}][{j}][{k}]"
        );
    }
    // Bands of two such rows (chunks of two rows): bin writes them in parts too.
    write_v3_array(
        &dir.path().join("pair"),
        &[2, 3000, 400],
        &[2, 1000, 400],
        "float64",
        json!(1.5),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    std::fs::create_dir_all(dir.path().join("pair/c/0/1")).unwrap();
    let chunk: Vec<u8> = (0..2 * 1000 * 400)
        .flat_map(|k| (3.0 + k as f64).to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("pair/c/0/1/0"), chunk).unwrap();
    let r = get(&app, "/api/v1/slice/t/pair?format=bin", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 2 * 3000 * 400 * 8);
    for (n, b) in r.body.chunks_exact(8).enumerate() {
        let (i, j, k) = (n / 1_200_000, n / 400 % 3000, n % 400);
        let want = if (1000..2000).contains(&j) {
            3.0 + (i * 400_000 + (j - 1000) * 400 + k) as f64
        } else {
            1.5
        };
        assert_eq!(f64::from_le_bytes(b.try_into().unwrap()), want, "[{i}][{j}][{k}]");
    }
}

#[tokio::test]
async fn a_warm_request_reads_nothing_from_the_store() {
    for path in [
        "v2/compressor_none_i4",
        "v3/sharding_start_i4",
        "v3/sharding_nested_i4",
        "v3/sharding_missing_shard_f8",
    ] {
        let (app, state, gets) = counting_app(&fixtures(), Config::default());
        let uri = format!("/api/v1/slice/m/{path}?select=::2");
        let cold = get(&app, &uri, &[]).await;
        assert_eq!(cold.status, 200, "{path}: {:?}", cold.body);
        let after_cold = gets.load(Ordering::SeqCst);
        assert!(after_cold > 0);
        let warm = get(&app, &uri, &[]).await;
        assert_eq!(warm.body, cold.body, "{path}");
        assert_eq!(
            gets.load(Ordering::SeqCst),
            after_cold,
            "{path}: the warm request read the store"
        );
        let metrics = get(&app, "/metrics", &[]).await;
        let text = String::from_utf8(metrics.body.to_vec()).unwrap();
        assert!(text.contains("zarrgate_cache_hits_total{cache=\"chunks\"}"), "{text}");
        assert!(state.caches.chunk_counters.hits.load(Ordering::Relaxed) > 0, "{path}");
    }
}

#[tokio::test]
async fn chunks_cached_under_old_metadata_are_not_used_with_new() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let bytes = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    write_v3_array(&a, &[4], &[4], "float32", json!(0.0), bytes.clone());
    std::fs::create_dir_all(a.join("c")).unwrap();
    let f: Vec<u8> = [1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(a.join("c/0"), f).unwrap();
    let (app, state, _) = counting_app(dir.path(), Config::default());
    let r = get(&app, "/api/v1/slice/m/a", &[]).await;
    assert_eq!(r.json()["data"], json!([1.0, 2.0, 3.0, 4.0]));
    let r = get(&app, "/api/v1/slice/m/a?select=1:3", &[]).await;
    assert_eq!(r.json()["data"], json!([2.0, 3.0]));

    // The array is rewritten as int16; its metadata expires from the cache (as after the TTL)
    // while the float32 chunk is still there.
    write_v3_array(&a, &[4], &[4], "int16", json!(0), bytes);
    let i: Vec<u8> = [10i16, 20, 30, 40].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(a.join("c/0"), i).unwrap();
    state.caches.metadata.invalidate_all();
    for (uri, want) in [
        ("/api/v1/slice/m/a", json!([10, 20, 30, 40])),
        ("/api/v1/slice/m/a?select=1:3", json!([20, 30])),
    ] {
        let r = get(&app, uri, &[]).await;
        assert_eq!(r.status, 200, "{uri}");
        assert_eq!(r.json()["data"], want, "{uri}");
        assert_eq!(r.header("x-zarr-dtype"), Some("<i2"));
    }
    let r = get(&app, "/api/v1/slice/m/a?format=bin", &[]).await;
    assert_eq!(r.body.len(), 8, "four int16, not the cached float32 chunk");
}

/// A v3 shard of two gzip-compressed int32 inner chunks, index (offset, length) at the end.
/// A v3 int32 array of `len` elements in shards of 8 (two gzipped inner chunks of 4, index at
/// the end), with its `c/` directory and no shard written.
fn gzip_sharded_array(dir: &std::path::Path, len: u64) {
    write_v3_array(
        dir,
        &[len],
        &[8],
        "int32",
        json!(0),
        json!([{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [4],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"
        }}]),
    );
    std::fs::create_dir_all(dir.join("c")).unwrap();
}

/// The app over `dir` as mount `m`: through a store without blocking reads, which coalesces
/// the ranges of inner chunks (`coalescing`), or as local files read per inner chunk.
fn sharded_app(dir: &std::path::Path, coalescing: bool) -> zarrgate::App {
    if coalescing {
        counting_app(dir, Config::default()).0
    } else {
        app_for(&[("m", dir)])
    }
}

fn gzip_shard(inner: [[i32; 4]; 2]) -> Vec<u8> {
    use std::io::Write;
    let mut data = Vec::new();
    let mut index = Vec::new();
    for values in inner {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
            .unwrap();
        let packed = gz.finish().unwrap();
        index.extend((data.len() as u64).to_le_bytes());
        index.extend((packed.len() as u64).to_le_bytes());
        data.extend(packed);
    }
    data.extend(index);
    data
}

/// A shard rewritten after its index was cached: its inner chunks are read at the new offsets
/// (the index is read anew), not at the old ones, on both read paths (local files read per
/// inner chunk, and coalesced ranges through a store without blocking reads).
#[tokio::test]
async fn a_rewritten_shard_is_read_through_its_new_index() {
    for coalescing in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        gzip_sharded_array(&a, 8);
        let old = gzip_shard([[0; 4], [1, 2, 3, 4]]);
        std::fs::write(a.join("c/0"), &old).unwrap();
        let app = sharded_app(dir.path(), coalescing);
        let r = get(&app, "/api/v1/slice/m/a?select=0:4", &[]).await;
        assert_eq!(r.json()["data"], json!([0, 0, 0, 0]));

        // Another first inner chunk, of another compressed size: the second one moves.
        let new = gzip_shard([[1000, -5, 77777, 3], [9, 9, 9, 9]]);
        assert_ne!(new.len(), old.len());
        std::fs::write(a.join("c/0"), &new).unwrap();
        let r = get(&app, "/api/v1/slice/m/a?select=4:8", &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.json()["data"].clone()),
            (200, json!([9, 9, 9, 9])),
            "coalescing {coalescing}"
        );
        // The first inner chunk, cached from the old shard, is not used with the new index.
        let r = get(&app, "/api/v1/slice/m/a", &[]).await;
        assert_eq!(
            r.json()["data"],
            json!([1000, -5, 77777, 3, 9, 9, 9, 9]),
            "coalescing {coalescing}"
        );
        let r = get(&app, "/api/v1/slice/m/a?select=1&format=bin", &[]).await;
        assert_eq!(r.body, (-5i32).to_le_bytes().to_vec());
        // A region over both inner chunks, with the index and the first inner chunk cached and
        // the second not: the read finds the shard replaced, and the region is read again whole
        // through the new index (no old inner chunk in it).
        let b = dir.path().join("b");
        std::fs::create_dir_all(b.join("c")).unwrap();
        std::fs::copy(a.join("zarr.json"), b.join("zarr.json")).unwrap();
        std::fs::write(b.join("c/0"), &old).unwrap();
        let r = get(&app, "/api/v1/slice/m/b?select=0:2", &[]).await;
        assert_eq!(r.json()["data"], json!([0, 0]));
        std::fs::write(b.join("c/0"), &new).unwrap();
        let r = get(&app, "/api/v1/slice/m/b?select=2:6", &[]).await;
        assert_eq!(r.json()["data"], json!([77777, 3, 9, 9]), "coalescing {coalescing}");
        let r = get(&app, "/api/v1/slice/m/b?select=::3&format=bin", &[]).await;
        let want: Vec<u8> = [1000i32, 3, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(r.body, want, "coalescing {coalescing}");
        // A shard rewritten shorter than the ranges its cached index names (here, one with no
        // inner chunks): the index is read again, and the missing chunk reads as fill, where
        // the old ranges past its end were 502 until the cache let the index go.
        let c = dir.path().join("c");
        std::fs::create_dir_all(c.join("c")).unwrap();
        std::fs::copy(a.join("zarr.json"), c.join("zarr.json")).unwrap();
        std::fs::write(c.join("c/0"), &new).unwrap();
        let r = get(&app, "/api/v1/slice/m/c?select=0", &[]).await;
        assert_eq!(r.json()["data"], json!(1000));
        let empty: Vec<u8> = [u64::MAX; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(c.join("c/0"), &empty).unwrap();
        let r = get(&app, "/api/v1/slice/m/c?select=4:8", &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.json()["data"].clone()),
            (200, json!([0, 0, 0, 0])),
            "coalescing {coalescing}"
        );
    }
}

/// Several shards rewritten since their indexes were cached, read in one request: one pass
/// finds them all, and the next reads them anew. It used to stop at the first, so the second
/// pass met the next one and the request failed with 502 ("a shard changed twice") although
/// each shard changed once.
#[tokio::test]
async fn several_rewritten_shards_are_read_anew_in_one_request() {
    for coalescing in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        gzip_sharded_array(&a, 32);
        for s in 0..4 {
            std::fs::write(a.join(format!("c/{s}")), gzip_shard([[s; 4], [s; 4]])).unwrap();
        }
        let app = sharded_app(dir.path(), coalescing);
        for s in 0..4 {
            let r = get(&app, &format!("/api/v1/slice/m/a?select={}", s * 8), &[]).await;
            assert_eq!(r.json()["data"], json!(s));
        }
        // Every shard replaced, by one of another size (its inner chunks move).
        for s in 0..4 {
            let new = gzip_shard([[100 + s, -1, 77777, s], [9; 4]]);
            std::fs::write(a.join(format!("c/{s}")), new).unwrap();
        }
        let r = get(&app, "/api/v1/slice/m/a?select=::4", &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.json()["data"].clone()),
            (200, json!([100, 9, 101, 9, 102, 9, 103, 9])),
            "coalescing {coalescing}: {:?}",
            r.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_requests_decode_each_chunk_once() {
    let (app, state, _) = counting_app(&fixtures(), Config::default());
    let uri = "/api/v1/slice/m/v2/compressor_none_i4";
    let replies = futures::future::join_all((0..16).map(|_| get(&app, uri, &[]))).await;
    assert!(replies.iter().all(|r| r.status == 200 && r.body == replies[0].body));
    let meta = std::fs::read(fixtures().join("v2/compressor_none_i4/.zarray")).unwrap();
    let meta: Value = serde_json::from_slice(&meta).unwrap();
    let grid: u64 = meta["shape"]
        .as_array()
        .unwrap()
        .iter()
        .zip(meta["chunks"].as_array().unwrap())
        .map(|(s, c)| s.as_u64().unwrap().div_ceil(c.as_u64().unwrap()))
        .product();
    let stored = std::fs::read_dir(fixtures().join("v2/compressor_none_i4"))
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            !n.to_string_lossy().starts_with('.')
        })
        .count() as u64;
    assert!(stored <= grid);
    assert_eq!(
        state.caches.decodes.load(Ordering::Relaxed),
        stored,
        "each stored chunk decoded once"
    );
}

/// Over local files, a shard's inner chunks are each read and decoded in one blocking call
/// (not coalesced): concurrent identical requests still decode each stored inner chunk once,
/// and agree with the coalescing path of a store without blocking reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_requests_decode_each_local_inner_chunk_once() {
    let path = "v3/sharding_start_i4";
    let state = zarrgate::AppState::from_config(config_with(&[("m", &fixtures())])).unwrap();
    let app = zarrgate::app(state.clone());
    let uri = format!("/api/v1/slice/m/{path}?format=bin");
    let replies = futures::future::join_all((0..16).map(|_| get(&app, &uri, &[]))).await;
    assert!(replies.iter().all(|r| r.status == 200 && r.body == replies[0].body));
    let (counted, _, _) = counting_app(&fixtures(), Config::default());
    assert_eq!(get(&counted, &uri, &[]).await.body, replies[0].body);
    // Inner chunks stored: index entries (at the start of each shard: 2 x 2 of 16 bytes, then a
    // crc32c) that are not the empty marker.
    let mut stored = 0;
    for shard in ["0/0", "0/1", "1/0", "1/1"] {
        let bytes = std::fs::read(fixtures().join(path).join("c").join(shard)).unwrap();
        stored += bytes[..64].chunks_exact(16).filter(|e| e[..8] != [0xff; 8]).count() as u64;
    }
    assert!(stored > 0);
    assert_eq!(
        state.caches.decodes.load(Ordering::Relaxed),
        stored,
        "each stored inner chunk decoded once"
    );
}

/// An image over a band's size takes its share of the memory budget for answers built whole
/// before its region is read: with the budget held, it is 503 at once; freed, it is served.
/// A small one takes none.
#[tokio::test]
async fn large_images_take_their_share_of_the_whole_budget() {
    let dir = tempfile::tempdir().unwrap();
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    // No chunk is stored: the region reads as fill, 16 MiB of float32.
    write_v3_array(
        &dir.path().join("a"),
        &[2048, 2048],
        &[512, 512],
        "float32",
        json!(1.5),
        raw,
    );
    let state = zarrgate::AppState::from_config(config_with(&[("m", dir.path())])).unwrap();
    let app = zarrgate::app(state.clone());
    let all = state.whole_mib.available_permits() as u32;
    let held = state.whole_mib.clone().try_acquire_many_owned(all).unwrap();
    let image = "/api/v1/slice/m/a?format=png&vmin=0&vmax=2";
    let r = get(&app, image, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (503, "overloaded"));
    assert_eq!(
        get(&app, "/api/v1/slice/m/a?select=0:64,0:64&format=png", &[])
            .await
            .status,
        200
    );
    drop(held);
    let r = get(&app, image, &[]).await;
    assert_eq!(r.status, 200);
    assert!(r.body.starts_with(b"\x89PNG"));
    assert_eq!(state.whole_mib.available_permits() as u32, all);
}

/// Every answer says how it may be cached, once: `no-cache` (revalidate or fetch again), so that
/// no shared cache keeps a slice or a listing past the staleness bound for a lifetime of its
/// own choosing.
#[tokio::test]
async fn every_answer_is_no_cache() {
    let app = fixture_app();
    for uri in [
        "/api/v1/slice/fx/v2/compressor_none_i4?select=0",
        "/api/v1/slice/fx/v2/compressor_none_i4?format=npy",
        "/api/v1/slice/fx/v2/compressor_none_i4?format=png",
        "/api/v1/zom/fx/v2",
        "/api/v1/list/fx/v2",
        "/api/v1/mounts",
        "/healthz",
        "/metrics",
        "/",
        "/zarr/fx/v2/compressor_none_i4/.zarray",
        "/zarr/fx/v2/nothing",
        "/api/v1/slice/fx/v2/compressor_none_i4?select=99",
    ] {
        for method in ["GET", "HEAD"] {
            let r = request(&app, method, uri, &[("origin", "http://example.org")]).await;
            let values: Vec<_> = r.headers.get_all("cache-control").iter().collect();
            assert_eq!(values, ["no-cache"], "{method} {uri} ({})", r.status);
        }
    }
}

/// `/metrics` is the Prometheus text format 0.0.4 unless OpenMetrics is asked for, as
/// Prometheus asks; both vary with `Accept`, and their samples are the same.
#[tokio::test]
async fn metrics_format_follows_accept() {
    let app = fixture_app();
    get(&app, "/zarr/fx/v2/compressor_none_i4/.zarray", &[]).await;
    let sample = "zarrgate_requests_total{route=\"raw\",status=\"200\"} 1";
    let plain = get(&app, "/metrics", &[]).await;
    assert_eq!(plain.status, 200);
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let vary = plain.header("vary").unwrap_or_default();
    assert!(vary.contains("accept"), "{vary}");
    let text = String::from_utf8(plain.body.to_vec()).unwrap();
    assert!(
        text.lines().any(|l| l == "# TYPE zarrgate_requests_total counter"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == sample), "{text}");
    assert!(!text.contains("# EOF"), "{text}");
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let open = get(&app, "/metrics", &[("accept", accept)]).await;
    assert_eq!(
        open.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8(open.body.to_vec()).unwrap();
    assert!(text.lines().any(|l| l == "# TYPE zarrgate_requests counter"), "{text}");
    assert!(text.lines().any(|l| l == sample), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // Accept on two lines is one list, as for slices.
    let two = get(
        &app,
        "/metrics",
        &[
            ("accept", "text/plain;version=0.0.4;q=0.5"),
            ("accept", "application/openmetrics-text"),
        ],
    )
    .await;
    assert_eq!(
        two.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
}

#[tokio::test]
async fn metrics_count_requests_by_route() {
    let app = fixture_app();
    get(&app, "/api/v1/slice/fx/v2/compressor_none_i4", &[]).await;
    get(&app, "/zarr/fx/v2/compressor_none_i4/.zarray", &[]).await;
    let r = get(&app, "/metrics", &[]).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.contains("zarrgate_requests_total{route=\"slice\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("zarrgate_requests_total{route=\"raw\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("zarrgate_request_duration_seconds_bucket{le="), "{text}");
    // Each cache has its own counters: one metadata miss for the slice, none for hierarchies
    // until a ZOM request walks one (a miss), and its repeat (a hit).
    assert!(
        text.contains("zarrgate_cache_misses_total{cache=\"metadata\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("zarrgate_cache_misses_total{cache=\"hierarchies\"} 0"),
        "{text}"
    );
    for _ in 0..2 {
        assert_eq!(get(&app, "/api/v1/zom/fx/v3/group_nested", &[]).await.status, 200);
    }
    let text = String::from_utf8(get(&app, "/metrics", &[]).await.body.to_vec()).unwrap();
    assert!(
        text.contains("zarrgate_cache_misses_total{cache=\"hierarchies\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("zarrgate_cache_hits_total{cache=\"hierarchies\"} 1"),
        "{text}"
    );
}

/// Every chunk (or inner chunk of a shard) of every fixed-size fixture array, asked for as a
/// selection of exactly that unit and as a strided part of it: the bin route answers from the
/// decoded unit (the whole unit without a copy, missing units as fill, units cut by the array
/// edge and parts copied out), the bytes equal zarr-python's values, and nothing is decoded
/// twice.
#[tokio::test]
async fn single_chunk_selections_are_zarr_pythons_blocks() {
    let (app, state, _) = counting_app(&fixtures(), Config::default());
    let store = zarrgate::store::Store::new(zarrgate::store::open_local(&fixtures()).unwrap());
    let mut checked = 0;
    for case in crate::common::cases::cases(&repo().join("tests/fixtures/cases.json")) {
        let Ok(meta) = crate::common::cases::open(&store, &case.path).await else {
            continue;
        };
        let Some(item) = meta.dtype.item_size() else {
            continue;
        };
        let e = crate::common::expected::load(&case.expected);
        if !matches!(e.elements, Elements::Fixed(_)) || meta.shape.is_empty() {
            continue;
        }
        let unit = meta
            .chain
            .sharding()
            .map_or(meta.chunk_shape.clone(), |s| s.inner_shape.clone());
        let grid: Vec<u64> = meta.shape.iter().zip(&unit).map(|(n, u)| n.div_ceil(*u)).collect();
        let units: u64 = grid.iter().product();
        for flat in 0..units.min(64) {
            let mut rest = flat;
            let mut coords = vec![0; grid.len()];
            for d in (0..grid.len()).rev() {
                coords[d] = rest % grid[d];
                rest /= grid[d];
            }
            let starts: Vec<u64> = coords.iter().zip(&unit).map(|(c, u)| c * u).collect();
            let counts: Vec<u64> = starts
                .iter()
                .zip(&unit)
                .zip(&meta.shape)
                .map(|((s, u), n)| (*u).min(n - s))
                .collect();
            let select: Vec<String> = starts
                .iter()
                .zip(&counts)
                .map(|(s, c)| format!("{s}:{}", s + c))
                .collect();
            let uri = format!("/api/v1/slice/m/{}?select={}&format=bin", case.path, select.join(","));
            let r = get(&app, &uri, &[]).await;
            assert_eq!(r.status, 200, "{uri}: {:?}", r.body);
            let Elements::Fixed(want) = slice_naive(&e, item, &starts, &vec![1; counts.len()], &counts) else {
                unreachable!()
            };
            assert_eq!(&r.body[..], &want[..], "{uri}");
            let decodes = state.caches.decodes.load(Ordering::Relaxed);
            let again = get(&app, &uri, &[]).await;
            assert_eq!(again.body, r.body, "{uri}");
            assert_eq!(
                state.caches.decodes.load(Ordering::Relaxed),
                decodes,
                "{uri} decoded again"
            );
            // A strided part inside the same unit (a viewer's tile): copied out of it.
            let offsets: Vec<u64> = counts.iter().map(|c| (*c > 1) as u64).collect();
            let part_starts: Vec<u64> = starts.iter().zip(&offsets).map(|(s, o)| s + o).collect();
            let part_counts: Vec<u64> = counts.iter().zip(&offsets).map(|(c, o)| (c - o).div_ceil(2)).collect();
            let select: Vec<String> = part_starts
                .iter()
                .zip(&starts)
                .zip(&counts)
                .map(|((p, s), c)| format!("{p}:{}:2", s + c))
                .collect();
            let uri = format!("/api/v1/slice/m/{}?select={}&format=bin", case.path, select.join(","));
            let r = get(&app, &uri, &[]).await;
            assert_eq!(r.status, 200, "{uri}: {:?}", r.body);
            let Elements::Fixed(want) = slice_naive(&e, item, &part_starts, &vec![2; counts.len()], &part_counts)
            else {
                unreachable!()
            };
            assert_eq!(&r.body[..], &want[..], "{uri}");
            assert_eq!(
                state.caches.decodes.load(Ordering::Relaxed),
                decodes,
                "{uri} decoded again"
            );
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} units checked");
}

/// Over a remote-like store, chunk fetches overlap up to the read concurrency, not only up to
/// the decode permits: a fetch waits on the network and takes no permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_fetches_overlap_beyond_the_decode_turns() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    write_v3_array(
        &a,
        &[64],
        &[1],
        "int32",
        json!(0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    std::fs::create_dir_all(a.join("c")).unwrap();
    for i in 0..64i32 {
        std::fs::write(a.join(format!("c/{i}")), (i * 3).to_le_bytes()).unwrap();
    }
    // 30 ms of latency per read, and a record of how many reads were in flight at once.
    let (in_flight, most) = <(Arc<AtomicUsize>, Arc<AtomicUsize>)>::default();
    let store = ReadHook {
        inner: zarrgate::store::Store::new(zarrgate::store::open_local(dir.path()).unwrap()),
        head: None,
        read: {
            let most = most.clone();
            Box::new(move |inner, key, range| {
                let (in_flight, most) = (in_flight.clone(), most.clone());
                Box::pin(async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
                    let got = inner.get(&key, range).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    got
                })
            })
        },
    };
    let mount = wrapped_mount("lagging", store);
    let state = zarrgate::AppState::with_mounts(Config::default(), vec![mount]);
    let permits = state.read_options.decode_permits;
    let app = zarrgate::app(state);
    let r = get(&app, "/api/v1/slice/m/a", &[]).await;
    let want: Vec<i32> = (0..64).map(|i| i * 3).collect();
    assert_eq!(r.json()["data"], json!(want));
    let most = most.load(Ordering::SeqCst);
    assert!(most > permits, "{most} reads at once, with {permits} decode permits");
}

/// An array at the root of a mount is sliced at `/api/v1/slice/{mount}` (with or without the
/// slash), as its ZOM and raw keys are reached: it was "no such route".
#[tokio::test]
async fn an_array_at_a_mount_root_is_sliced() {
    let app = app_for(&[("a", &fixtures().join("v3/zstd_i4")), ("fx", &fixtures())]);
    let want = get(&app, "/api/v1/slice/fx/v3/zstd_i4?select=1:3", &[]).await;
    assert_eq!(want.status, 200);
    for url in ["/api/v1/slice/a?select=1:3", "/api/v1/slice/a/?select=1:3"] {
        let r = get(&app, url, &[]).await;
        assert_eq!(r.status, 200, "{url}: {:?}", r.body);
        assert_eq!(r.json(), want.json(), "{url}");
    }
    let r = get(&app, "/api/v1/slice/nosuch?select=1:3", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (404, "unknown_mount"));
}

/// An aligned struct as zarr-python 2 stores it (padding as fields without a name): JSON names
/// them as NumPy does (`f1`, `f4`), so no key repeats and no value is lost.
#[tokio::test]
async fn unnamed_struct_fields_are_named_as_numpy_names_them() {
    let app = fixture_app();
    let r = get(
        &app,
        "/api/v1/slice/fx/v2/dtype_struct_aligned_padding?select=1:3&format=json",
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!String::from_utf8_lossy(&r.body).contains("\"\":"), "{:?}", r.body);
    assert_eq!(
        r.json()["data"],
        serde_json::json!([
            {"a": 2, "f1": "AAAA", "b": -20, "c": 6, "f4": "AAAA"},
            {"a": 3, "f1": "AAAA", "b": 30, "c": 7, "f4": "AAAA"}
        ])
    );
}

/// A v3 structured type behind a big-endian bytes codec: every field, nested ones too, is
/// stored big-endian.
#[tokio::test]
async fn nested_structured_fields_follow_the_bytes_codec_order() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("s");
    std::fs::create_dir_all(a.join("c")).unwrap();
    std::fs::write(
        a.join("zarr.json"),
        serde_json::to_vec(&json!({
            "zarr_format": 3, "node_type": "array", "shape": [2], "attributes": {},
            "data_type": {"name": "structured", "configuration": {"fields": [
                ["a", "int16"],
                ["n", {"name": "structured", "configuration": {"fields": [["x", "int16"], ["y", "float64"]]}}]
            ]}},
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": "AAAAAAAAAAAAAAAA",
            "codecs": [{"name": "bytes", "configuration": {"endian": "big"}}]
        }))
        .unwrap(),
    )
    .unwrap();
    let mut chunk = Vec::new();
    for (a, x, y) in [(1i16, 3i16, 1.5f64), (-2, 768, -0.25)] {
        chunk.extend(a.to_be_bytes());
        chunk.extend(x.to_be_bytes());
        chunk.extend(y.to_be_bytes());
    }
    std::fs::write(a.join("c/0"), chunk).unwrap();
    let app = app_for(&[("t", dir.path())]);
    let r = get(&app, "/api/v1/slice/t/s?format=json", &[]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        r.json()["data"],
        json!([{"a": 1, "n": {"x": 3, "y": 1.5}}, {"a": -2, "n": {"x": 768, "y": -0.25}}])
    );
}

/// bin and npy cannot hold objects (JSON-encoded values): refused (422) after the metadata is
/// read and before any chunk is, as csv and png are, whatever the chunks hold.
#[tokio::test]
async fn object_arrays_as_bytes_are_refused_before_reading_chunks() {
    let (app, _, reads) = counting_app(&fixtures().join("v2"), config_with(&[]));
    // csv is refused so too, with the metadata read (and cached).
    let r = get(&app, "/api/v1/slice/m/object_json2?format=csv", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (422, "unsupported"));
    for format in ["bin", "npy"] {
        let before = reads.load(std::sync::atomic::Ordering::SeqCst);
        let r = get(&app, &format!("/api/v1/slice/m/object_json2?format={format}"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (422, "unsupported"),
            "{format}"
        );
        // The metadata is cached: nothing at all is read.
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), before, "{format}");
    }
}

/// A HEAD of a slice is checked as a GET is (select, format, limits: the same errors) and
/// answered with the headers known before reading: no chunk is read or decoded. bin and npy
/// of fixed-size elements have their exact length and dtype.
#[tokio::test]
async fn head_of_a_slice_reads_no_chunk() {
    let (app, state, reads) = counting_app(&fixtures().join("v2"), config_with(&[]));
    let count = || reads.load(std::sync::atomic::Ordering::SeqCst);
    let decodes = || state.caches.decodes.load(std::sync::atomic::Ordering::SeqCst);
    let base = "/api/v1/slice/m/compressor_zstd_i4";
    // The metadata is read (and cached) by a first refused request.
    let r = request(&app, "HEAD", &format!("{base}?select=0:2,0:3,9&format=bin"), &[]).await;
    assert_eq!(r.status, 400);
    let first = count();
    for (query, length) in [
        ("select=1:3,2:5&format=bin", Some(24)),
        ("select=1:3,2:5&format=npy", None),
        ("select=1:3,2:5&format=json", None),
        ("select=1:3,2:5&format=csv", None),
        ("select=1:3,2:5&format=png", None),
    ] {
        let uri = format!("{base}?{query}");
        let (before, decoded) = (count(), decodes());
        let head = request(&app, "HEAD", &uri, &[]).await;
        assert_eq!(head.status, 200, "{query}");
        assert!(head.body.is_empty());
        assert_eq!((count(), decodes()), (before, decoded), "{query}: nothing read");
        let get = get(&app, &uri, &[]).await;
        for h in ["content-type", "x-zarr-shape", "x-zarr-dtype", "vary"] {
            assert_eq!(head.header(h), get.header(h), "{query}: {h}");
        }
        let stated = head.header("content-length").map(|l| l.parse::<usize>().unwrap());
        match query {
            q if q.ends_with("bin") || q.ends_with("npy") => {
                assert_eq!(stated, Some(get.body.len()), "{query}");
                if let Some(n) = length {
                    assert_eq!(get.body.len(), n);
                }
            }
            _ => assert_eq!(stated, None, "{query}: text has no length before it is made"),
        }
    }
    // The GETs read; HEADs still refuse what a GET refuses.
    assert!(count() > first);
    // Variable-length elements: the dtype of json is the array's, that of bin is known once read.
    let strings = "/api/v1/slice/m/zarr2_object_vlen_utf8";
    let head = request(&app, "HEAD", &format!("{strings}?format=json"), &[]).await;
    let get = get(&app, &format!("{strings}?format=json"), &[]).await;
    assert_eq!(
        (head.status.as_u16(), head.header("x-zarr-dtype")),
        (200, get.header("x-zarr-dtype"))
    );
    assert!(head.header("x-zarr-dtype").is_some());
    let head = request(&app, "HEAD", &format!("{strings}?format=bin"), &[]).await;
    assert_eq!((head.status.as_u16(), head.header("x-zarr-dtype")), (200, None));
    let r = request(&app, "HEAD", &format!("{base}?select=0:2&format=xml"), &[]).await;
    assert_eq!(r.status, 400);
    let (app, _, _) = counting_app(&fixtures().join("v2"), {
        let mut c = config_with(&[]);
        c.limits.max_slice_bytes = 16;
        c
    });
    let r = request(&app, "HEAD", &format!("{base}?format=bin"), &[]).await;
    assert_eq!(r.status, 413);
}
