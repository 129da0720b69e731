//! The sampling signal handler: registers from the `ucontext`, a bounded and
//! validated frame-pointer walk, one lookup per frame under a pinned guard, one
//! record into the thread's ring.
//!
//! It allocates nothing, takes no lock and makes three calls outside its own
//! code, all async-signal-safe: `clock_gettime` (a vDSO read on Linux),
//! `timer_settime` when it backs its thread off ([`super::pace`]), and
//! `write` to the collector's eventfd when its ring fills to its bell
//! ([`super::doorbell`]; errno kept). It reaches
//! everything through the thread's record, which it finds by the salted token
//! the timer's `sigev_value` carries, checked against the agent's table of
//! attached threads ([`super::registry`]) before anything is read, so it
//! needs no thread-local storage.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, compiler_fence};

use crate::manager::{CodeBlock, Lookup, ManagerGuard};

use super::native::ModuleTable;
use super::record::{FrameKind, RECORD_MAGIC, RawFrame, SampleHeader, ThreadRecord};
use super::ring::Pushed;
use super::rule_cache::RuleCache;
use crate::unwind::{self, Regs, Rule, Stack, StackEnd};

pub(crate) use crate::arch::Registers;
use crate::arch::{self, LeafState};

/// The signal's disposition before the agent installed its handler: the
/// handler passes on every signal that is not one of its own timers'.
/// `handler` is a `sa_sigaction` value (`SIG_DFL`, `SIG_IGN` or a function);
/// `flags` its `sa_flags`. Written before the handler is installed and after
/// it is removed, so a handler always reads a settled pair.
static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
static PREVIOUS_FLAGS: AtomicUsize = AtomicUsize::new(0);

/// Remembers the disposition the agent's handler replaces, for chaining.
pub(crate) fn set_previous(previous: &libc::sigaction) {
    // Release: the handler, once installed (a system call later), reads the
    // pair with Acquire.
    PREVIOUS_FLAGS.store(previous.sa_flags as usize, Ordering::Release);
    PREVIOUS_HANDLER.store(previous.sa_sigaction, Ordering::Release);
}

/// The signal handler installed by [`super::Agent::start`].
///
/// A signal is the agent's own when it comes from a POSIX timer (`SI_TIMER`)
/// whose value is the token of an attached thread (see [`super::registry`]);
/// the value is checked against the table before anything is read through
/// it. Every other signal (a host's own timer on the same signal, `kill`,
/// `raise`) goes to the disposition the agent replaced: a handler function is
/// called with the same arguments, in the form its `SA_SIGINFO` flag says;
/// `SIG_IGN` and `SIG_DFL` drop it (the default action of the agent's
/// signals is to end the process, which a host that armed a timer on it did
/// not want while the agent runs).
pub(crate) extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: errno is a thread-local the C library keeps at a fixed address;
    // reading it is async-signal-safe.
    let errno = unsafe { *libc::__errno_location() };
    let began_ns = crate::events::monotonic_ns();
    // SAFETY: an SA_SIGINFO handler receives a valid siginfo_t.
    let (code, value) = unsafe { ((*info).si_code, (*info).si_value().sival_ptr as u64) };
    // Whoever detaches or stops sees this handler in flight on the value's
    // slot before it goes on, or it sees their changes (the registry's fence
    // handshake).
    let in_flight = super::registry::enter(value);
    // SAFETY: this handler is in flight (`enter` above) until after its last
    // use of the record.
    let record = (code == libc::SI_TIMER)
        .then(|| unsafe { super::registry::lookup(value) })
        .flatten();
    match record {
        Some(record) if record.magic == RECORD_MAGIC => {
            // SAFETY: the kernel passes a valid ucontext_t.
            let regs = unsafe { arch::registers(context) };
            // The expirations this one signal stands for: the timer's
            // overrun counts those that came while the signal was still
            // pending (a thread waiting for a CPU, a CPU timer that fires
            // once per scheduler tick). SAFETY: an SI_TIMER siginfo has its
            // timer fields.
            let overrun = u32::try_from(unsafe { (*info).si_overrun() }).unwrap_or(0);
            // In configured periods: a backed-off timer's signal stands for
            // several.
            let weight = record.pace.weight(overrun);
            if record.owns_stack_of(regs) {
                sample(record, regs, weight, began_ns);
            } else {
                // Not on the thread's own stack (a fiber, a sigaltstack, or
                // another thread): its ring has one producer, the thread on
                // that stack, so the sample is counted (taken, as every
                // signal the handler ran for) and dropped.
                // Relaxed: a statistic, as in `sample`.
                record.taken.fetch_add(1, Ordering::Relaxed);
                record.drop_sample(weight);
            }
            delay_for_tests(began_ns);
            record
                .pace
                .after_sample(overrun, began_ns, crate::events::monotonic_ns());
            // The sample's writes happen before `stop` sees no handler in
            // flight.
            super::registry::leave(in_flight);
        }
        _ => {
            // Not ours: done with the registry before the host's handler
            // runs, since that one may never come back here (it may
            // `siglongjmp` out, call `pthread_exit` or block), and a count
            // left raised would hang every later detach and `stop`.
            super::registry::leave(in_flight);
            pass_on(signal, info, context);
        }
    }
    // SAFETY: as above; restoring the interrupted code's errno.
    unsafe { *libc::__errno_location() = errno };
}

