//! jitmap: an executable code heap whose instruction-pointer → method lookups are
//! lock-free, bounded and exact, built on the .NET runtime's nibble maps.
//!
//! Layers, bottom up: [`words`] (map word storage), [`nibble`] (the v1 and v2
//! nibble maps).

pub mod nibble;
pub mod sync;
pub mod words;

pub use nibble::{MapError, MapVersion, MapWriter, NibbleMap};
