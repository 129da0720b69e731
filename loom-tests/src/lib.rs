//! loom models of jitmap's concurrent protocols. The models live in `tests/` and
//! compile only with `RUSTFLAGS="--cfg loom"`; see `loom-tests/README.md`.
