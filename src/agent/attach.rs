//! Attaching a thread: its record, its timer and its entry in the
//! handler's table; and detaching it, when its [`AttachedThread`] drops.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::mask::{self, Blocked};
use super::pace::Pace;
use super::record::{self, HandlerReader, RECORD_MAGIC, ThreadRecord};
use super::ring::Ring;
use super::timer::Timer;
use super::{Agent, AgentError, Clock, ProbeContext, handler, registry};

/// An attached thread's record and its timer.
pub(super) struct Attachment {
    pub(super) record: ThreadRecord,
    /// Taken and deleted, under this lock, by whichever of detach and stop
    /// comes first: a detach that finds it gone knows it is deleted.
    pub(super) timer: Mutex<Option<Timer>>,
    /// Set by the thread's detach, after its last sample and probe record.
    pub(super) detached: AtomicBool,
    /// The record's entry in the handler's table; taken by detach.
    pub(super) registration: Mutex<Option<registry::Registration>>,
    /// The CPU time the thread used while attached, set when it detaches.
    pub(super) cpu: Mutex<Option<std::time::Duration>>,
    /// The wall time it was attached, set when it detaches.
    pub(super) wall: Mutex<Option<std::time::Duration>>,
}

impl Agent {
    /// Starts sampling the calling thread: allocates its record, registers its
    /// reader and arms its timer. Call it outside signal handlers; drop the
    /// handle on the same thread to detach.
    pub fn attach_current_thread(&self) -> Result<AttachedThread, AgentError> {
        let config = &self.shared.config;
        let tid = crate::events::current_tid();
        let attachment = {
            let mut threads = self.shared.threads.lock();
            if !threads.running {
                return Err(AgentError::Stopped);
            }
            if threads
                .list
                .iter()
                // Acquire: as in `Shared::collect`.
                .any(|a| a.record.tid == tid && !a.detached.load(Ordering::Acquire))
            {
                return Err(AgentError::AlreadyAttached { tid });
            }
            let attachment = self.new_attachment(tid)?;
            let registration =
                registry::register(&attachment.record).ok_or(AgentError::TooManyThreads)?;
            // The timer carries the record's token, never its address: the
            // handler checks a signal's value against the table before it
            // reads anything.
            let value = std::ptr::without_provenance::<libc::c_void>(registration.token() as usize);
            *attachment.registration.lock() = Some(registration);
            // Created here, armed below, after the agent's lock is released.
            match Timer::create(config.clock, config.signal, value, tid) {
                Ok(timer) => *attachment.timer.lock() = Some(timer),
                Err(e) => {
                    drop(threads);
                    attachment.unregister();
                    return Err(e);
                }
            }
            threads.list.push(Arc::clone(&attachment));
            attachment
        };
        // From here the thread is attached: its timer must not find it
        // inside the agent (see `mask`). Armed under the attachment's own
        // timer lock alone, which only `stop` and this thread's detach
        // contend for: a `stop` that took the timer first leaves nothing to
        // arm.
        let _blocked = Blocked::new(config.signal);
        let armed = match attachment.timer.lock().as_ref() {
            Some(timer) => attachment.record.pace.arm(timer),
            None => Err(AgentError::Stopped),
        };
        if let Err(e) = armed {
            self.shared
                .threads
                .lock()
                .list
                .retain(|a| !Arc::ptr_eq(a, &attachment));
            let timer = attachment.timer.lock().take();
            drop(timer);
            attachment.unregister();
            return Err(e);
        }
        Ok(AttachedThread {
            attachment,
            signal: config.signal,
            _not_send: PhantomData,
        })
    }