/// A test's stand-in for a slow handler: nanoseconds each of the agent's
/// handlers spins before it returns (0, the default, spins not at all).
static DELAY_NS: AtomicU64 = AtomicU64::new(0);

/// Sets [`DELAY_NS`] (`jitmap::agent::testing::slow_handler`).
pub(crate) fn set_delay_for_tests(delay_ns: u64) {
    // Relaxed: a test knob; the handler may see a change a little late.
    DELAY_NS.store(delay_ns, Ordering::Relaxed);
}

/// Spins until [`DELAY_NS`] have passed since `began_ns`; only reads the
/// clock (async-signal-safe).
#[inline]
fn delay_for_tests(began_ns: u64) {
    // Relaxed: as in `set_delay_for_tests`.
    let delay = DELAY_NS.load(Ordering::Relaxed);
    while delay != 0 && crate::events::monotonic_ns().saturating_sub(began_ns) < delay {
        std::hint::spin_loop();
    }
}

/// Hands a signal that is not the agent's to the disposition it replaced.
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // Acquire: pairs with `set_previous`.
    let handler = PREVIOUS_HANDLER.load(Ordering::Acquire);
    let flags = PREVIOUS_FLAGS.load(Ordering::Acquire);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return;
    }
    if flags & libc::SA_SIGINFO as usize != 0 {
        // SAFETY: with SA_SIGINFO, `sa_sigaction` is a three-argument handler,
        // and the arguments are the ones the kernel gave this handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(signal, info, context);
    } else {
        // SAFETY: without SA_SIGINFO, `sa_sigaction` is a one-argument handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(signal);
    }
}

/// Takes one sample of the interrupted thread into its ring, standing for
/// `weight` timer expirations; the handler began at `begin_ns`.
pub(crate) fn sample(record: &ThreadRecord, regs: Registers, weight: u32, begin_ns: u64) {
    // Relaxed: a statistic; `fetch_add` because a synchronous sample on the
    // same thread may be between its own load and store.
    record.taken.fetch_add(1, Ordering::Relaxed);
    if enter_producer(record, weight) {
        push_sample(record, regs, weight, begin_ns);
        leave_producer(record);
    }
}

