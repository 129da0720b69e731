//! Probes that JIT code calls directly, through an absolute address.
//!
//! JIT code calls them like any C function (`extern "C"`, the System V ABI on
//! x86-64), usually from a tier-0 method's prologue. They follow the rules for
//! native code called from JIT code: no allocation, no lock, no call back into
//! the runtime or the heap's writer side, and a short, bounded path. The
//! one system call is a `write` to the collector's eventfd when the thread's
//! probe ring passes half full (once each time it fills from empty; errno
//! kept). Each uses only its arguments and memory allocated before the JIT code
//! ran: a [`super::CounterCell`] of a [`super::CallCounters`] table, or the calling thread's
//! [`ProbeContext`] (its attached record, see
//! [`super::AttachedThread::probe_context`]).
//!
//! What they are for: the call counter drives tiered compilation (tier-0 code
//! counts its calls; the compiler thread polls [`super::CallCounters::take_crossed`]
//! and recompiles what crossed); the entry probe traces which methods run and
//! when, for a call log or a coverage map; the value probe inspects values at
//! chosen points (argument types for speculation, loop trip counts, branch
//! outcomes). Each record lands in the calling thread's ring, and
//! [`super::Agent::stop`] returns their counts (and, with
//! [`super::AgentConfig::keep_samples`], every record).
//!
//! | probe | arguments | does |
//! |---|---|---|
//! | [`super::jitmap_probe_count`] | cell | counts a call; returns 1 exactly once, when the threshold is crossed, and marks the cell for the compiler |
//! | [`jitmap_probe_enter`] | context, method id | records (method id, time) in the thread's probe ring |
//! | [`jitmap_probe_value`] | context, method id, value | records a 64-bit value with its method id |

use super::record::{ProbeKind, ProbeRecord, RECORD_MAGIC, ThreadRecord};
use super::ring::Pushed;

/// A thread's probe context: JIT code receives it from its host (in a register
/// or a frame slot, as runtimes pass their thread object) and hands it to
/// [`jitmap_probe_enter`] and [`jitmap_probe_value`]. Opaque; valid while the
/// thread's [`super::AttachedThread`] lives.
#[repr(C)]
pub struct ProbeContext {
    _opaque: [u8; 0],
}

/// The CPU's cycle counter: one instruction, no system call.
#[inline]
pub(crate) fn ticks() -> u64 {
    crate::arch::ticks()
}

/// The record behind a context, if it is one.
///
/// # Safety
/// `context` is null or came from a live `AttachedThread` of the calling thread.
#[inline]
unsafe fn record<'a>(context: *const ProbeContext) -> Option<&'a ThreadRecord> {
    // SAFETY: the caller's contract: null or a live record.
    let record = unsafe { context.cast::<ThreadRecord>().as_ref()? };
    (record.magic == RECORD_MAGIC).then_some(record)
}

/// Records that `method_id` was entered, with the time, in the calling
/// thread's probe ring. A full ring drops the record and counts it; a null
/// context does nothing.
///
/// # Safety
/// `context` is null, or the calling thread's own
/// [`super::AttachedThread::probe_context`], still attached.
pub unsafe extern "C" fn jitmap_probe_enter(context: *const ProbeContext, method_id: u64) {
    // SAFETY: the caller's contract.
    if let Some(record) = unsafe { record(context) } {
        // SAFETY: only the owning thread calls probes with its context, and a
        // signal handler never writes the probe ring: one producer.
        let pushed = unsafe {
            record.probes.push(|r, _| {
                *r = ProbeRecord {
                    kind: ProbeKind::Enter,
                    method_id,
                    value: 0,
                    ticks: ticks(),
                }
            })
        };
        if pushed == Pushed::KeptAtBell {
            record.doorbell.ring();
        }
    }
}

/// Records `value` for `method_id` (an argument, a field, a branch outcome) in
/// the calling thread's probe ring, with the time.
///
/// # Safety
/// As [`jitmap_probe_enter`].
pub unsafe extern "C" fn jitmap_probe_value(
    context: *const ProbeContext,
    method_id: u64,
    value: u64,
) {
    // SAFETY: the caller's contract.
    if let Some(record) = unsafe { record(context) } {
        // SAFETY: as in `jitmap_probe_enter`.
        let pushed = unsafe {
            record.probes.push(|r, _| {
                *r = ProbeRecord {
                    kind: ProbeKind::Value,
                    method_id,
                    value,
                    ticks: ticks(),
                }
            })
        };
        if pushed == Pushed::KeptAtBell {
            record.doorbell.ring();
        }
    }
}
