//! The same programs on cranelift-jit and on `JitmapModule`: every result
//! equal, and equal to the reference computed in Rust.

mod programs;

use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::default_libcall_names;
use jitmap::ExecutionManager;
use jitmap_cranelift::{JitmapBuilder, JitmapModule};
use programs::{Programs, f1, f2, host_mul_add};

/// Each program's results over a range of inputs, through `address`.
fn results(address: impl Fn(cranelift_module::FuncId) -> *const u8, p: &Programs) -> Vec<i64> {
    let mut out = Vec::new();
    // SAFETY: each id was defined with the signature used here.
    unsafe {
        let fib = f1(address(p.fib));
        let ack = f2(address(p.ack));
        let sum_to = f1(address(p.sum_to));
        let fib_twice = f1(address(p.fib_twice));
        let calls_host = f2(address(p.calls_host));
        let bump = f1(address(p.bump));
        out.extend((0..20).map(|n| fib(n)));
        out.extend((0..3).flat_map(|m| (0..4).map(move |n| ack(m, n))));
        out.extend([0, 1, 10, 1000].map(|n| sum_to(n)));
        out.extend((0..15).map(|n| fib_twice(n)));
        out.extend([(2, 3), (-4, 5), (1 << 20, 3)].map(|(a, b)| calls_host(a, b)));
        out.extend([1, 2, 3].map(|n| bump(n)));
    }
    out
}

#[test]
fn cranelift_jit_and_jitmap_compute_the_same() {
    let mut builder = JITBuilder::new(default_libcall_names()).unwrap();
    builder.symbol("host_mul_add", host_mul_add as *const u8);
    let mut jit = JITModule::new(builder);
    let p_jit = programs::define(&mut jit);
    jit.finalize_definitions().unwrap();
    let from_jit = results(|f| jit.get_finalized_function(f), &p_jit);

    let manager = ExecutionManager::new(4);
    let mut builder = JitmapBuilder::new(&manager, default_libcall_names()).unwrap();
    builder.symbol("host_mul_add", host_mul_add as *const u8);
    let mut module = JitmapModule::new(builder).unwrap();
    let p = programs::define(&mut module);
    module.finalize_definitions().unwrap();
    let from_jitmap = results(|f| module.get_finalized_function(f), &p);

    assert_eq!(from_jitmap, from_jit);
    // And both are right.
    let mut expected: Vec<i64> = (0..20).map(programs::fib).collect();
    expected.extend((0..3).flat_map(|m| (0..4).map(move |n| programs::ack(m, n))));
    expected.extend([0, 1, 10, 1000].map(|n: i64| n * (n - 1).max(0) / 2));
    expected.extend((0..15).map(|n| 2 * programs::fib(n)));
    expected.extend([(2i64, 3i64), (-4, 5), (1 << 20, 3)].map(|(a, b)| a * b + 1));
    expected.extend([101, 103, 106]);
    assert_eq!(from_jitmap, expected);
    // The counter is data in ordinary memory, not in the code heap.
    let (counter, size) = module.get_finalized_data(p.counter);
    assert_eq!(size, 8);
    // SAFETY: the counter is an aligned i64 the code no longer writes.
    assert_eq!(unsafe { counter.cast::<i64>().read() }, 106);
    let heap = module.heap();
    let base = heap.base();
    assert!(!(base..base + heap.span() as usize).contains(&counter.addr()));
    // Every function is found by its name, exactly.
    let reader = manager.register_reader().unwrap();
    let guard = manager.pin(&reader).unwrap();
    for (id, name) in [(p.fib, "fib"), (p.ack, "ack"), (p.bump, "bump")] {
        let code = module.function_code(id).unwrap();
        let block = guard.find(code.start() + code.size() as usize - 1).unwrap();
        assert_eq!((block.name(), block.start()), (Some(name), code.start()));
        assert!(
            guard
                .find(code.start() + code.size() as usize)
                .is_none_or(|b| b.start() != code.start())
        );
    }
}
