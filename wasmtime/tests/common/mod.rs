//! What the tests share.
pub mod guest;