    /// The calling thread's record, not yet registered nor armed.
    fn new_attachment(&self, tid: u32) -> Result<Arc<Attachment>, AgentError> {
        let config = &self.shared.config;
        let (stack_lo, stack_hi) = record::current_stack().map_err(|e| AgentError::Os {
            call: "pthread_getattr_np",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let cpu_clock = record::current_cpu_clock().map_err(|e| AgentError::Os {
            call: "pthread_getcpuclockid",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let reader = self.shared.manager.register_reader()?;
        Ok(Arc::new(Attachment {
            record: ThreadRecord {
                magic: RECORD_MAGIC,
                tid,
                manager: self.shared.manager.clone(),
                reader: HandlerReader(reader),
                stack_lo,
                stack_hi,
                cpu_clock,
                cpu_at_attach_ns: record::cpu_clock_ns(cpu_clock).unwrap_or(0),
                attached_at_ns: crate::events::monotonic_ns(),
                samples: Ring::with_bell(
                    config.ring_capacity,
                    config.max_depth,
                    super::doorbell::sample_bell(config.ring_capacity, config.hz),
                ),
                probes: Ring::new(config.probe_capacity, 0),
                taken: Default::default(),
                lookups: Default::default(),
                dropped_periods: Default::default(),
                busy: Default::default(),
                modules: self.shared.modules.clone(),
                ends: Default::default(),
                pace: Pace::new(config.interval_ns(), config.clock == Clock::Wall),
                doorbell: Arc::clone(&self.shared.doorbell),
                rules: Default::default(),
            },
            timer: Mutex::new(None),
            detached: AtomicBool::new(false),
            registration: Mutex::new(None),
            cpu: Mutex::new(None),
            wall: Mutex::new(None),
        }))
    }
}

impl Attachment {
    /// Takes the record out of the handler's table, if it is still in it
    /// (waiting for the handlers in flight on its slot).
    fn unregister(&self) {
        let registration = self.registration.lock().take();
        if let Some(registration) = registration {
            registry::unregister(registration);
        }
    }

    /// Waits until no handler is in flight on the record's slot (nothing
    /// to wait for once it is unregistered).
    pub(super) fn wait_for_handlers(&self) {
        if let Some(token) = self.token() {
            registry::wait_for(token);
        }
    }

    /// The token the thread's timer carries, while the record is registered.
    fn token(&self) -> Option<u64> {
        self.registration
            .lock()
            .as_ref()
            .map(registry::Registration::token)
    }
}

/// A thread's attachment to the agent; dropping it (on the same thread)
/// detaches the thread. Not `Send`.
pub struct AttachedThread {
    attachment: Arc<Attachment>,
    signal: i32,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for AttachedThread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachedThread")
            .field("tid", &self.attachment.record.tid)
            .finish_non_exhaustive()
    }
}

impl AttachedThread {
    /// The context this thread's JIT code passes to `jitmap_probe_enter` and
    /// `jitmap_probe_value`; valid until this handle drops.
    pub fn probe_context(&self) -> *const ProbeContext {
        (&self.attachment.record as *const ThreadRecord).cast()
    }

    /// The thread's kernel id.
    pub fn tid(&self) -> u32 {
        self.attachment.record.tid
    }

    /// Samples this thread's handler has taken so far, kept or dropped: a
    /// host (or a test) that wants a number of samples waits for them, not
    /// for a time, which a busy machine stretches.
    ///
    /// ```rust,standalone_crate
    /// # use jitmap::{ExecutionManager, agent::{Agent, AgentConfig, Clock}};
    /// # let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig { clock: Clock::Wall, ..AgentConfig::default() })?;
    /// let attached = agent.attach_current_thread()?;
    /// while attached.samples_taken() < 10 {
    ///     std::hint::black_box((0..1000u64).sum::<u64>());
    /// }
    /// drop(attached);
    /// assert!(agent.stop().taken >= 10);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    pub fn samples_taken(&self) -> u64 {
        self.attachment.record.taken()
    }

    /// Samples and probe records in this thread's rings that the collector
    /// has not taken yet: a backlog near the ring capacities means drops.
    pub fn backlog(&self) -> (usize, usize) {
        let record = &self.attachment.record;
        (record.samples.len(), record.probes.len())
    }

    /// Records a sample of this thread's stack now, through the same code as
    /// the signal handler (so it is as cheap, and as safe, in any context,
    /// a signal handler included): for a host that samples on its own
    /// events, such as allocations or lock waits. A `sample_now` that
    /// interrupts another sample of this thread (the agent's handler, or a
    /// `sample_now` in a handler of another signal) is counted as dropped,
    /// never written into the slot the interrupted one is filling. Frame 0 is inside this function; with the mixed unwinder every
    /// caller follows by its CFI, while the frame-pointer walk continues from
    /// the frame pointer it was called with, so a caller that keeps no frame
    /// pointer of its own is skipped there.
    ///
    /// ```rust,standalone_crate
    /// # use std::sync::Arc;
    /// # use jitmap::{ExecutionManager, agent::{Agent, AgentConfig}};
    /// # let manager = ExecutionManager::new(4);
    /// let agent = Agent::start(&manager, AgentConfig { hz: 1, ..AgentConfig::default() })?;
    /// let attached = agent.attach_current_thread()?;
    /// attached.sample_now();
    /// drop(attached);
    /// let profile = agent.stop();
    /// assert!(profile.samples >= 1);
    /// # Ok::<(), jitmap::agent::AgentError>(())
    /// ```
    pub fn sample_now(&self) {
        handler::sample_synchronously(&self.attachment.record);
    }
}

impl Drop for AttachedThread {
    fn drop(&mut self) {
        // Block the signal, delete the timer, then take any instance it already
        // queued for this thread: after that, nothing can deliver a signal that
        // points at this record. Instances that are not the timer's go back to
        // the thread. (Only this thread's handler re-arms its timer, and it
        // cannot run while the signal is blocked.)
        let blocked = Blocked::new(self.signal);
        let timer = self.attachment.timer.lock().take();
        drop(timer);
        let token = self.attachment.token();
        let host = drain(self.signal, token);
        // No signal of this thread's timer is left: take the record out of the
        // handler's table (which waits out any handler that found it).
        self.attachment.unregister();
        for info in &host {
            // Queued again to this thread with its own siginfo (a process may
            // queue any siginfo to itself), while the signal is still blocked:
            // it is delivered when the mask is restored, to the handler that
            // is installed then, which passes it to the host's.
            // SAFETY: `info` is a complete siginfo_t; the call reads it.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_tgsigqueueinfo,
                    libc::getpid(),
                    self.attachment.record.tid as libc::pid_t,
                    self.signal,
                    std::ptr::from_ref(info),
                )
            };
        }
        drop(blocked);
        // Read on the thread itself, before its clock can go away with it.
        let cpu = self.attachment.record.cpu_since_attach();
        *self.attachment.cpu.lock() = Some(cpu);
        let wall =
            crate::events::monotonic_ns().saturating_sub(self.attachment.record.attached_at_ns);
        *self.attachment.wall.lock() = Some(std::time::Duration::from_nanos(wall));
        // Release: the thread's last samples and probe records happen before a
        // collector that sees the flag drains its rings for the last time.
        self.attachment.detached.store(true, Ordering::Release);
    }
}

