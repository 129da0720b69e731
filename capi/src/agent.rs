//! The agent: start, attach threads, stop, write the profile; call counters
//! for tiered compilation; the probes JIT code calls.

use std::ffi::c_char;
use std::sync::Mutex;
use std::time::Duration;

use jitmap::agent::{Agent, AgentConfig, AttachedThread, CallCounters, Clock, Profile, Unwind};

use crate::handles::{self, Kept, Kind, Use};
use crate::status::{Failure, call, jitmap_status};
use crate::types::{jitmap_agent_config, jitmap_clock, jitmap_output, jitmap_unwind};
use crate::{
    ThreadBound, bits, jitmap_agent, jitmap_counter_cell, jitmap_counters, jitmap_manager,
    jitmap_probe_context, jitmap_profile, jitmap_thread, required, utf8,
};

struct AgentObject {
    agent: Agent,
    _manager: Kept,
}

struct CountersObject {
    counters: CallCounters,
    /// Crossed methods taken from the table that the caller's buffer had
    /// no room for: handed out first at the next take.
    carried: Mutex<Vec<u32>>,
}

struct ProfileObject {
    profile: Profile,
    period_ns: u64,
}

/// Writes the default agent configuration: 1,000 Hz of CPU time, 64 frames,
/// rings of 256 samples and 4,096 probe records, SIGPROF, collected at
/// least every 250 ms (sooner when a ring fills to its bell).
///
/// Async-signal-safe.
///
/// # Safety
/// `out` is NULL (nothing is written) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_agent_config_default(out: *mut jitmap_agent_config) {
    let d = AgentConfig::default();
    if !out.is_null() {
        // SAFETY: not NULL; writable by the caller's contract.
        unsafe {
            out.write(jitmap_agent_config {
                hz: d.hz,
                clock: jitmap_clock::JITMAP_CLOCK_CPU as u32,
                max_depth: d.max_depth as u32,
                ring_capacity: d.ring_capacity as u32,
                probe_capacity: d.probe_capacity as u32,
                signal: d.signal,
                collect_every_ms: d.collect_every.as_millis() as u32,
                unwind: match d.unwind {
                    Unwind::Mixed => jitmap_unwind::JITMAP_UNWIND_MIXED,
                    Unwind::FramePointer => jitmap_unwind::JITMAP_UNWIND_FRAME_POINTER,
                } as u32,
            })
        };
    }
}

/// Starts the agent over the manager's heaps: a SIGPROF handler (or the
/// configured signal's) that samples each attached thread's stack and names
/// every frame, and a collector thread. One agent per process.
///
/// Not async-signal-safe. Owner: the caller, who stops it with
/// `jitmap_agent_stop`, before destroying the manager.
///
/// # Safety
/// `config` is NULL or points to a `jitmap_agent_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_agent_start(
    manager: *mut jitmap_manager,
    config: *const jitmap_agent_config,
    out: *mut *mut jitmap_agent,
) -> jitmap_status {
    call(|| {
        let m = crate::manager::manager(manager)?;
        required(config)?;
        required(out)?;
        // SAFETY: checked not NULL; a config by the caller's contract.
        let c = unsafe { *config };
        let clock = match c.clock {
            x if x == jitmap_clock::JITMAP_CLOCK_CPU as u32 => Clock::Cpu,
            x if x == jitmap_clock::JITMAP_CLOCK_WALL as u32 => Clock::Wall,
            other => {
                return Err(Failure::new(
                    jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                    format!("{other} is not a jitmap_clock"),
                ));
            }
        };
        let unwind = match c.unwind {
            x if x == jitmap_unwind::JITMAP_UNWIND_MIXED as u32 => Unwind::Mixed,
            x if x == jitmap_unwind::JITMAP_UNWIND_FRAME_POINTER as u32 => Unwind::FramePointer,
            other => {
                return Err(Failure::new(
                    jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                    format!("{other} is not a jitmap_unwind"),
                ));
            }
        };
        let config = AgentConfig {
            hz: c.hz,
            clock,
            max_depth: c.max_depth as usize,
            ring_capacity: c.ring_capacity as usize,
            probe_capacity: c.probe_capacity as usize,
            signal: c.signal,
            collect_every: Duration::from_millis(u64::from(c.collect_every_ms)),
            keep_samples: false,
            unwind,
            // C hosts get the default cap of the whole-run profile.
            ..AgentConfig::default()
        };
        let agent = Agent::start(&m.get().manager, config)?;
        let object = AgentObject {
            agent,
            _manager: m.keep(),
        };
        // A full table stops the agent again as the object drops.
        let handle = handles::insert(Kind::Agent, Box::new(object))?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_agent) };
        Ok(())
    })
}

