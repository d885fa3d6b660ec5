//! Route handlers, one file per route family.

pub mod api;
pub mod raw;
pub mod slice;
pub mod zom;