/// Takes the instances of `signal` (blocked by the caller) pending for this
/// thread or the process when it starts, and returns those that are not the
/// timer's with `token`: the host's own, to be queued again.
///
/// Bounded by what was pending when it began: a host timer on the same
/// signal that fires faster than one turn of the loop would otherwise keep
/// it turning, and its list growing, for as long as it ran. Every instance
/// that carries a siginfo (a timer's, a queued one) counts in the signals
/// queued for the user then (`SigQ` in `/proc/thread-self/status`); one more
/// stands for a plain instance the kernel keeps without one. Instances
/// pending at the start come out first (the kernel queues in order), so all
/// of them are taken within the bound.
fn drain(signal: libc::c_int, token: Option<u64>) -> Vec<libc::siginfo_t> {
    let set = mask::set_of(signal);
    let bound = queued_signals().saturating_add(1);
    let none = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    take_pending(bound, token, || {
        // SAFETY: siginfo_t is plain storage, filled by sigtimedwait.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid set, info and timeout.
        (unsafe { libc::sigtimedwait(&set, &mut info, &none) } == signal).then_some(info)
    })
}

/// Takes at most `bound` instances from `next` (until it has none), and
/// returns those that are not the timer's with `token`.
fn take_pending(
    bound: usize,
    token: Option<u64>,
    mut next: impl FnMut() -> Option<libc::siginfo_t>,
) -> Vec<libc::siginfo_t> {
    let mut host = Vec::new();
    for _ in 0..bound {
        let Some(info) = next() else {
            break;
        };
        // SAFETY: the union's value is what the sender put there (any
        // bit pattern is a valid pointer-sized integer).
        let value = unsafe { info.si_value().sival_ptr } as u64;
        if !(info.si_code == libc::SI_TIMER && Some(value) == token) {
            host.push(info);
        }
    }
    host
}