/// Attaches the calling thread: its own timer samples it from now on, and
/// its probe context records the probes its JIT code calls. Takes a reader
/// slot of the agent's manager.
///
/// Not async-signal-safe. Owner: the caller, who detaches it on the same
/// thread with `jitmap_thread_detach` before the thread exits.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_agent_attach(
    agent: *mut jitmap_agent,
    out: *mut *mut jitmap_thread,
) -> jitmap_status {
    call(|| {
        let a = handles::take::<AgentObject>(bits(agent), Kind::Agent)?;
        required(out)?;
        let attached = a.get().agent.attach_current_thread()?;
        let handle = handles::insert(Kind::Thread, Box::new(ThreadBound::new(attached)))?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_thread) };
        Ok(())
    })
}

/// Detaches the calling thread (its timer stops; what it recorded stays in
/// the profile).
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_thread_detach(thread: *mut jitmap_thread) -> jitmap_status {
    call(|| {
        handles::take::<ThreadBound<AttachedThread>>(bits(thread), Kind::Thread)?
            .get()
            .get()?;
        drop(handles::remove::<ThreadBound<AttachedThread>>(
            bits(thread),
            Kind::Thread,
        )?);
        Ok(())
    })
}

/// The attached thread's probe context, which its JIT code passes to
/// `jitmap_probe_enter` and `jitmap_probe_value`. Valid until the thread
/// detaches.
///
/// Async-signal-safe.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_thread_probe_context(
    thread: *mut jitmap_thread,
    out: *mut *const jitmap_probe_context,
) -> jitmap_status {
    if out.is_null() {
        return jitmap_status::JITMAP_STATUS_NULL_POINTER;
    }
    let t = match handles::take::<ThreadBound<AttachedThread>>(bits(thread), Kind::Thread) {
        Ok(t) => t,
        Err(status) => return status,
    };
    match t.get().get() {
        Ok(attached) => {
            // SAFETY: checked not NULL; writable by the caller's contract.
            unsafe { out.write(attached.probe_context().cast()) };
            jitmap_status::JITMAP_STATUS_OK
        }
        Err(status) => status,
    }
}

/// Stops the agent (every timer disarmed, the handler removed, the rings
/// drained and every frame named), destroys its handle and writes the
/// profile's handle to `profile`. The profile's handle is taken first: a
/// full table (`JITMAP_STATUS_TOO_MANY_HANDLES`) refuses before the agent
/// is touched, and it keeps running.
///
/// Not async-signal-safe. Owner of the profile: the caller, who destroys it
/// with `jitmap_profile_destroy`.
///
/// # Safety
/// `profile` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_agent_stop(
    agent: *mut jitmap_agent,
    profile: *mut *mut jitmap_profile,
) -> jitmap_status {
    call(|| {
        required(profile)?;
        // The profile's slot first, holding an empty profile: a full table
        // refuses here, with the agent still running and its handle valid.
        let empty = ProfileObject {
            profile: Profile::default(),
            period_ns: 0,
        };
        let handle = handles::insert(Kind::Profile, Box::new(empty))?;
        let object = match handles::remove::<AgentObject>(bits(agent), Kind::Agent) {
            Ok(object) => object,
            Err(status) => {
                // No one else knows the new handle: it goes as it came.
                let _ = handles::remove::<ProfileObject>(handle, Kind::Profile);
                return Err(status.into());
            }
        };
        let AgentObject { agent, _manager } = *object;
        let period_ns = agent.config().interval_ns();
        let stopped = ProfileObject {
            profile: agent.stop(),
            period_ns,
        };
        // The handle is this call's alone until written out: its exclusive
        // use cannot be refused.
        let mut slot = handles::take_exclusive::<ProfileObject>(handle, Kind::Profile)?;
        *slot.get_mut() = stopped;
        drop(slot);
        // SAFETY: checked not NULL.
        unsafe { profile.write(handle as *mut jitmap_profile) };
        Ok(())
    })
}

