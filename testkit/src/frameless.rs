//! Stacks that a frame-pointer walk gets wrong, for the agent's mixed
//! unwinder: JIT code that calls a native leaf built without frame pointers,
//! and JIT code that keeps no frame pointer at all (it uses rbp as a scratch
//! register) and says so in its `.eh_frame`.
//!
//! - [`Frameless::native_leaf`]: the host's [`drive_native`] calls JIT
//!   `jit_top`, which calls JIT `jit_mid`, which calls `frameless_leaf`, a C
//!   loop compiled at run time with `-O2 -fomit-frame-pointer` into a shared
//!   object and loaded with `dlopen`. A sample in the leaf has rbp still
//!   pointing at `jit_mid`'s frame, so a frame-pointer walk loses `jit_mid`.
//! - [`Frameless::jit_without_fp`]: [`drive_jit`] calls `jit_top_nofp`, which
//!   calls `jit_mid_nofp`, which loops. Neither sets up rbp: `jit_mid_nofp`
//!   saves it like any callee-saved register and fills it with garbage while
//!   it loops. Both carry an `.eh_frame` (built with gimli) that describes
//!   every instruction.
//!
//! The expected stacks, leaf first, are [`NATIVE_STACK`] and [`JIT_STACK`].

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{Encoding, Format, RunTimeEndian};
use iced_x86::IcedError;
use iced_x86::code_asm::{CodeAssembler, rax, rbp, rcx, rdi, rsp};
use jitmap::info::EhFrame as JitEhFrame;
use jitmap::{CodeInfo, CodeRef, JitKind, OwnedHeap};

use crate::demo::DemoError;

/// The innermost frames of a sample in the native leaf, leaf first.
pub const NATIVE_STACK: [&str; 4] = [
    "frameless_leaf",
    "jit_mid",
    "jit_top",
    "jitmap_testkit::frameless::drive_native",
];

/// The innermost frames of a sample in the frameless JIT code, leaf first.
pub const JIT_STACK: [&str; 3] = [
    "jit_mid_nofp",
    "jit_top_nofp",
    "jitmap_testkit::frameless::drive_jit",
];

/// The C leaf: a loop with no calls and no stack frame.
const LEAF_C: &str = r#"
#include <stdint.h>
uint64_t frameless_leaf(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}
"#;

/// A JIT entry point: `f(n)`.
type Entry = extern "C" fn(u64) -> u64;

/// The published workloads and the loaded leaf.
pub struct Frameless {
    native_top: Entry,
    jit_top: Entry,
    _code: Vec<CodeRef>,
}

impl Frameless {
    /// Compiles the C leaf into `dir` (with `cc`), loads it, and publishes
    /// the four JIT functions into `heap`. With `describe_all`, the two that
    /// keep frame pointers carry an `.eh_frame` too (what an outside
    /// unwinder such as perf's needs); without, the agent steps them by the
    /// frame-pointer convention.
    pub fn build(heap: &OwnedHeap, dir: &Path, describe_all: bool) -> Result<Self, DemoError> {
        let leaf = compile_leaf(dir)?;
        let framed = describe_all.then_some(FRAME_POINTER_CFI);
        let mid = publish(heap, "jit_mid", 1, &calls_with_frame(leaf), framed)?;
        let top = publish(
            heap,
            "jit_top",
            2,
            &calls_with_frame(mid.start() as u64),
            framed,
        )?;
        let mid_nofp = publish(
            heap,
            "jit_mid_nofp",
            3,
            &spins_without_frame,
            Some(MID_NOFP_CFI),
        )?;
        let top_nofp = publish(
            heap,
            "jit_top_nofp",
            4,
            &calls_without_frame(mid_nofp.start() as u64),
            Some(TOP_NOFP_CFI),
        )?;
        // SAFETY: published functions with this C signature (below).
        let (native_top, jit_top) = unsafe {
            (
                std::mem::transmute::<usize, Entry>(top.start()),
                std::mem::transmute::<usize, Entry>(top_nofp.start()),
            )
        };
        Ok(Self {
            native_top,
            jit_top,
            _code: vec![mid, top, mid_nofp, top_nofp],
        })
    }

    /// Runs the native-leaf stack once, `n` loop steps in the leaf.
    pub fn native_leaf(&self, n: u64) -> u64 {
        drive_native(self.native_top, n)
    }

