//! Attaching a thread: its record, its timer and its entry in the
//! handler's table; and detaching it, when its [`AttachedThread`] drops.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::record::{self, HandlerReader, RECORD_MAGIC, ThreadRecord};
use super::ring::Ring;
use super::timer::Timer;
use super::{Agent, AgentError, ProbeContext, handler, registry};

/// An attached thread's record and its timer.
pub(super) struct Attachment {
    pub(super) record: ThreadRecord,
    /// Taken (and so deleted) by whichever of detach and stop comes first.
    pub(super) timer: Mutex<Option<Timer>>,
    /// Set by the thread's detach, after its last sample and probe record.
    pub(super) detached: AtomicBool,
    /// The record's entry in the handler's table; taken by detach.
    pub(super) registration: Mutex<Option<registry::Registration>>,
    /// The CPU time the thread used while attached, set when it detaches.
    pub(super) cpu: Mutex<Option<std::time::Duration>>,
}

impl Agent {
    /// Starts sampling the calling thread: allocates its record, registers its
    /// reader and arms its timer. Call it outside signal handlers; drop the
    /// handle on the same thread to detach.
    pub fn attach_current_thread(&self) -> Result<AttachedThread, AgentError> {
        let config = &self.shared.config;
        let tid = crate::events::current_tid();
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
        let (stack_lo, stack_hi) = record::current_stack().map_err(|e| AgentError::Os {
            call: "pthread_getattr_np",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let cpu_clock = record::current_cpu_clock().map_err(|e| AgentError::Os {
            call: "pthread_getcpuclockid",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let reader = self.shared.manager.register_reader()?;
        let attachment = Arc::new(Attachment {
            record: ThreadRecord {
                magic: RECORD_MAGIC,
                tid,
                manager: self.shared.manager.clone(),
                reader: HandlerReader(reader),
                stack_lo,
                stack_hi,
                cpu_clock,
                cpu_at_attach_ns: record::cpu_clock_ns(cpu_clock).unwrap_or(0),
                samples: Ring::new(config.ring_capacity, config.max_depth),
                probes: Ring::new(config.probe_capacity, 0),
                taken: Default::default(),
                lookups: Default::default(),
                busy: Default::default(),
                modules: self.shared.modules.clone(),
                ends: Default::default(),
            },
            timer: Mutex::new(None),
            detached: AtomicBool::new(false),
            registration: Mutex::new(None),
            cpu: Mutex::new(None),
        });
        let registration =
            registry::register(&attachment.record).ok_or(AgentError::TooManyThreads)?;
        // The timer carries the record's token, never its address: the handler
        // checks a signal's value against the table before it reads anything.
        let value = std::ptr::without_provenance::<libc::c_void>(registration.token() as usize);
        *attachment.registration.lock() = Some(registration);
        let armed = Timer::create(config.clock, config.signal, value, tid)
            .and_then(|timer| timer.set(config.interval_ns()).map(|()| timer));
        let timer = match armed {
            Ok(timer) => timer,
            Err(e) => {
                if let Some(registration) = attachment.registration.lock().take() {
                    registry::unregister(registration);
                }
                return Err(e);
            }
        };
        *attachment.timer.lock() = Some(timer);
        threads.list.push(Arc::clone(&attachment));
        Ok(AttachedThread {
            attachment,
            signal: config.signal,
            _not_send: PhantomData,
        })
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
        // the thread.
        // SAFETY: sigset_t is plain storage, initialized by sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` and `old` are valid sigsets; the signal was validated.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, self.signal);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        }
        drop(self.attachment.timer.lock().take());
        let token = self
            .attachment
            .registration
            .lock()
            .as_ref()
            .map(registry::Registration::token);
        let none = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // The host's own instances of the signal (its timers, `kill`) are
        // taken too: they go back to it below, not into the void.
        let mut host = Vec::new();
        loop {
            // SAFETY: siginfo_t is plain storage, filled by sigtimedwait.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid set, info and timeout.
            if unsafe { libc::sigtimedwait(&set, &mut info, &none) } != self.signal {
                break;
            }
            // SAFETY: the union's value is what the sender put there (any
            // bit pattern is a valid pointer-sized integer).
            let value = unsafe { info.si_value().sival_ptr } as u64;
            if !(info.si_code == libc::SI_TIMER && Some(value) == token) {
                host.push(info);
            }
        }
        // No signal of this thread's timer is left: take the record out of the
        // handler's table (which waits out any handler that found it).
        if let Some(registration) = self.attachment.registration.lock().take() {
            registry::unregister(registration);
        }
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
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
        // Read on the thread itself, before its clock can go away with it.
        let cpu = self.attachment.record.cpu_since_attach();
        *self.attachment.cpu.lock() = Some(cpu);
        // Release: the thread's last samples and probe records happen before a
        // collector that sees the flag drains its rings for the last time.
        self.attachment.detached.store(true, Ordering::Release);
    }
}