/// Writes the profile to `path` as a `jitmap_output`: the text report,
/// folded stacks, an SVG flame graph, or gzipped pprof.
///
/// Not async-signal-safe.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_profile_write(
    profile: *mut jitmap_profile,
    format: u32,
    path: *const c_char,
) -> jitmap_status {
    call(|| {
        let p = handles::take::<ProfileObject>(bits(profile), Kind::Profile)?;
        // SAFETY: the caller's contract.
        let path = unsafe { utf8(path, "path") }?;
        let format = [
            jitmap_output::JITMAP_OUTPUT_REPORT,
            jitmap_output::JITMAP_OUTPUT_FOLDED,
            jitmap_output::JITMAP_OUTPUT_FLAMEGRAPH,
            jitmap_output::JITMAP_OUTPUT_PPROF,
        ]
        .into_iter()
        .find(|f| *f as u32 == format)
        .ok_or_else(|| {
            Failure::new(
                jitmap_status::JITMAP_STATUS_BAD_ARGUMENT,
                format!("{format} is not a jitmap_output"),
            )
        })?;
        let (profile, period_ns) = (&p.get().profile, p.get().period_ns);
        let mut bytes = Vec::new();
        match format {
            jitmap_output::JITMAP_OUTPUT_REPORT => bytes.extend(profile.report(20).into_bytes()),
            jitmap_output::JITMAP_OUTPUT_FOLDED => bytes.extend(profile.folded().into_bytes()),
            jitmap_output::JITMAP_OUTPUT_FLAMEGRAPH => {
                profile.write_flamegraph("jitmap", &mut bytes)?
            }
            jitmap_output::JITMAP_OUTPUT_PPROF => profile.write_pprof(period_ns, &mut bytes)?,
        }
        std::fs::write(path, bytes).map_err(|e| {
            Failure::new(jitmap_status::JITMAP_STATUS_SYSTEM, format!("{path}: {e}"))
        })?;
        Ok(())
    })
}

/// The profile's totals: samples in it, and samples lost (a full ring, or
/// a handler that could not pin). Either output may be NULL.
///
/// Not async-signal-safe.
///
/// # Safety
/// Each of `samples`, `dropped`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_profile_samples(
    profile: *mut jitmap_profile,
    samples: *mut u64,
    dropped: *mut u64,
) -> jitmap_status {
    call(|| {
        let p = handles::take::<ProfileObject>(bits(profile), Kind::Profile)?;
        // SAFETY (both): checked not NULL; writable by the caller's contract.
        if !samples.is_null() {
            unsafe { samples.write(p.get().profile.samples) };
        }
        if !dropped.is_null() {
            unsafe { dropped.write(p.get().profile.dropped) };
        }
        Ok(())
    })
}

/// The timer expirations the profile's samples stand for: `periods` (each
/// sample counts 1 plus its signal's overrun, so the folded stacks' and the
/// pprof's counts add up to it) and `coalesced`, how many of them came from
/// signals the kernel coalesced (`periods - samples`). Either output may be
/// NULL.
///
/// Not async-signal-safe.
///
/// # Safety
/// Each of `periods`, `coalesced`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_profile_periods(
    profile: *mut jitmap_profile,
    periods: *mut u64,
    coalesced: *mut u64,
) -> jitmap_status {
    call(|| {
        let p = handles::take::<ProfileObject>(bits(profile), Kind::Profile)?;
        let profile = &p.get().profile;
        // SAFETY (both): checked not NULL; writable by the caller's contract.
        if !periods.is_null() {
            unsafe { periods.write(profile.counted()) };
        }
        if !coalesced.is_null() {
            unsafe { coalesced.write(profile.coalesced()) };
        }
        Ok(())
    })
}