    /// Runs the frameless JIT stack once, `n` loop steps in `jit_mid_nofp`.
    pub fn jit_without_fp(&self, n: u64) -> u64 {
        drive_jit(self.jit_top, n)
    }

    /// Moves `jit_top_nofp` (position-independent: it calls by absolute
    /// address) to a new address in `heap` with [`OwnedHeap::move_block`],
    /// and calls it there from now on. Returns the old and new starts. Call
    /// it between runs: the old copy is freed.
    pub fn move_jit_top(&mut self, heap: &OwnedHeap) -> Result<(usize, usize), jitmap::HeapError> {
        let old = self._code[3];
        let moved = heap.move_block(old)?;
        self._code[3] = moved;
        // SAFETY: the same function, published at its new start.
        self.jit_top = unsafe { std::mem::transmute::<usize, Entry>(moved.start()) };
        Ok((old.start(), moved.start()))
    }
}

/// Room after each method's code for the unwinding tables `perf inject
/// --jit` maps there (about 100 bytes for these methods).
pub const PERF_UNWIND_ROOM: u64 = 256;

/// Runs both stacks on a heap of `manager` for `duration`, two native-leaf
/// calls to one frameless JIT call; returns the calls made. `ready` is
/// called once the JIT code is published and the C leaf loaded, before the
/// first call (a host tells a profiler outside then). Every JIT
/// function carries an `.eh_frame` (for outside unwinders, through the
/// jitdump's records). The C leaf is built in [`object_dir`] and left there:
/// profilers read its symbols and unwind tables from the file after the
/// process ends (as perf reads its JIT `.so` files). The workload of
/// `jitmap-sim spin --frameless`.
pub fn run(
    manager: &jitmap::ExecutionManager,
    duration: std::time::Duration,
    ready: impl FnOnce(),
) -> Result<u64, DemoError> {
    let heap = manager.create_heap(jitmap::HeapConfig {
        span: 1 << 16,
        // perf maps each method's unwinding tables after its code.
        unwind_room: PERF_UNWIND_ROOM,
        ..jitmap::HeapConfig::default()
    })?;
    let dir = object_dir(std::process::id());
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Setup(format!("{dir:?}: {e}")))?;
    let frameless = Frameless::build(&heap, &dir, true)?;
    ready();
    let rounds = calls_for(duration, || {
        std::hint::black_box(frameless.native_leaf(200_000));
        std::hint::black_box(frameless.native_leaf(200_000));
        std::hint::black_box(frameless.jit_without_fp(200_000));
    });
    Ok(rounds * 3)
}

/// Calls `f` until `duration` has passed; how many times.
pub fn calls_for(duration: std::time::Duration, mut f: impl FnMut()) -> u64 {
    let deadline = std::time::Instant::now() + duration;
    let mut calls = 0;
    while std::time::Instant::now() < deadline {
        f();
        calls += 1;
    }
    calls
}

/// Where [`run`] in process `pid` builds its C leaf.
pub fn object_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("jitmap-frameless-{pid}"))
}

/// The host function under the native-leaf stack.
#[inline(never)]
pub fn drive_native(top: Entry, n: u64) -> u64 {
    std::hint::black_box(top(std::hint::black_box(n)))
}

/// The host function under the frameless JIT stack. (Its code differs from
/// [`drive_native`]'s, or the compiler merges the two.)
#[inline(never)]
pub fn drive_jit(top: Entry, n: u64) -> u64 {
    std::hint::black_box(top(std::hint::black_box(n)) ^ 1)
}

/// Builds and loads the C leaf; returns its address. The object stays
/// loaded for the process's life, so its code stays where the JIT code
/// calls it.
fn compile_leaf(dir: &Path) -> Result<u64, DemoError> {
    let object = build_shared_object(dir, "frameless_leaf", LEAF_C)?;
    let (_handle, leaf) = load(&object, c"frameless_leaf")?;
    Ok(leaf as u64)
}

/// The C leaf's source: `uint64_t frameless_leaf(uint64_t n)`, a loop of
/// `n` steps with no stack frame.
pub fn leaf_source() -> &'static str {
    LEAF_C
}

