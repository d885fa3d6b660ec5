//! Reading regions of arrays: selections, chunk planning, concurrent fetch + decode, assembly.

pub mod priority_semaphore;
pub mod read;
pub mod selection;

pub use read::{
    LoadedRegion, ReadContext, ReadError, ReadOptions, load_region, read_region, read_region_bytes, row_axis,
    unit_shape, units_bytes,
};
pub use selection::{DimSelection, Selection, SelectionError};