/// Signals queued for this process's user now, from `SigQ` in
/// `/proc/thread-self/status` (`queued/limit`); the limit when it cannot be
/// read, which still bounds the queue. Allocates nothing: it runs with the
/// signal blocked, where the tests' allocator looks for a handler's heap
/// calls.
fn queued_signals() -> usize {
    let mut buf = [0u8; 4096];
    let path = c"/proc/thread-self/status";
    // SAFETY: a valid NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    let mut len = 0;
    if fd >= 0 {
        while len < buf.len() {
            // SAFETY: writes at most the rest of `buf`.
            let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        // SAFETY: `fd` is open, and closed once.
        unsafe { libc::close(fd) };
    }
    let queued = buf[..len]
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"SigQ:"))
        .and_then(|q| {
            let digits = q.iter().skip_while(|b| b.is_ascii_whitespace());
            digits
                .take_while(|b| b.is_ascii_digit())
                .try_fold(None, |n: Option<usize>, &d| {
                    n.unwrap_or(0)
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(usize::from(d - b'0')))
                        .map(Some)
                })
                .flatten()
        });
    queued.unwrap_or_else(|| {
        // SAFETY: rlimit is plain storage, filled by getrlimit.
        let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: a valid resource and a writable rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_SIGPENDING, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            0
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A siginfo with `code` and `value`, as the kernel fills one.
    fn info(code: libc::c_int, value: u64) -> libc::siginfo_t {
        #[repr(C)]
        struct Head {
            signo: libc::c_int,
            errno: libc::c_int,
            code: libc::c_int,
            pad: libc::c_int,
            pid: u32,
            uid: u32,
            value: u64,
        }
        // SAFETY: siginfo_t is plain storage.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let head = Head {
            signo: libc::SIGPROF,
            errno: 0,
            code,
            pad: 0,
            pid: 0,
            uid: 0,
            value,
        };
        // SAFETY: `Head` is the layout of siginfo_t's first 32 bytes for a
        // timer or queued signal on Linux (signo, errno, code, then the
        // union: pid/tid and uid/overrun, then the sigval), and fits in it.
        unsafe { std::ptr::write(std::ptr::from_mut(&mut info).cast::<Head>(), head) };
        info
    }

    /// A host whose instances never run out (a timer faster than one turn
    /// of the loop): the drain takes what was pending when it began and
    /// stops. (On the old code it took instances until none was left:
    /// never, here.)
    #[test]
    fn a_drain_stops_at_its_bound_however_fast_the_host_sends() {
        let mut sent = 0;
        let token = 0x5a17_0403;
        let host = take_pending(5, Some(token), || {
            sent += 1;
            // Every third instance is the agent's own timer's.
            Some(if sent % 3 == 0 {
                info(libc::SI_TIMER, token)
            } else {
                info(libc::SI_QUEUE, 7)
            })
        });
        assert_eq!(sent, 5);
        assert_eq!(host.len(), 4);
        assert!(host.iter().all(|i| i.si_code == libc::SI_QUEUE));
        // Fewer pending than the bound: it stops when they run out.
        let mut left = 2;
        let host = take_pending(5, None, || {
            (left > 0).then(|| {
                left -= 1;
                info(libc::SI_QUEUE, 1)
            })
        });
        assert_eq!(host.len(), 2);
    }

    /// The bound for a real-time signal counts what this thread has queued.
    #[test]
    fn the_queued_count_includes_this_threads_pending_signals() {
        let signal = libc::SIGRTMIN() + 4;
        let blocked = Blocked::new(signal);
        let before = queued_signals();
        for _ in 0..3 {
            // SAFETY: a process may queue a signal to its own thread; the
            // signal is blocked here, so it stays pending.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_tgkill,
                    libc::getpid(),
                    crate::events::current_tid() as libc::pid_t,
                    signal,
                )
            };
            assert_eq!(r, 0);
        }
        // The user's other processes may take theirs meanwhile, never ours.
        assert!(queued_signals() >= 3, "{before} before");
        assert_eq!(drain(signal, None).len(), 3);
        drop(blocked);
    }
}
