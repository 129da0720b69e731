//! A seeded generator for the library's unit tests: the same sequence on every
//! run, so that tests over random layouts can assert exact counts.

/// Marsaglia's xorshift64 with shifts 13, 7 and 17.
pub(crate) struct Xorshift(u64);

impl Xorshift {
    /// The generator from `seed`, which must not be 0.
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next value reduced below `n` (slightly biased; tests only).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
