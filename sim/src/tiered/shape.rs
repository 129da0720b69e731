//! What a method computes, whichever backend compiles it, and what its code
//! needs to know: the simulator predicts every result from this.
//!
//! A method takes the calling thread's probe context and passes it on to its
//! callee. It sums `1 + 2 + ... + work` in a loop, runs its leaf arithmetic
//! (`steps` operations on the sum: xor, multiply by an odd constant, rotate,
//! add, each with a constant drawn from `mix`), adds its own index, and adds
//! what its callee returns, all wrapping:
//! `value(m) = steps(triangle(work)) + m + value(callee)`.

/// One method's semantics.
#[derive(Clone, Copy, Debug)]
pub(super) struct Method {
    /// Loop iterations (at least 1).
    pub(super) work: u32,
    /// The method it calls, if any.
    pub(super) callee: Option<usize>,
    /// What a call returns.
    pub(super) value: u64,
    /// Bytes of tier-0 code a large method adds (0 for others).
    pub(super) filler: usize,
    /// The seed of its leaf arithmetic's operations and constants.
    pub(super) mix: u64,
    /// Operations of leaf arithmetic.
    pub(super) steps: u8,
}

/// One operation of a method's leaf arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// `x ^= c`.
    Xor(u64),
    /// `x *= c` (c odd).
    Mul(u64),
    /// `x = x.rotate_left(r)` (r in 1..64).
    Rotl(u32),
    /// `x += c`.
    Add(u64),
}

/// The sum of 1..=n.
pub(super) fn triangle(n: u32) -> u64 {
    let n = u64::from(n);
    n * (n + 1) / 2
}

/// splitmix64's finalizer: spreads `x` over 64 bits.
fn spread(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Method {
    /// Its leaf arithmetic, in order.
    pub(super) fn steps(&self) -> impl Iterator<Item = Step> + use<> {
        let mix = self.mix;
        (0..u64::from(self.steps)).map(move |k| {
            let c = spread(mix.wrapping_add(k));
            match c & 3 {
                0 => Step::Xor(c),
                1 => Step::Mul(c | 1),
                2 => Step::Rotl(1 + (c >> 8) as u32 % 63),
                _ => Step::Add(c),
            }
        })
    }

    /// What it returns when its callee returns `callee` (0 with no callee),
    /// as its index is `index`.
    pub(super) fn compute(&self, index: usize, callee: u64) -> u64 {
        let leaf = self
            .steps()
            .fold(triangle(self.work), |x, step| match step {
                Step::Xor(c) => x ^ c,
                Step::Mul(c) => x.wrapping_mul(c),
                Step::Rotl(r) => x.rotate_left(r),
                Step::Add(c) => x.wrapping_add(c),
            });
        leaf.wrapping_add(index as u64).wrapping_add(callee)
    }
}

/// What a method's code needs to know, besides its [`Method`].
#[derive(Clone, Copy, Debug)]
pub(super) struct CodeShape {
    /// Its index in its group: added to its value.
    pub(super) index: u32,
    /// Address of its call-counter cell (tier 0).
    pub(super) counter_cell: u64,
    /// The id it reports to the entry probe (tier 0): its version id.
    pub(super) probe_id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaf_arithmetic_is_the_one_written_down() {
        // `scale`'s test reads the process's allocator figures: this crate's
        // unit tests take turns.
        let _turn = crate::scale::measuring();
        let m = Method {
            work: 10,
            callee: None,
            value: 0,
            filler: 0,
            mix: 7,
            steps: 3,
        };
        let steps: Vec<Step> = m.steps().collect();
        assert_eq!(steps.len(), 3);
        let mut x = 55u64;
        for s in &steps {
            x = match *s {
                Step::Xor(c) => x ^ c,
                Step::Mul(c) => {
                    assert_eq!(c & 1, 1);
                    x.wrapping_mul(c)
                }
                Step::Rotl(r) => {
                    assert!((1..64).contains(&r));
                    x.rotate_left(r)
                }
                Step::Add(c) => x.wrapping_add(c),
            };
        }
        assert_eq!(m.compute(4, 100), x.wrapping_add(104));
        // No steps: the iced backend's formula.
        let plain = Method { steps: 0, ..m };
        assert_eq!(plain.compute(4, 100), 55 + 4 + 100);
    }
}