/// The C compiler for objects this process loads: `JITMAP_TEST_CC` if set;
/// on aarch64, `aarch64-linux-gnu-gcc` where that cross compiler is on the
/// PATH (a test running under qemu-user on an x86-64 host, whose `cc` makes
/// x86-64 objects); otherwise `cc`.
pub fn c_compiler() -> String {
    if let Ok(cc) = std::env::var("JITMAP_TEST_CC") {
        return cc;
    }
    let cross = "aarch64-linux-gnu-gcc";
    let on_path = || {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(cross).is_file()))
    };
    if cfg!(target_arch = "aarch64") && on_path() {
        cross.to_owned()
    } else {
        "cc".to_owned()
    }
}

/// Compiles `source` with [`c_compiler`] (`-O2 -fomit-frame-pointer`) into
/// `dir/lib<stem>.so`, with a build id (which tells two builds apart);
/// returns its path.
pub fn build_shared_object(dir: &Path, stem: &str, source: &str) -> Result<PathBuf, DemoError> {
    build_shared_object_with(dir, stem, source, &[])
}

/// [`build_shared_object`] with `extra` compiler flags after the usual ones.
pub fn build_shared_object_with(
    dir: &Path,
    stem: &str,
    source: &str,
    extra: &[&str],
) -> Result<PathBuf, DemoError> {
    let c = dir.join(format!("{stem}.c"));
    let object = dir.join(format!("lib{stem}.so"));
    std::fs::write(&c, source).map_err(|e| DemoError::Setup(format!("{c:?}: {e}")))?;
    let status = std::process::Command::new(c_compiler())
        .args([
            "-O2",
            "-fomit-frame-pointer",
            "-fPIC",
            "-shared",
            "-Wl,--build-id",
        ])
        .args(extra)
        .arg("-o")
        .arg(&object)
        .arg(&c)
        .status()
        .map_err(|e| DemoError::Setup(format!("running cc: {e}")))?;
    if !status.success() {
        return Err(DemoError::Setup(format!("cc failed: {status}")));
    }
    Ok(object)
}

/// A native C function of one u64 (`uint64_t f(uint64_t)`) under a JIT
/// caller: [`crate::arch::call_in_frame`] published as a method.
pub struct JitCaller {
    entry: extern "C" fn(u64) -> u64,
    _code: CodeRef,
}

impl JitCaller {
    /// Publishes into `heap`, as `name`, a method that calls `target` (the
    /// address of a C function of one u64) with its own argument, inside a
    /// frame record.
    pub fn publish(heap: &OwnedHeap, name: &str, target: usize) -> Result<Self, DemoError> {
        let body = crate::arch::call_in_frame(target);
        let mut r = heap.reserve(body.len() as u64)?;
        r.code_mut().copy_from_slice(&body);
        let code = r.publish(CodeInfo::new(1, name, JitKind::Optimized))?;
        // SAFETY: `call_in_frame` emits a complete C function of one u64
        // that calls `target`, a C function of one u64 (the caller's word).
        let entry =
            unsafe { std::mem::transmute::<usize, extern "C" fn(u64) -> u64>(code.start()) };
        Ok(Self { entry, _code: code })
    }

    /// Calls the method with `n`. Not inlined: it is the host's frame
    /// under the JIT caller.
    #[inline(never)]
    pub fn call(&self, n: u64) -> u64 {
        std::hint::black_box((self.entry)(std::hint::black_box(n)))
    }
}

/// `dlopen`s `object` and looks up `symbol`: the handle (for `dlclose`) and
/// the symbol's address.
pub fn load(object: &Path, symbol: &CStr) -> Result<(*mut libc::c_void, usize), DemoError> {
    let path = CString::new(object.to_string_lossy().as_bytes())
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    // SAFETY: a valid, NUL-terminated path.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(DemoError::Setup(format!("dlopen {object:?} failed")));
    }
    // SAFETY: a live handle and a NUL-terminated symbol name.
    let address = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if address.is_null() {
        // SAFETY: the handle opened above, closed once.
        unsafe { libc::dlclose(handle) };
        return Err(DemoError::Setup(format!(
            "{symbol:?} not found in {object:?}"
        )));
    }
    Ok((handle, address as usize))
}

/// A function body assembled at its address.
type Body = dyn Fn(&mut CodeAssembler) -> Result<(), IcedError>;

