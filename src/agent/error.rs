//! What the agent's calls refuse.

use std::fmt;

use super::config::{MAX_DEPTH, MAX_HZ, MAX_RING_CAPACITY};
use super::{CounterError, MAX_ATTACHED};
use crate::EpochError;

/// What went wrong in the agent. The agent and its threads are unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentError {
    /// `hz` was 0.
    ZeroFrequency,
    /// `hz` was over [`MAX_HZ`].
    FrequencyTooHigh {
        /// The frequency asked for.
        hz: u32,
    },
    /// `max_depth` was 0.
    ZeroDepth,
    /// `max_depth` was over [`MAX_DEPTH`].
    DepthTooLarge {
        /// The depth asked for.
        depth: usize,
    },
    /// A ring capacity was 0.
    ZeroCapacity,
    /// A ring capacity was over [`MAX_RING_CAPACITY`].
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: usize,
    },
    /// The signal cannot carry samples (out of range, or one the kernel sends
    /// for faults, or one that cannot be caught).
    BadSignal {
        /// The signal asked for.
        signal: i32,
    },
    /// `collect_every` was zero.
    ZeroInterval,
    /// `profile_versions` was under 2 (one live version and one folded
    /// entry).
    ProfileVersionsTooFew {
        /// The value given.
        versions: usize,
    },
    /// An agent is already running in this process (the signal handler is
    /// process-wide).
    AlreadyRunning,
    /// The agent has stopped: no thread can attach.
    Stopped,
    /// [`MAX_ATTACHED`] threads are attached already, process-wide.
    TooManyThreads,
    /// A window is being profiled already (`Agent::profile_window`).
    WindowBusy,
    /// The pprof endpoint could not start (feature `serve`).
    Serve {
        /// Why.
        reason: String,
    },
    /// The pprof endpoint was asked to bind an address that is not
    /// loopback through `Agent::serve`; `Agent::serve_exposed` does that.
    NotLoopback {
        /// The address asked for.
        address: std::net::SocketAddr,
    },
    /// This thread is already attached.
    AlreadyAttached {
        /// Its kernel thread id.
        tid: u32,
    },
    /// A call-counter table was misused.
    Counters(CounterError),
    /// No reader slot for the thread.
    Epoch(EpochError),
    /// A system call failed.
    Os {
        /// Which call.
        call: &'static str,
        /// Its errno.
        errno: i32,
    },
}

impl AgentError {
    pub(super) fn os(call: &'static str) -> Self {
        Self::Os {
            call,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroFrequency => write!(f, "the sampling frequency must be at least 1 Hz"),
            Self::FrequencyTooHigh { hz } => {
                write!(
                    f,
                    "{hz} Hz is over the agent's limit of {MAX_HZ} Hz: a timer period under \
                     100 µs keeps a thread in its signal handler"
                )
            }
            Self::ZeroDepth => write!(f, "the stack depth must be at least 1"),
            Self::DepthTooLarge { depth } => {
                write!(f, "depth {depth} is over the agent's limit of {MAX_DEPTH}")
            }
            Self::ZeroCapacity => write!(f, "a ring must hold at least one record"),
            Self::CapacityTooLarge { capacity } => write!(
                f,
                "a ring of {capacity} records is over the limit of {MAX_RING_CAPACITY}"
            ),
            Self::BadSignal { signal } => write!(f, "signal {signal} cannot carry samples"),
            Self::ZeroInterval => write!(f, "the collection interval must not be zero"),
            Self::ProfileVersionsTooFew { versions } => write!(
                f,
                "a profile of {versions} method versions is under the minimum of 2"
            ),
            Self::AlreadyRunning => write!(f, "an agent is already running in this process"),
            Self::Stopped => write!(f, "the agent has stopped"),
            Self::WindowBusy => write!(f, "a profile window is being taken already"),
            Self::Serve { reason } => write!(f, "the pprof endpoint: {reason}"),
            Self::NotLoopback { address } => write!(
                f,
                "{address} is not a loopback address; exposing profiles to the network must be asked for explicitly"
            ),
            Self::TooManyThreads => {
                write!(f, "{MAX_ATTACHED} threads are attached already")
            }
            Self::AlreadyAttached { tid } => write!(f, "thread {tid} is already attached"),
            Self::Counters(e) => write!(f, "{e}"),
            Self::Epoch(e) => write!(f, "registering the thread's reader: {e}"),
            Self::Os { call, errno } => write!(
                f,
                "{call} failed: {}",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// Each wrapper shows its inner error's message, so its source is the inner
/// error's own source: a chain printed whole names each cause once.
impl std::error::Error for AgentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Counters(e) => e.source(),
            Self::Epoch(e) => e.source(),
            _ => None,
        }
    }
}

impl From<CounterError> for AgentError {
    fn from(e: CounterError) -> Self {
        Self::Counters(e)
    }
}

impl From<EpochError> for AgentError {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}