/// Samples the calling thread's own stack now, through the handler's code
/// path: frame 0 is in this function, then the frame-pointer chain from the
/// frame pointer it was called with.
#[inline(never)]
pub(crate) fn sample_synchronously(record: &ThreadRecord) {
    // Relaxed: as in `sample`.
    record.taken.fetch_add(1, Ordering::Relaxed);
    if enter_producer(record, 1) {
        let begin_ns = crate::events::monotonic_ns();
        push_sample(record, arch::current_registers(), 1, begin_ns);
        leave_producer(record);
    }
}

/// Becomes the ring's producer, unless code this one interrupted on the
/// same thread (a sample, the agent's handler, or another handler's
/// `sample_now`) is between its own enter and leave: then the sample, which
/// stands for `weight` periods, is counted as dropped, since a second
/// producer would write the slot the first is filling. Every path into
/// [`push_sample`] goes through here.
#[inline(always)]
fn enter_producer(record: &ThreadRecord, weight: u32) -> bool {
    // Relaxed: only this thread and the handlers that interrupt it touch the
    // depth, and one read-modify-write instruction cannot be split by a
    // signal; a handler runs to completion and restores the depth it found.
    let outer = record.busy.fetch_add(1, Ordering::Relaxed);
    // Keeps the push after the increment in program order.
    compiler_fence(Ordering::SeqCst);
    if outer == 0 {
        return true;
    }
    record.drop_sample(weight);
    leave_producer(record);
    false
}

/// Ends what [`enter_producer`] began (or undoes a refused enter).
#[inline(always)]
fn leave_producer(record: &ThreadRecord) {
    // Keeps the push before the decrement in program order.
    compiler_fence(Ordering::SeqCst);
    // Relaxed: as in `enter_producer`.
    record.busy.fetch_sub(1, Ordering::Relaxed);
}

/// Pins, walks and pushes one sample; the caller is the ring's only producer.
#[inline(always)]
fn push_sample(record: &ThreadRecord, regs: Registers, weight: u32, begin_ns: u64) {
    let Ok(guard) = record.manager.pin(&record.reader.0) else {
        // Nested too deeply to pin: count the sample as dropped.
        record.drop_sample(weight);
        return;
    };
    let mut lookups = 0u64;
    // SAFETY: one producer at a time: every caller entered through
    // `enter_producer`, which refuses a second one on this thread (the only
    // thread whose samples go to this ring); so the walk inside is that one
    // producer too, as `walk` asks.
    let pushed = unsafe {
        record.samples.push(|header, frames| {
            let walked = walk(&guard, record, regs, frames);
            record.count_end(walked.end, weight);
            lookups = walked.depth as u64;
            *header = SampleHeader {
                begin_ns,
                end_ns: crate::events::monotonic_ns(),
                depth: walked.depth as u32,
                weight,
                end: walked.end as u8,
                native_from: walked.native_from,
                rows_loader: walked.rows_loader,
            };
        })
    };
    match pushed {
        // A full ring: it counted the sample.
        Pushed::Dropped => record.count_dropped_periods(weight),
        Pushed::KeptAtBell => record.doorbell.ring(),
        Pushed::Kept => {}
    }
    drop(guard);
    // Relaxed: a statistic; `fetch_add` as for `taken`.
    record.lookups.fetch_add(lookups, Ordering::Relaxed);
}

/// One walk's outcome.
pub(crate) struct Walked {
    /// Frames written.
    pub(crate) depth: usize,
    /// Why the walk ended.
    pub(crate) end: StackEnd,
    /// The first frame stepped by a native object's rows (`u32::MAX`:
    /// none), and the loader's counts when those rows were made.
    pub(crate) native_from: u32,
    pub(crate) rows_loader: (u64, u64),
}

