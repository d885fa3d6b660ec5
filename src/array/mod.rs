//! Reading regions of arrays: selections, chunk planning, concurrent fetch + decode, assembly.

pub mod read;
pub mod selection;

pub use read::{ReadContext, ReadError, ReadOptions, read_region, read_region_bytes};
pub use selection::{DimSelection, Selection, SelectionError};
