//! `spin`: publishes real x86-64 functions with distinct names and runs them in
//! hot loops, so a profiler has JIT code to sample and name.

use std::time::{Duration, Instant};

use jitmap::heap::{DebugEntry, JitKind};
use jitmap::manager::ManagerError;
use jitmap::{CodeInfo, CodeRef, ExecutionManager, HeapConfig, HeapError};

/// Iterations of each function's inner loop.
const INNER_LOOPS: u32 = 20_000;

/// Machine code for function `id`: count `INNER_LOOPS` down, then return `id`.
///
/// ```text
/// mov ecx, INNER_LOOPS   ; b9 imm32
/// L: dec ecx             ; ff c9
/// jnz L                  ; 75 fc
/// mov eax, id            ; b8 imm32
/// ret                    ; c3
/// ```
pub fn function_code(id: u32) -> Vec<u8> {
    padded_function_code(id, 0)
}

/// [`function_code`] with `pad` one-byte NOPs before it: the hot loop then
/// sits `pad` bytes into the method, where a v1 lookup must walk back to
/// find the start (what the capped walks of the agent and the eBPF
/// profiler are tested with).
pub fn padded_function_code(id: u32, pad: usize) -> Vec<u8> {
    let mut code = vec![0x90; pad];
    code.push(0xB9);
    code.extend_from_slice(&INNER_LOOPS.to_le_bytes());
    code.extend_from_slice(&[0xFF, 0xC9, 0x75, 0xFC, 0xB8]);
    code.extend_from_slice(&id.to_le_bytes());
    code.push(0xC3);
    code
}

/// The name of spin function `id`.
pub fn function_name(id: u32) -> String {
    format!("jitmap_spin_{id}")
}

/// What a spin run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpinReport {
    /// Functions published.
    pub functions: u32,
    /// Calls made.
    pub calls: u64,
    /// Calls that returned the wrong value.
    pub wrong: u64,
    /// Moves made while churning.
    pub moves: u64,
    /// Republishes made while churning.
    pub republishes: u64,
}

/// How a spin run changes its heap while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Churn {
    /// Publish once, then only call.
    Off,
    /// Each round, move one function and free and republish another.
    On,
    /// As `On`, and each republish gets a name of its own,
    /// `jitmap_spin_{id}@{round}`, so that a (start, name) pair in the perf map
    /// names one placement (what the out-of-process test checks answers with).
    UniqueNames,
}

/// How a spin run lays out its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Functions to publish.
    pub functions: u32,
    /// The heap's map version.
    pub version: jitmap::MapVersion,
    /// NOPs before each function's loop ([`padded_function_code`]).
    pub pad: usize,
    /// Names are padded with `_` to at least this many bytes (for readers
    /// that cut long names).
    pub name_width: usize,
}

impl Layout {
    /// The name of function `id` as published (`suffix` is the republish
    /// round's, if any).
    fn name(&self, id: u32, suffix: &str) -> String {
        let name = format!("{}{suffix}", function_name(id));
        format!("{name:_<width$}", width = self.name_width)
    }
}

fn publish(
    heap: &jitmap::CodeHeap,
    id: u32,
    name: String,
    pad: usize,
) -> Result<CodeRef, HeapError> {
    let code = padded_function_code(id, pad);
    let mut r = heap.reserve(code.len() as u64)?;
    r.code_mut().copy_from_slice(&code);
    let info = CodeInfo {
        debug: vec![
            DebugEntry {
                offset: 0,
                line: 10 + id,
                column: 1,
                file: "spin.jit".into(),
            },
            DebugEntry {
                offset: 5 + pad as u32,
                line: 11 + id,
                column: 5,
                file: "spin.jit".into(),
            },
        ],
        ..CodeInfo::new(u64::from(id), name, JitKind::Optimized)
    };
    r.publish(info)
}

/// The span of the heap [`run`] creates for `functions` functions with `pad`
/// bytes before each loop: room for every function twice (moves and
/// republishes), at least 16 MiB.
pub fn heap_span(functions: u32, pad: usize) -> u64 {
    (16u64 << 20).max(
        (2 * u64::from(functions) * (pad as u64 + 64))
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    )
}

/// Publishes `layout.functions` functions in a heap of `manager` and calls
/// them round robin for `duration`, changing the heap as `churn` says; with
/// `gdb`, the heap announces its functions through the GDB JIT interface.
/// Needs x86-64.
pub fn run(
    manager: &ExecutionManager,
    layout: Layout,
    duration: Duration,
    churn: Churn,
    gdb: bool,
) -> Result<SpinReport, ManagerError> {
    let Layout {
        functions,
        version,
        pad,
        ..
    } = layout;
    let span = heap_span(functions, pad);
    let heap = manager.create_heap(HeapConfig {
        span,
        version,
        gdb_jit: gdb,
        ..HeapConfig::default()
    })?;
    let mut refs = (0..functions)
        .map(|id| publish(&heap, id, layout.name(id, ""), pad))
        .collect::<Result<Vec<_>, _>>()?;
    let mut report = SpinReport {
        functions,
        ..SpinReport::default()
    };
    let deadline = Instant::now() + duration;
    let mut round = 0usize;
    while Instant::now() < deadline {
        if churn != Churn::Off && !refs.is_empty() {
            let n = refs.len();
            let m = round % n;
            refs[m] = heap.move_block(refs[m])?;
            report.moves += 1;
            let p = (round + n / 2) % n;
            heap.free(refs[p])?;
            let name = match churn {
                Churn::UniqueNames => layout.name(p as u32, &format!("@{round}")),
                _ => layout.name(p as u32, ""),
            };
            refs[p] = publish(&heap, p as u32, name, pad)?;
            report.republishes += 1;
            heap.try_reclaim();
        }
        round += 1;
        for (id, r) in refs.iter().enumerate() {
            // SAFETY: `r` is a published, complete function with the C ABI (above),
            // and it stays published until the loop ends.
            let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(r.start()) };
            report.calls += 1;
            report.wrong += u64::from(f() != id as u32);
        }
    }
    for r in refs {
        heap.free(r)?;
    }
    Ok(report)
}