/// Walks the stack from `regs` into `frames` the way the agent is
/// configured to.
///
/// # Safety
/// The caller is `record`'s thread's one sample producer (inside
/// `push_sample`'s push): the walk uses the thread's rule cache.
pub(crate) unsafe fn walk(
    guard: &ManagerGuard<'_>,
    record: &ThreadRecord,
    regs: Registers,
    frames: &mut [RawFrame],
) -> Walked {
    let stack = Stack {
        lo: record.stack_lo.max(regs.sp),
        hi: record.stack_hi,
    };
    let frameless = record.manager.frameless_stubs();
    match &record.modules {
        // SAFETY: the record's rule cache, and the caller is its thread's
        // one producer (`walk`'s contract).
        Some(modules) => unsafe {
            walk_mixed(
                guard,
                modules.get(guard),
                Some(&record.rules),
                frameless,
                &stack,
                regs,
                frames,
            )
        },
        None => {
            let (depth, end) = walk_frame_pointers(guard, frameless, &stack, regs, frames);
            Walked {
                depth,
                end,
                native_from: u32::MAX,
                rows_loader: (0, 0),
            }
        }
    }
}

/// Whether a leaf caught in a stub of `kind` has its return address on top
/// of the stack: the host declared the kind frameless
/// ([`crate::ExecutionManager::declare_frameless_stub`]; `frameless` has
/// bit k for kind k).
#[inline]
fn frameless_stub(frame: &RawFrame, frameless: u32) -> bool {
    frame.kind == FrameKind::Stub && frameless & (1u32 << (frame.key & 31)) != 0
}

/// The mixed walk: every frame is stepped with a rule, from the JIT method's
/// unwind rows (its CFI), the native object's `.eh_frame`, or the
/// frame-pointer convention for JIT code without CFI.
///
/// # Safety
/// `rules`, when given, is the calling thread's own cache, and the caller
/// its one sample producer.
pub(super) unsafe fn walk_mixed(
    guard: &ManagerGuard<'_>,
    modules: Option<&ModuleTable>,
    rules: Option<&RuleCache>,
    frameless: u32,
    stack: &Stack,
    regs: Registers,
    frames: &mut [RawFrame],
) -> Walked {
    let mut regs = Regs {
        pc: regs.pc,
        sp: regs.sp,
        fp: Some(regs.fp),
        lr: arch::RETURN_ADDRESS_IN_LINK_REGISTER.then_some(regs.lr),
    };
    let mut walked = Walked {
        depth: frames.len(),
        end: StackEnd::DepthLimit,
        native_from: u32::MAX,
        rows_loader: modules.map_or((0, 0), ModuleTable::loader),
    };
    // Whether the last step placed the stack pointer by the frame-pointer
    // convention alone, where the record may be at the frame's bottom.
    let mut sp_guessed = false;
    // Read before every walk of the range map below: a native frame cached
    // at this value is still outside every section ([`RuleCache::native`]).
    let seq = guard.sections_seq();
    for (n, slot) in frames.iter_mut().enumerate() {
        let is_return = n > 0;
        let at = lookup_address(regs.pc, is_return);
        let cached = match (modules, rules) {
            // SAFETY: the caller's contract.
            (Some(t), Some(cache)) => unsafe { cache.native(t, at, seq) },
            _ => None,
        };
        let (frame, code) = match cached {
            // Native code: what `classify` gives outside every section.
            Some(_) => (
                RawFrame {
                    addr: regs.pc,
                    ..RawFrame::default()
                },
                None,
            ),
            None => classify(guard, regs.pc, at),
        };
        *slot = frame;
        // Whether this frame is stepped by the frame-pointer convention
        // alone (no CFI says where its caller's stack pointer is).
        let mut by_convention = false;
        let rule = match (frame.kind, code) {
            (FrameKind::Native, _) => {
                let rule = match (cached, modules, rules) {
                    (Some(rule), ..) => rule,
                    // SAFETY: the caller's contract.
                    (None, Some(t), Some(cache)) => unsafe { cache.rule(t, at, seq) },
                    (None, Some(t), None) => t.rule(at),
                    (None, None, _) => Err(StackEnd::NoUnwindInfo),
                };
                if rule.is_ok() && walked.native_from == u32::MAX {
                    walked.native_from = n as u32;
                }
                rule
            }
            (_, Some(code)) => {
                let state = if is_return {
                    LeafState::Settled
                } else {
                    leaf_state(regs.pc, code)
                };
                match state {
                    // A JIT leaf at its first instruction or at a `ret` has
                    // its return address on top of the stack, whatever its
                    // CFI says: Cranelift's, for one, describes the prologue
                    // but not the epilogue, and at `ret` would still place
                    // the CFA by rbp, which already holds the caller's frame.
                    LeafState::AtEntry => Ok(Rule::AT_ENTRY),
                    _ => unwind::rows::rule_at(code.block.unwind_rows(), at - code.block.start())
                        .unwrap_or_else(|| {
                            by_convention = state == LeafState::Settled;
                            Ok(leaf_rule(state))
                        }),
                }
            }
            // A leaf in a stub that pushes no frame: its caller's return
            // address is on top of the stack.
            (FrameKind::Stub, None) if !is_return && frameless_stub(&frame, frameless) => {
                Ok(Rule::AT_ENTRY)
            }
            // Other stubs, image methods and unattributed code keep frame
            // pointers or are stepped as if they did.
            (_, None) => {
                by_convention = true;
                Ok(Rule::FRAME_POINTER)
            }
        };
        let rule = rule.map(|rule| {
            let guessed = sp_guessed;
            sp_guessed = !arch::FRAME_RECORD_AT_TOP && by_convention;
            if guessed {
                by_frame_record(rule, regs)
            } else {
                rule
            }
        });
        match rule.and_then(|rule| unwind::step(regs, rule, stack)) {
            Ok(next) => regs = next,
            Err(end) => {
                walked.depth = n + 1;
                walked.end = end;
                return walked;
            }
        }
    }
    walked
}