/// What the profile lost or could not name: `dropped_periods`, the timer
/// expirations its dropped samples stood for (so that the periods of
/// `jitmap_profile_periods` plus these are all the time the timers
/// sampled), and `gave_up`, the samples that named a JIT version whose
/// event never came (those frames are `[unattributed]`). Either output may
/// be NULL.
///
/// Not async-signal-safe.
///
/// # Safety
/// Each of `dropped_periods`, `gave_up`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_profile_losses(
    profile: *mut jitmap_profile,
    dropped_periods: *mut u64,
    gave_up: *mut u64,
) -> jitmap_status {
    call(|| {
        let p = handles::take::<ProfileObject>(bits(profile), Kind::Profile)?;
        let profile = &p.get().profile;
        // SAFETY (both): checked not NULL; writable by the caller's contract.
        if !dropped_periods.is_null() {
            unsafe { dropped_periods.write(profile.dropped_periods) };
        }
        if !gave_up.is_null() {
            unsafe { gave_up.write(profile.gave_up) };
        }
        Ok(())
    })
}

/// What the agent cost: `handler_ns`, its handlers' time over the samples
/// kept (each from the handler's entry to the end of its walk, on the
/// monotonic clock), and `collector_ns`, the CPU time of the collection
/// passes on every thread (`stop`'s naming of the profile, a one-time cost,
/// is not in it). Their sum over the samples of
/// `jitmap_profile_samples` is the agent's own cost a sample; the kernel's
/// cost of delivering the signals is not in it. Either output may be NULL.
///
/// Not async-signal-safe.
///
/// # Safety
/// Each of `handler_ns`, `collector_ns`: NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_profile_agent_cpu(
    profile: *mut jitmap_profile,
    handler_ns: *mut u64,
    collector_ns: *mut u64,
) -> jitmap_status {
    call(|| {
        let p = handles::take::<ProfileObject>(bits(profile), Kind::Profile)?;
        let profile = &p.get().profile;
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY (both): checked not NULL; writable by the caller's contract.
        if !handler_ns.is_null() {
            unsafe { handler_ns.write(ns(profile.handler_time)) };
        }
        if !collector_ns.is_null() {
            unsafe { collector_ns.write(ns(profile.collector_cpu)) };
        }
        Ok(())
    })
}

/// Destroys a profile.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_profile_destroy(profile: *mut jitmap_profile) -> jitmap_status {
    call(|| {
        drop(handles::remove::<ProfileObject>(
            bits(profile),
            Kind::Profile,
        )?);
        Ok(())
    })
}

/// Creates a table of `methods` call counters, each crossing after
/// `threshold` calls: tier-0 code calls `jitmap_probe_count` with its
/// method's cell; the compiler takes the crossed ones.
///
/// Not async-signal-safe. Owner: the caller, who destroys it with
/// `jitmap_counters_destroy` once no code that counts in it can run.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_counters_create(
    methods: u32,
    threshold: u32,
    out: *mut *mut jitmap_counters,
) -> jitmap_status {
    call(|| {
        required(out)?;
        let counters = CountersObject {
            counters: CallCounters::new(methods, threshold)?,
            carried: Mutex::new(Vec::new()),
        };
        let handle = handles::insert(Kind::Counters, Box::new(counters))?;
        // SAFETY: checked not NULL.
        unsafe { out.write(handle as *mut jitmap_counters) };
        Ok(())
    })
}

fn counters(c: *mut jitmap_counters) -> Result<Use<CountersObject>, jitmap_status> {
    handles::take(bits(c), Kind::Counters)
}

