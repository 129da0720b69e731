//! jitmap's demo JIT host: `top` loops over `middle`, which calls three
//! leaves doing 1, 2 and 4 units of work, so a correct profiler gives them
//! 1/7, 2/7 and 4/7 of the samples ([`demo`]; compiled by Cranelift in
//! `demo_cranelift` with the `cranelift` feature). The in-process agent's
//! tests, `jitmap-sim profile` and `jitmap profile --overhead` run it, and
//! write its profiles with [`output`].
//!
//! ```
//! # #[cfg(target_arch = "x86_64")] {
//! let manager = jitmap::ExecutionManager::new(4);
//! let demo = jitmap_demo::demo::Demo::publish(&manager)?;
//! let mut rng = jitmap_demo::rng::Rng::new(1);
//! let work = jitmap_demo::output::throughput(&demo, std::time::Duration::from_millis(10), &mut rng);
//! assert!(work > 0.0);
//! # }
//! # Ok::<(), jitmap_demo::demo::DemoError>(())
//! ```

pub mod demo;
#[cfg(feature = "cranelift")]
pub mod demo_cranelift;
pub mod output;
pub mod rng;