/// The frame-pointer walk: the leaf, then one frame per saved frame pointer.
pub(super) fn walk_frame_pointers(
    guard: &ManagerGuard<'_>,
    frameless: u32,
    stack: &Stack,
    regs: Registers,
    frames: &mut [RawFrame],
) -> (usize, StackEnd) {
    if frames.is_empty() {
        return (0, StackEnd::DepthLimit);
    }
    let (first, code) = classify(guard, regs.pc, regs.pc);
    frames[0] = first;
    let mut n = 1;
    // The leaf may be in its prologue or at its `ret`, or in a stub that
    // pushes no frame: then the return address is on top of the stack and the
    // frame pointer still names the caller's frame.
    let unsettled = match code {
        Some(code) => Some(leaf_state(regs.pc, code)),
        None => frameless_stub(&first, frameless).then_some(LeafState::AtEntry),
    };
    if let Some(ra) = unsettled.and_then(|state| unsettled_return(regs, state, stack)) {
        let Some(ra) = ra else {
            return (n, StackEnd::FramePointer);
        };
        if n == frames.len() {
            return (n, StackEnd::DepthLimit);
        }
        frames[n] = classify(guard, ra, lookup_address(ra, true)).0;
        n += 1;
    }
    let mut fp = regs.fp;
    let mut previous = 0usize;
    while n < frames.len() {
        // Each frame pointer must lie on this thread's stack, be aligned, and
        // move strictly towards the stack's base; anything else ends the walk.
        if fp <= previous || !fp.is_multiple_of(8) {
            return (n, StackEnd::FramePointer);
        }
        // `checked_add`: a frame pointer at the top of the address space is
        // data, not a frame (found by the `handler_walk` fuzz target).
        let ra = fp
            .checked_add(8)
            .and_then(|slot| stack.read(slot))
            .map(arch::strip_code_address);
        let (Some(next), Some(ra)) = (stack.read(fp), ra) else {
            return (n, StackEnd::FramePointer);
        };
        if ra == 0 {
            return (n, StackEnd::FramePointer);
        }
        frames[n] = classify(guard, ra, lookup_address(ra, true)).0;
        n += 1;
        previous = fp;
        fp = next;
    }
    (n, StackEnd::DepthLimit)
}

