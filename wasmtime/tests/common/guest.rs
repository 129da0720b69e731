//! The 1:2:4 guest: a WebAssembly module whose three leaves do 1, 2 and 4
//! units of the same work under `middle` and `top`, called in a loop by
//! its host. A profiler that is right gives the leaves 1:2:4 of their
//! self samples. Shared by the `guest_profile` example and the tests.

use wasmtime::{Engine, Instance, Module, Store, TypedFunc};

/// The guest, in the text format. Each leaf runs `n * k` rounds of a
/// linear congruential step; `middle` mixes their results.
pub const WAT: &str = r#"
(module $guest
  (func $leaf_1x (param $n i32) (result i32)
    (local $i i32) (local $seed i32)
    (local.set $seed (i32.const 1))
    (loop $again
      (local.set $seed
        (i32.add (i32.mul (local.get $seed) (i32.const 1664525))
                 (i32.add (i32.const 1013904223) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $seed))
  (func $leaf_2x (param $n i32) (result i32)
    (local $i i32) (local $seed i32)
    (local.set $seed (i32.const 2))
    (local.set $n (i32.mul (local.get $n) (i32.const 2)))
    (loop $again
      (local.set $seed
        (i32.add (i32.mul (local.get $seed) (i32.const 1664525))
                 (i32.add (i32.const 1013904223) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $seed))
  (func $leaf_4x (param $n i32) (result i32)
    (local $i i32) (local $seed i32)
    (local.set $seed (i32.const 4))
    (local.set $n (i32.mul (local.get $n) (i32.const 4)))
    (loop $again
      (local.set $seed
        (i32.add (i32.mul (local.get $seed) (i32.const 1664525))
                 (i32.add (i32.const 1013904223) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $seed))
  (func $middle (param $n i32) (result i32)
    (i32.xor (call $leaf_1x (local.get $n))
      (i32.xor (call $leaf_2x (local.get $n)) (call $leaf_4x (local.get $n)))))
  (func $top (export "top") (param $n i32) (result i32)
    (call $middle (local.get $n))))
"#;

/// The leaves' names as the agent gives them, in units of work 1, 2, 4.
pub const LEAVES: [&str; 3] = ["guest::leaf_1x", "guest::leaf_2x", "guest::leaf_4x"];

/// Rounds of the 1x leaf per call of `top`.
pub const ROUNDS: i32 = 20_000;

/// One instance of the guest and its `top`.
pub struct Guest {
    /// The compiled module (what a registration loads).
    pub module: Module,
    store: Store<()>,
    top: TypedFunc<i32, i32>,
}

impl Guest {
    /// Compiles and instantiates the guest on `engine`.
    pub fn new(engine: &Engine) -> wasmtime::Result<Self> {
        let module = Module::new(engine, WAT)?;
        let mut store = Store::new(engine, ());
        let instance = Instance::new(&mut store, &module, &[])?;
        let top = instance.get_typed_func::<i32, i32>(&mut store, "top")?;
        Ok(Self { module, store, top })
    }

    /// Calls `top(n)`.
    pub fn call(&mut self, n: i32) -> wasmtime::Result<i32> {
        self.top.call(&mut self.store, n)
    }

    /// What `top(n)` returns.
    pub fn expected(n: i32) -> i32 {
        let work = |rounds: i32, mut seed: i32| {
            let mut i = 0i32;
            loop {
                seed = seed
                    .wrapping_mul(1_664_525)
                    .wrapping_add(1_013_904_223i32.wrapping_add(i));
                i += 1;
                if (i as u32) >= (rounds as u32) {
                    return seed;
                }
            }
        };
        work(n, 1) ^ work(n.wrapping_mul(2), 2) ^ work(n.wrapping_mul(4), 4)
    }
}