/// `push rbp; mov rbp, rsp; call target; pop rbp; ret`: a frame-pointer
/// frame (described by the convention, no CFI).
fn calls_with_frame(target: u64) -> impl Fn(&mut CodeAssembler) -> Result<(), IcedError> {
    move |a| {
        a.push(rbp)?;
        a.mov(rbp, rsp)?;
        a.mov(rax, target)?;
        a.call(rax)?;
        a.pop(rbp)?;
        a.ret()
    }
}

/// `sub rsp, 8; call target; add rsp, 8; ret`: no frame pointer.
fn calls_without_frame(target: u64) -> impl Fn(&mut CodeAssembler) -> Result<(), IcedError> {
    move |a| {
        a.sub(rsp, 8)?; // 4 bytes
        a.mov(rax, target)?; // 10
        a.call(rax)?; // 2
        a.add(rsp, 8)?; // 4
        a.ret()
    }
}

/// Saves rbp, fills it with garbage, loops `rdi` times, restores it.
fn spins_without_frame(a: &mut CodeAssembler) -> Result<(), IcedError> {
    a.push(rbp)?; // 1 byte
    a.sub(rsp, 16)?; // 4
    a.mov(rbp, 0x0bad_f00d_u64)?; // 10
    a.mov(rcx, rdi)?; // 3
    let mut again = a.create_label();
    a.set_label(&mut again)?;
    a.dec(rcx)?;
    a.jnz(again)?;
    a.mov(rax, rdi)?;
    a.add(rsp, 16)?;
    a.pop(rbp)?;
    a.ret()
}

/// CFI rows as (code offset, whether the CFA is computed from rbp (else
/// rsp), the CFA's offset from it, whether rbp is saved at CFA - 16), from
/// the first instruction; the last row covers the `ret`.
pub type Cfi = &'static [(u32, bool, i32, bool)];

/// `spins_without_frame`: `push rbp` (1 byte), `sub rsp, 16` (4), `mov rbp,
/// imm64` (10), `mov rcx, rdi` (3), `dec rcx` (3), `jnz` (2), `mov rax, rdi`
/// (3), `add rsp, 16` at 26 (4), `pop rbp` at 30, `ret` at 31. CFA = rsp+16
/// with rbp saved after the push, rsp+32 after the `sub`, rsp+16 after the
/// `add`, rsp+8 with rbp restored after the pop.
const MID_NOFP_CFI: Cfi = &[
    (0, false, 8, false),
    (1, false, 16, true),
    (5, false, 32, true),
    (30, false, 16, true),
    (31, false, 8, false),
];

/// `calls_without_frame`: CFA = rsp+16 between `sub rsp, 8` (4 bytes) and
/// `add rsp, 8` (at 16, 4 bytes), rsp+8 at the `ret` (20).
const TOP_NOFP_CFI: Cfi = &[
    (0, false, 8, false),
    (4, false, 16, false),
    (20, false, 8, false),
];

/// `calls_with_frame` (and any `push rbp; mov rbp, rsp; mov rax, imm64;
/// call rax; pop rbp; ret`): `push rbp` (1 byte), `mov rbp, rsp` (3), `mov rax,
/// imm64` (10), `call rax` (2), `pop rbp` at 16, `ret` at 17. CFA = rsp+16
/// with rbp saved after the push, rbp+16 once rbp is set, rsp+8 after the
/// pop.
pub const FRAME_POINTER_CFI: Cfi = &[
    (0, false, 8, false),
    (1, false, 16, true),
    (4, true, 16, true),
    (17, false, 8, false),
];

/// Assembles `body` at a reserved address and publishes it as `name`, with
/// an `.eh_frame` built from `cfi` if given.
fn publish(
    heap: &OwnedHeap,
    name: &str,
    method_id: u64,
    body: &Body,
    cfi: Option<Cfi>,
) -> Result<CodeRef, DemoError> {
    let mut a = CodeAssembler::new(64)?;
    body(&mut a)?;
    let size = a.assemble(0)?.len() as u64;
    let mut r = heap.reserve(size)?;
    let mut a = CodeAssembler::new(64)?;
    body(&mut a)?;
    let bytes = a.assemble(r.address() as u64)?;
    r.code_mut().copy_from_slice(&bytes);
    let mut info = CodeInfo::new(method_id, name, JitKind::Optimized);
    info.eh_frame = cfi.map(|rows| JitEhFrame {
        frame: eh_frame(r.address(), bytes.len() as u32, rows),
        header: Box::new([]),
    });
    Ok(r.publish(info)?)
}

