//! The integration tests, as modules of one test binary: one link of the crate instead of one
//! per file. `cargo test --test integration zom::` runs one module.

mod common;

mod access;
mod array_core;
mod cli;
mod clouds;
mod compression;
mod hardening;
mod icechunk;
mod raw_keys;
mod references;
mod remote;
mod slice;
mod tcp;
mod zip;
mod zom;
