//! `Debug` output with addresses (and the sizes beside them) in hex, as a
//! runtime engineer reads them next to `/proc/<pid>/maps` or a disassembly.

use std::fmt;

/// A number that `Debug`-prints as `0x…`.
pub(crate) struct Hex(pub(crate) u64);

impl fmt::Debug for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// `Debug` for a struct or struct-like variant whose fields are numbers, each
/// printed in hex: `hex_struct!(f, "Name", "field" => value, ...)`.
macro_rules! hex_struct {
    ($f:expr, $name:expr $(, $field:literal => $value:expr)* $(,)?) => {
        $f.debug_struct($name)
            $(.field($field, &$crate::hex::Hex($value as u64)))*
            .finish()
    };
}

pub(crate) use hex_struct;