/// `rule`, a caller's, for a stack pointer that the frame-pointer
/// convention only guessed (the record at the top of the callee's frame,
/// which GCC, Clang and .NET on aarch64 put at its bottom): a rule based on
/// the stack pointer that saves the frame pointer is rebased on the frame
/// pointer, which points at that saved word (AAPCS64's frame chain), so
/// that the CFA is the frame pointer less the save's offset. The guess is
/// the lowest the stack pointer can be (a record at the top); a rebased
/// CFA below what the rule gives from it comes from a frame pointer that
/// is no record's (code that uses x29 as any register), and the guess is
/// kept. Other rules keep the guess too.
fn by_frame_record(rule: Rule, regs: Regs) -> Rule {
    let (unwind::Base::Sp, unwind::Saved::At(saved), Some(fp)) = (rule.base, rule.fp, regs.fp)
    else {
        return rule;
    };
    let guessed = regs.sp.checked_add_signed(rule.offset as isize);
    let rebased = fp.checked_add_signed(-(saved as isize));
    match (guessed, rebased) {
        (Some(guessed), Some(rebased)) if rebased >= guessed => Rule {
            base: unwind::Base::Fp,
            offset: -saved,
            ..rule
        },
        _ => rule,
    }
}

/// The frame-pointer convention's rule for a JIT frame in `state`.
fn leaf_rule(state: LeafState) -> Rule {
    match state {
        LeafState::AtEntry => Rule::AT_ENTRY,
        LeafState::AfterPush { frame } => Rule::after_push(frame),
        LeafState::Settled => Rule::FRAME_POINTER,
    }
}

/// The return address of a leaf that has not set up its frame record or has
/// torn it down (`Some(None)` if it cannot be read); `None` if its record is
/// established and the frame-pointer chain names its caller.
fn unsettled_return(regs: Registers, state: LeafState, stack: &Stack) -> Option<Option<usize>> {
    let ra = match state {
        LeafState::AtEntry if arch::RETURN_ADDRESS_IN_LINK_REGISTER => Some(regs.lr),
        LeafState::AtEntry => stack.read(regs.sp),
        LeafState::AfterPush { .. } => regs.sp.checked_add(8).and_then(|slot| stack.read(slot)),
        LeafState::Settled => return None,
    };
    Some(ra.map(arch::strip_code_address))
}

/// Where a JIT leaf at `pc` stands in its prologue or epilogue.
fn leaf_state(pc: usize, code: JitCode<'_>) -> LeafState {
    // SAFETY: the pc lies inside a published block that the pinned guard
    // keeps mapped, and so do its bytes from its start.
    unsafe { arch::leaf_state(pc, code.block.start(), code.block.offset() as usize) }
}

/// A JIT frame's block, for the unwinder: its start and offset (the leaf's
/// prologue check) and its CFI, read only by the mixed walk.
#[derive(Clone, Copy)]
struct JitCode<'g> {
    block: CodeBlock<'g>,
}

/// Where a frame's address is looked up: a return address (`is_return`)
/// one byte back, in its call instruction.
#[inline]
fn lookup_address(addr: usize, is_return: bool) -> usize {
    if is_return {
        addr.saturating_sub(1)
    } else {
        addr
    }
}