/// An `.eh_frame` for code of `len` bytes at `start`, in this
/// architecture's registers (`arch::DWARF_SP_FP_RA`): one CIE (x86-64:
/// CFA = rsp+8, the return address at CFA-8; aarch64: CFA = sp, the return
/// address in x30, saved at CFA-8 with the frame record) and one FDE with
/// `rows`.
///
/// ```
/// use jitmap_testkit::frameless::{FRAME_POINTER_CFI, eh_frame};
/// // The first record is the CIE: the word after its length, its id, is 0.
/// let frame = eh_frame(0x1000, 18, FRAME_POINTER_CFI);
/// assert_eq!(&frame[4..8], &[0, 0, 0, 0]);
/// ```
pub fn eh_frame(start: usize, len: u32, rows: Cfi) -> Box<[u8]> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let [sp, fp, ra] = crate::arch::DWARF_SP_FP_RA;
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, ra);
    cie.add_instruction(CallFrameInstruction::Cfa(sp, crate::arch::ENTRY_CFA));
    // Where a call pushes the return address, it is below the CFA; where it
    // leaves it in the link register, it stays there until the frame
    // record saves it.
    let ra_in_record = crate::arch::ENTRY_CFA == 0;
    if !ra_in_record {
        cie.add_instruction(CallFrameInstruction::Offset(ra, -8));
    }
    let mut table = FrameTable::default();
    let cie = table.add_cie(cie);
    let mut fde = FrameDescriptionEntry::new(Address::Constant(start as u64), len);
    let mut saved = false;
    for &(offset, on_rbp, cfa, rbp_saved) in rows {
        let base = if on_rbp { fp } else { sp };
        fde.add_instruction(offset, CallFrameInstruction::Cfa(base, cfa));
        if rbp_saved && !saved {
            fde.add_instruction(offset, CallFrameInstruction::Offset(fp, -16));
            if ra_in_record {
                fde.add_instruction(offset, CallFrameInstruction::Offset(ra, -8));
            }
        } else if !rbp_saved && saved {
            fde.add_instruction(offset, CallFrameInstruction::Restore(fp));
            if ra_in_record {
                fde.add_instruction(offset, CallFrameInstruction::Restore(ra));
            }
        }
        saved = rbp_saved;
    }
    table.add_fde(cie, fde);
    let mut section = EhFrame(EndianVec::new(RunTimeEndian::Little));
    table
        .write_eh_frame(&mut section)
        .expect("a CIE and an FDE built above always encode");
    section.0.into_vec().into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_stacks_run_and_the_cfi_offsets_match_the_code() {
        if !cfg!(target_arch = "x86_64") {
            println!("skipped on aarch64: iced-x86 code");
            return;
        }
        let manager = jitmap::ExecutionManager::new(4);
        let heap = manager
            .create_heap(jitmap::HeapConfig {
                span: 1 << 16,
                ..Default::default()
            })
            .unwrap();
        let dir = std::env::temp_dir().join(format!("frameless-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = Frameless::build(&heap, &dir, true).unwrap();
        // `jit_mid_nofp` returns its count; `drive_jit` flips the low bit.
        assert_eq!(f.jit_without_fp(1000), 1001);
        // The leaf's closed form for n = 1: one step from 1.
        assert_eq!(
            f.native_leaf(1),
            6364136223846793005u64.wrapping_add(1442695040888963407)
        );
        // The instruction offsets the CFI rows name.
        let mut a = CodeAssembler::new(64).unwrap();
        spins_without_frame(&mut a).unwrap();
        assert_eq!(a.assemble(0).unwrap().len(), 32);
        let mut a = CodeAssembler::new(64).unwrap();
        calls_without_frame(0x1234_5678_9abc)(&mut a).unwrap();
        assert_eq!(a.assemble(0).unwrap().len(), 21);
        let mut a = CodeAssembler::new(64).unwrap();
        calls_with_frame(0x1234_5678_9abc)(&mut a).unwrap();
        assert_eq!(a.assemble(0).unwrap().len(), 18);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
