//! Expected values written by tests/fixtures/make_fixtures.py: `.npy` files (parsed here, no
//! crate needed) and `.json` files for variable-length data.
#![allow(dead_code)]

use std::path::Path;

use base64::Engine;
use serde_json::Value;
use zarrgate::codec::transpose;
use zarrgate::dtype::DType;
use zarrgate::dtype::elements::Elements;

/// An expected array: shape, dtype (decoded form) and elements in C order, little-endian.
#[derive(Debug)]
pub struct Expected {
    pub shape: Vec<u64>,
    pub dtype: Option<DType>,
    pub elements: Elements,
}

/// Turns the Python literal of an .npy header into JSON.
fn python_literal_to_json(text: &str) -> Value {
    let mut s = text.replace('\'', "\"").replace('(', "[").replace(')', "]");
    s = s.replace("True", "true").replace("False", "false");
    loop {
        let t = s
            .replace(",]", "]")
            .replace(", ]", "]")
            .replace(",}", "}")
            .replace(", }", "}");
        if t == s {
            break;
        }
        s = t;
    }
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("npy header {text:?}: {e}"))
}

pub fn load_npy(path: &Path) -> Expected {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&raw[..6], b"\x93NUMPY", "{}", path.display());
    let (header_len, start) = if raw[6] == 1 {
        (u16::from_le_bytes([raw[8], raw[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]) as usize, 12)
    };
    let header = python_literal_to_json(std::str::from_utf8(&raw[start..start + header_len]).unwrap().trim());
    let descr = DType::from_v2(&header["descr"]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let shape: Vec<u64> = header["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut data = raw[start + header_len..].to_vec();
    descr.to_little_endian(&mut data);
    let item = descr.item_size().unwrap();
    let mut elements = Elements::Fixed(data);
    if header["fortran_order"] == Value::Bool(true) && shape.len() > 1 {
        let order: Vec<usize> = (0..shape.len()).rev().collect();
        let stored: Vec<u64> = shape.iter().rev().copied().collect();
        elements = transpose::decode(elements, &stored, &order, item).unwrap();
    }
    Expected {
        shape,
        dtype: Some(descr.little_endian()),
        elements,
    }
}

pub fn load_json(path: &Path) -> Expected {
    let doc: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let shape: Vec<u64> = doc["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let values = doc["values"].as_array().unwrap().clone();
    let elements = match doc["kind"].as_str() {
        Some("string") => Elements::Strings(values.iter().map(|v| v.as_str().map(str::to_owned)).collect()),
        Some("bytes") => Elements::Bytes(
            values
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(|s| base64::engine::general_purpose::STANDARD.decode(s).unwrap())
                })
                .collect(),
        ),
        _ => Elements::Objects(values),
    };
    Expected {
        shape,
        dtype: None,
        elements,
    }
}

pub fn load(path: &Path) -> Expected {
    if path.extension().is_some_and(|e| e == "npy") {
        load_npy(path)
    } else {
        load_json(path)
    }
}

/// Naive reference slicing, element by element (independent of the server's block copy).
pub fn slice_naive(e: &Expected, item: usize, starts: &[u64], steps: &[u64], counts: &[u64]) -> Elements {
    let n = e.shape.len();
    let mut strides = vec![1u64; n];
    for d in (0..n.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * e.shape[d + 1];
    }
    let total: u64 = counts.iter().product();
    let mut idx = vec![0u64; n];
    let mut flat = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let src: u64 = (0..n).map(|d| (starts[d] + idx[d] * steps[d]) * strides[d]).sum();
        flat.push(src as usize);
        for d in (0..n).rev() {
            idx[d] += 1;
            if idx[d] < counts[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    match &e.elements {
        Elements::Fixed(b) => Elements::Fixed(
            flat.iter()
                .flat_map(|&i| b[i * item..(i + 1) * item].to_vec())
                .collect(),
        ),
        Elements::Strings(v) => Elements::Strings(flat.iter().map(|&i| v[i].clone()).collect()),
        Elements::Bytes(v) => Elements::Bytes(flat.iter().map(|&i| v[i].clone()).collect()),
        Elements::Objects(v) => Elements::Objects(flat.iter().map(|&i| v[i].clone()).collect()),
    }
}