/// Classifies `addr`, looked up at `at` ([`lookup_address`]). Also returns a
/// JIT method's block, for the unwinder.
#[inline]
fn classify<'g>(
    guard: &'g ManagerGuard<'_>,
    addr: usize,
    at: usize,
) -> (RawFrame, Option<JitCode<'g>>) {
    let mut frame = RawFrame {
        addr,
        ..RawFrame::default()
    };
    let mut code = None;
    // One walk of the range map: outside every section is native code
    // (the default kind), a section's gaps are unattributed.
    let Some(lookup) = guard.classify_sectioned(at, super::HANDLER_V1_WORDS) else {
        return (frame, code);
    };
    match lookup {
        Lookup::Method(block) => {
            frame.offset = block.offset() as u32;
            if block.is_jit() {
                // The start and the sample's time name the version; the
                // collector reads them against the code events.
                frame.kind = FrameKind::Jit;
                frame.key = block.start() as u64;
                code = Some(JitCode { block });
            } else {
                // Reads the image's method table, not code memory.
                frame.kind = FrameKind::Image;
                frame.key = block.method_id();
            }
        }
        Lookup::Stub { kind, start, .. } => {
            frame.kind = FrameKind::Stub;
            frame.key = u64::from(kind.get());
            frame.offset = (at - start) as u32;
        }
        // Thunks, a section's free space or headers, and a v1 start further
        // back than the handler's budget (JIT code, not named: a guess
        // would be the previous method).
        Lookup::Thunk | Lookup::TooFar | Lookup::Nothing => frame.kind = FrameKind::Unattributed,
    }
    (frame, code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExecutionManager;
    use crate::agent::pace::Pace;
    use crate::agent::record::{self, HandlerReader};
    use crate::agent::ring::Ring;

    /// The calling thread's record, unregistered and with no timer, its
    /// sample ring `capacity` samples long.
    fn record(capacity: usize) -> ThreadRecord {
        let manager = ExecutionManager::new(2);
        let reader = manager.register_reader().unwrap();
        let (stack_lo, stack_hi) = record::current_stack().unwrap();
        let cpu_clock = record::current_cpu_clock().unwrap();
        ThreadRecord {
            magic: RECORD_MAGIC,
            tid: crate::events::current_tid(),
            manager,
            reader: HandlerReader(reader),
            stack_lo,
            stack_hi,
            samples: Ring::new(capacity, 16),
            probes: Ring::new(1, 0),
            taken: Default::default(),
            lookups: Default::default(),
            dropped_periods: Default::default(),
            busy: Default::default(),
            modules: None,
            ends: Default::default(),
            cpu_clock,
            cpu_at_attach_ns: 0,
            attached_at_ns: 0,
            pace: Pace::new(1_000_000, true),
            doorbell: std::sync::Arc::new(crate::agent::doorbell::Doorbell::new().unwrap()),
            rules: Default::default(),
        }
    }

    /// Samples dropped, for a full ring or because another sample of the
    /// thread is in progress, count the periods they stood for, as the
    /// samples kept do: 3 and 4 for two timer signals, 1 for a synchronous
    /// sample. (On the old code they counted as dropped signals only: no
    /// period.)
    #[test]
    fn a_dropped_sample_counts_the_periods_it_stood_for() {
        let r = record(1);
        sample(&r, arch::current_registers(), 2, 0);
        // The ring is full.
        sample(&r, arch::current_registers(), 3, 0);
        // As if this thread were interrupted inside a sample of its own.
        // Relaxed: this thread alone touches the depth.
        r.busy.store(1, Ordering::Relaxed);
        sample(&r, arch::current_registers(), 4, 0);
        sample_synchronously(&r);
        // Relaxed: as above.
        r.busy.store(0, Ordering::Relaxed);
        assert_eq!(
            (
                r.taken(),
                r.samples.len(),
                r.samples.dropped(),
                r.dropped_periods()
            ),
            (4, 1, 3, 8)
        );
    }

    /// A native frame the thread's cache knows skips the range map only
    /// while the map is unchanged: once an image covers the address, the
    /// next walk finds the image's method there, not native code.
    #[test]
    fn a_cached_native_frame_yields_to_a_section_added_over_it() {
        use crate::image::{ImageFunction, ImageInfo, ImageMethod};
        let manager = ExecutionManager::new(2);
        let reader = manager.register_reader().unwrap();
        let table = ModuleTable::load(None);
        let cache = RuleCache::default();
        // A leaf in this test's own code, on a stack with no room to step:
        // one frame, classified and given its rule.
        let pc = a_cached_native_frame_yields_to_a_section_added_over_it as *const () as usize;
        let walk = || {
            let guard = manager.pin(&reader).unwrap();
            let mut frames = [RawFrame::default(); 1];
            let regs = Registers {
                pc,
                sp: 0x1000,
                fp: 0,
                lr: 0,
            };
            let stack = Stack {
                lo: 0x1000,
                hi: 0x1000,
            };
            // SAFETY: `cache` is this test's own, and this test its one
            // producer.
            unsafe {
                walk_mixed(
                    &guard,
                    Some(&table),
                    Some(&cache),
                    0,
                    &stack,
                    regs,
                    &mut frames,
                )
            };
            (frames[0].kind, frames[0].key)
        };
        // Looked up, then known from the cache: native both times.
        assert_eq!(walk(), (FrameKind::Native, 0));
        let guard = manager.pin(&reader).unwrap();
        // SAFETY: as above; no walk runs meanwhile.
        let cached = unsafe { cache.native(&table, pc, guard.sections_seq()) };
        assert_eq!(cached, Some(table.rule(pc)));
        drop(guard);
        assert_eq!(walk(), (FrameKind::Native, 0));
        let base = pc & !0xfff;
        manager
            .load_image(ImageInfo {
                base,
                size: 0x2000,
                functions: vec![ImageFunction {
                    begin: 0,
                    end: 0x2000,
                    unwind: Box::new([]),
                }],
                methods: vec![ImageMethod {
                    entry: 0,
                    method_id: 77,
                    gc: None,
                    debug: vec![],
                    name: "image::over_native".into(),
                }],
                ..ImageInfo::default()
            })
            .unwrap();
        assert_eq!(walk(), (FrameKind::Image, 77));
    }

    // Issue 67, item 3: a caller stepped after a frame that only the
    // frame-pointer convention placed takes its CFA from its own frame
    // record, where that record can be one.
    #[test]
    fn a_guessed_stack_pointer_gives_way_to_the_callers_frame_record() {
        use crate::unwind::{Base, Ra, Saved};
        // GCC's caller: `stp x29, x30, [sp, #-48]!; mov x29, sp`, its CFI
        // CFA = sp + 48, x29 at CFA - 48, x30 at CFA - 40.
        let gcc = Rule {
            base: Base::Sp,
            offset: 48,
            ra: Ra::At(-40),
            fp: Saved::At(-48),
        };
        // The guess put sp 16 above the callee's record; the caller's
        // record is 0x40 higher.
        let regs = |fp| Regs {
            pc: 0x1000,
            sp: 0x8010,
            fp,
            lr: None,
        };
        assert_eq!(
            by_frame_record(gcc, regs(Some(0x8040))),
            Rule {
                base: Base::Fp,
                offset: 48,
                ..gcc
            }
        );
        // A record right at the guess (the callee's record at its top):
        // the same CFA either way.
        assert_eq!(by_frame_record(gcc, regs(Some(0x8010))).base, Base::Fp);
        // x29 below the guess is no record of this caller's: the guess.
        assert_eq!(by_frame_record(gcc, regs(Some(5))), gcc);
        assert_eq!(by_frame_record(gcc, regs(None)), gcc);
        // A caller that saves no frame pointer, or places its CFA by it.
        let leafish = Rule {
            fp: Saved::Same,
            ..gcc
        };
        assert_eq!(by_frame_record(leafish, regs(Some(0x8040))), leafish);
        assert_eq!(
            by_frame_record(Rule::FRAME_POINTER, regs(Some(0x8040))),
            Rule::FRAME_POINTER
        );
    }
}