/// The cell of method `index`, to pass to `jitmap_probe_count` from its
/// tier-0 code. Valid until the table is destroyed.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_counters_cell(
    counters: *mut jitmap_counters,
    index: u32,
    out: *mut *const jitmap_counter_cell,
) -> jitmap_status {
    call(|| {
        let c = self::counters(counters)?;
        required(out)?;
        let cell = c.get().counters.cell(index).ok_or_else(|| {
            Failure::new(
                jitmap_status::JITMAP_STATUS_BAD_COUNTER,
                format!("no counter {index}"),
            )
        })?;
        // SAFETY: checked not NULL.
        unsafe { out.write(cell.cast()) };
        Ok(())
    })
}

/// Takes the methods whose counters crossed since the last take, into
/// `out` (room for `capacity`), and writes how many to `count`. Those that
/// do not fit stay crossed for the next take.
///
/// Not async-signal-safe.
///
/// # Safety
/// `out` is NULL (with `capacity` 0) or has room for `capacity` items.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_counters_take_crossed(
    counters: *mut jitmap_counters,
    out: *mut u32,
    capacity: usize,
    count: *mut usize,
) -> jitmap_status {
    call(|| {
        let c = self::counters(counters)?;
        required(count)?;
        if capacity > 0 {
            required(out)?;
        }
        let mut carried = c.get().carried.lock().unwrap_or_else(|e| e.into_inner());
        carried.extend(c.get().counters.take_crossed());
        let taken = carried.len().min(capacity);
        if taken > 0 {
            // SAFETY: not NULL (checked, as capacity > 0); room for
            // `capacity` >= `taken` items by the caller's contract.
            unsafe { std::slice::from_raw_parts_mut(out, taken) }
                .copy_from_slice(&carried[..taken]);
        }
        carried.drain(..taken);
        // SAFETY: checked not NULL.
        unsafe { count.write(taken) };
        Ok(())
    })
}

/// Rearms a crossed counter (one taken by `jitmap_counters_take_crossed`)
/// to cross again after `threshold` more calls: a de-optimized method
/// counting anew.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_counters_rearm(
    counters: *mut jitmap_counters,
    index: u32,
    threshold: u32,
) -> jitmap_status {
    call(|| {
        self::counters(counters)?
            .get()
            .counters
            .rearm(index, threshold)?;
        Ok(())
    })
}

/// Destroys a counter table.
///
/// Not async-signal-safe.
#[unsafe(no_mangle)]
pub extern "C" fn jitmap_counters_destroy(counters: *mut jitmap_counters) -> jitmap_status {
    call(|| {
        drop(handles::remove::<CountersObject>(
            bits(counters),
            Kind::Counters,
        )?);
        Ok(())
    })
}

/// The call-counting probe, for tier-0 code: counts one call of the
/// method whose `cell` it is, and returns how many calls remain before it
/// crosses (0 once it has: the compiler takes it at its next take).
///
/// Async-signal-safe; lock-free.
///
/// # Safety
/// `cell` comes from `jitmap_counters_cell` of a live table.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_count(cell: *const jitmap_counter_cell) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { jitmap::agent::jitmap_probe_count(cell.cast()) }
}

/// The entry probe: records that `method_id` was entered, on the attached
/// thread whose `context` it is (NULL or another value records nothing).
///
/// Async-signal-safe; lock-free.
///
/// # Safety
/// `context` is NULL or comes from `jitmap_thread_probe_context` of the
/// calling thread, still attached.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_enter(context: *const jitmap_probe_context, method_id: u64) {
    // SAFETY: the caller's contract.
    unsafe { jitmap::agent::jitmap_probe_enter(context.cast(), method_id) }
}

/// The value probe: records `value` for `method_id` on the attached thread
/// whose `context` it is.
///
/// Async-signal-safe; lock-free.
///
/// # Safety
/// As `jitmap_probe_enter`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn jitmap_probe_value(
    context: *const jitmap_probe_context,
    method_id: u64,
    value: u64,
) {
    // SAFETY: the caller's contract.
    unsafe { jitmap::agent::jitmap_probe_value(context.cast(), method_id, value) }
}
