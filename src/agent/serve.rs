//! The agent's pprof endpoint: what Go's `net/http/pprof` serves for CPU
//! profiles, so that `go tool pprof http://HOST:PORT/debug/pprof/profile`,
//! Parca and Grafana Pyroscope pull jitmap profiles with no code of their
//! own. Feature `serve` (it brings `tiny_http`).
//!
//! Served:
//! - `GET /debug/pprof/profile?seconds=N`: samples for N seconds (default 30,
//!   1 to 300) and answers with the gzipped pprof of exactly that window;
//! - `GET /debug/pprof/`: an index of what is served.
//!
//! Not served (404): Go's `heap`, `allocs`, `goroutine`, `block`, `mutex`,
//! `threadcreate`, `trace`, `cmdline` and `symbol`, which describe a Go
//! runtime; frames arrive named, so no client needs `symbol`.
//!
//! A bad or out-of-range `seconds` gets 400 with a one-line reason, another
//! method than GET 405; a profile asked for while one is being taken gets
//! 409; a client that goes away mid-profile only loses its answer.
//!
//! What it costs is bounded, whatever its clients do: two threads (one reads
//! every connection's request head, with `poll`, and answers all but
//! profiles; one takes the profile windows), at most [`MAX_WAITING`]
//! connections waiting for their head (a new one pushes out the oldest,
//! which is answered 503, so an idle flood cannot keep a real client out),
//! [`HEAD_TIMEOUT`] to send a head (408 after it) of at most [`MAX_HEAD`]
//! bytes (431 beyond), and [`ANSWER_DEADLINE`] to take a whole answer, however
//! it reads. With no file descriptor left in the process, a connection is
//! still accepted, through a descriptor kept in reserve, answered 503 and
//! closed, so that it neither waits in the backlog nor wakes the thread
//! again and again. It never touches the signal path; stopping the agent
//! ends an answer being written, stops it and closes its port.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{AgentError, Shared};

/// The longest window a request may ask for, in seconds.
pub const MAX_SECONDS: u64 = 300;
/// The window when a request names none, in seconds (Go's default).
pub const DEFAULT_SECONDS: u64 = 30;
/// How long a connection may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections waiting for their request head at once.
pub const MAX_WAITING: usize = 64;
/// The largest request head read.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long writing one whole answer may take. A client that reads a little
/// at a time still loses the rest of its answer here.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);
/// How long the reading thread rests after an error it cannot clear at once
/// (no descriptor to accept with, a failed `poll`), so that it never spins.
const BACKOFF: Duration = Duration::from_millis(100);
/// How often a blocked write looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// The running endpoint; [`super::Agent::stop`] (or dropping the agent)
/// stops it.
pub(super) struct Server {
    address: SocketAddr,
    stopping: Arc<AtomicBool>,
    /// Written to wake the reading thread's `poll` when stopping.
    wake: UnixStream,
    /// Connections answered 503 and closed without being served.
    shed: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds `address` and starts its two threads.
    pub(super) fn start(
        shared: Arc<Shared>,
        address: impl ToSocketAddrs,
        period_ns: u64,
    ) -> Result<Self, AgentError> {
        let serve = |reason: String| AgentError::Serve { reason };
        let listener = TcpListener::bind(address).map_err(|e| serve(e.to_string()))?;
        let address = listener.local_addr().map_err(|e| serve(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| serve(e.to_string()))?;
        let (wake, woken) = UnixStream::pair().map_err(|e| serve(e.to_string()))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let shed = Arc::new(AtomicU64::new(0));
        // The descriptor given up to accept a connection to shed when the
        // process has none left.
        let spare = File::open("/dev/null").map_err(|e| serve(format!("/dev/null: {e}")))?;
        // One profile at a time: `profiling` is set when one is handed over
        // and cleared when its window closes, so the channel holds at most one.
        let (jobs, work) = std::sync::mpsc::sync_channel::<Job>(1);
        let profiling = Arc::new(AtomicBool::new(false));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| serve(format!("spawning {name}: {e}")))
        };
        let worker = {
            let (shared, stopping) = (Arc::clone(&shared), Arc::clone(&stopping));
            let profiling = Arc::clone(&profiling);
            spawn(
                "jitmap-pprof-profile",
                Box::new(move || profiles(&work, &shared, &stopping, &profiling, period_ns)),
            )?
        };
        let reader = {
            let stopping = Arc::clone(&stopping);
            let connections = Connections {
                listener,
                woken,
                waiting: VecDeque::new(),
                jobs,
                profiling,
                shared,
                stopping,
                spare: Some(spare),
                accepts_paused_until: None,
                shed: Arc::clone(&shed),
            };
            spawn("jitmap-pprof", Box::new(move || connections.run()))
        };
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                // The worker's channel closed with the unspawned closure.
                let _ = worker.join();
                return Err(e);
            }
        };
        Ok(Self {
            address,
            stopping,
            wake,
            shed,
            threads: vec![reader, worker],
        })
    }

    /// The address it listens on.
    pub(super) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections answered 503 and closed unserved: pushed out of a full
    /// waiting list, or accepted through the spare descriptor.
    pub(super) fn shed(&self) -> u64 {
        // Relaxed: a count read on its own; nothing is published with it.
        self.shed.load(Ordering::Relaxed)
    }

    /// Stops reading, ends a window in progress early, closes the port and
    /// waits for both threads.
    pub(super) fn stop(&mut self) {
        // Release: the threads that see the flag end their work.
        self.stopping.store(true, Ordering::Release);
        // Wakes `poll`; if the buffer is full a wake is pending already.
        let _ = self.wake.write(&[1]);
        for thread in self.threads.drain(..) {
            // Neither loop panics short of a bug; nothing to report.
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A profile to take and answer on `stream`.
struct Job {
    stream: TcpStream,
    seconds: u64,
}

/// A connection waiting for its request head.
struct Waiting {
    stream: TcpStream,
    head: Vec<u8>,
    deadline: Instant,
}

/// The reading thread's state: the listener, and every connection whose
/// head has not arrived.
struct Connections {
    listener: TcpListener,
    woken: UnixStream,
    waiting: VecDeque<Waiting>,
    jobs: SyncSender<Job>,
    /// A profile was handed over and its window has not closed.
    profiling: Arc<AtomicBool>,
    shared: Arc<Shared>,
    stopping: Arc<AtomicBool>,
    /// A descriptor held in reserve (`/dev/null`): closed to make room to
    /// accept one connection when the process has none left.
    spare: Option<File>,
    /// Set when no connection could be accepted or shed: the listener is
    /// left out of `poll` until then, since its backlog would wake it at once.
    accepts_paused_until: Option<Instant>,
    shed: Arc<AtomicU64>,
}

impl Connections {
    /// Waits on the listener and the waiting connections until stopped.
    fn run(mut self) {
        loop {
            let now = Instant::now();
            if self.accepts_paused_until.is_some_and(|t| t <= now) {
                self.accepts_paused_until = None;
            }
            let timeout = self
                .waiting
                .iter()
                .map(|w| w.deadline)
                .chain(self.accepts_paused_until)
                .map(|t| t.saturating_duration_since(now))
                .min()
                .map_or(-1, |d| d.as_millis().min(60_000) as i32 + 1);
            // A negative descriptor is skipped by `poll`.
            let listener = match self.accepts_paused_until {
                Some(_) => -1,
                None => self.listener.as_raw_fd(),
            };
            let mut fds: Vec<libc::pollfd> = [self.woken.as_raw_fd(), listener]
                .into_iter()
                .chain(self.waiting.iter().map(|w| w.stream.as_raw_fd()))
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            // Acquire: pairs with `Server::stop`.
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            if ready < 0 {
                if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                    // EINVAL (more descriptors than RLIMIT_NOFILE, lowered
                    // since) or ENOMEM: fewer descriptors may help, and
                    // trying again at once would spin.
                    if let Some(oldest) = self.waiting.pop_front() {
                        self.turn_away(oldest.stream, b"the server is short of resources\n");
                    }
                    std::thread::sleep(BACKOFF);
                }
                continue;
            }
            // Heads first (their indices are the current ones), then new
            // connections, then deadlines.
            let readable: Vec<bool> = fds[2..].iter().map(|p| p.revents != 0).collect();
            let mut i = 0;
            for ready in readable {
                if ready && let Some(done) = self.read_head(i) {
                    self.answer(done);
                    continue; // `i` now names the next connection
                }
                i += 1;
            }
            if fds[1].revents != 0 {
                self.accept();
            }
            let now = Instant::now();
            while let Some(pos) = self.waiting.iter().position(|w| w.deadline <= now) {
                if let Some(w) = self.waiting.remove(pos) {
                    let reason = format!("no request head within {} s\n", HEAD_TIMEOUT.as_secs());
                    respond(w.stream, 408, TEXT, reason.as_bytes(), &self.stopping);
                }
            }
        }
    }

    /// Accepts every pending connection; beyond [`MAX_WAITING`], the one
    /// that has waited longest is answered 503 and closed.
    fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // Reset before it was accepted: the next one may be fine.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::EINTR)) => {
                    continue;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    return self.shed_without_descriptor();
                }
                // ENOBUFS, ENOMEM and the like: rest, rather than wake on
                // the same backlog at once.
                Err(_) => {
                    self.accepts_paused_until = Some(Instant::now() + BACKOFF);
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if self.waiting.len() == MAX_WAITING
                && let Some(oldest) = self.waiting.pop_front()
            {
                self.turn_away(oldest.stream, b"too many connections waiting\n");
            }
            self.waiting.push_back(Waiting {
                stream,
                head: Vec::new(),
                deadline: Instant::now() + HEAD_TIMEOUT,
            });
        }
    }

    /// The process has no descriptor left: gives up the spare one to accept
    /// the connection at the head of the backlog, answers it 503 and closes
    /// it, then takes the spare back. Without a spare, or if another thread
    /// took the freed descriptor first, accepts pause for [`BACKOFF`].
    fn shed_without_descriptor(&mut self) {
        let accepted = self.spare.take().and_then(|spare| {
            drop(spare);
            self.listener.accept().ok()
        });
        let shed = accepted.is_some();
        if let Some((stream, _)) = accepted {
            self.turn_away(stream, b"the server has no file descriptor left\n");
        }
        self.spare = File::open("/dev/null").ok();
        if !shed || self.spare.is_none() {
            self.accepts_paused_until = Some(Instant::now() + BACKOFF);
        }
    }

    /// Answers a connection 503 and closes it, counted.
    fn turn_away(&self, stream: TcpStream, reason: &[u8]) {
        // Counted first: a client that has its answer finds it counted.
        // Relaxed: a count read on its own.
        self.shed.fetch_add(1, Ordering::Relaxed);
        respond(stream, 503, TEXT, reason, &self.stopping);
    }

    /// Reads what connection `i` sent. Returns it, taken out of the waiting
    /// list, once its head is complete (or it cannot be: closed, too long).
    fn read_head(&mut self, i: usize) -> Option<(TcpStream, Result<Request, Status>)> {
        let w = &mut self.waiting[i];
        let mut buf = [0u8; 2048];
        let outcome = loop {
            match w.stream.read(&mut buf) {
                Ok(0) => break Some(Err(Status::Closed)),
                Ok(n) => {
                    w.head.extend_from_slice(&buf[..n]);
                    if let Some(end) = w.head.windows(4).position(|x| x == b"\r\n\r\n") {
                        break Some(parse_head(&w.head[..end]));
                    }
                    if w.head.len() > MAX_HEAD {
                        break Some(Err(Status::HeadTooLarge));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Some(Err(Status::Closed)),
            }
        }?;
        let w = self.waiting.remove(i)?;
        Some((w.stream, outcome))
    }

    /// Answers a complete head: at once, or by handing a profile to the
    /// worker.
    fn answer(&self, (stream, request): (TcpStream, Result<Request, Status>)) {
        let (code, body): (u16, String) = match request {
            Err(Status::Closed) => return,
            Err(status) => (status.code(), status.reason()),
            Ok(request) => match route(&request.target) {
                Route::Index => {
                    return respond(stream, 200, HTML, INDEX.as_bytes(), &self.stopping);
                }
                Route::BadRequest(reason) => (400, format!("{reason}\n")),
                Route::NotFound => (404, "not served: see /debug/pprof/\n".into()),
                Route::Profile(seconds) => {
                    // Acquire: pairs with the window's own release of the
                    // flag, and with the worker's release of `profiling`.
                    if self.shared.window_busy.load(Ordering::Acquire)
                        || self.profiling.swap(true, Ordering::AcqRel)
                    {
                        (409, BUSY.into())
                    } else {
                        match self.jobs.try_send(Job { stream, seconds }) {
                            Ok(()) => return,
                            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                                // Release: as in `profiles`.
                                self.profiling.store(false, Ordering::Release);
                                return respond(
                                    job.stream,
                                    409,
                                    TEXT,
                                    BUSY.as_bytes(),
                                    &self.stopping,
                                );
                            }
                        }
                    }
                }
            },
        };
        respond(stream, code, TEXT, body.as_bytes(), &self.stopping);
    }
}

const TEXT: &str = "text/plain; charset=utf-8";
const HTML: &str = "text/html";
const PPROF: &str = "application/octet-stream";
const BUSY: &str = "a profile is being taken already\n";

/// The worker: takes each profile handed over and answers it.
fn profiles(
    work: &Receiver<Job>,
    shared: &Shared,
    stopping: &AtomicBool,
    profiling: &AtomicBool,
    period_ns: u64,
) {
    while let Ok(Job { stream, seconds }) = work.recv() {
        // Acquire: pairs with `Server::stop`'s Release.
        let cancel = || stopping.load(Ordering::Acquire);
        let window = shared.window(Duration::from_secs(seconds), &cancel);
        // Release: the window is closed before the answer is written, so a
        // client that asks for the next one after reading this answer is
        // never refused as busy.
        profiling.store(false, Ordering::Release);
        match window {
            Ok(profile) => {
                let mut body = Vec::new();
                match profile.write_pprof(period_ns, &mut body) {
                    Ok(()) => respond(stream, 200, PPROF, &body, stopping),
                    Err(e) => respond(
                        stream,
                        500,
                        TEXT,
                        format!("encoding the profile: {e}\n").as_bytes(),
                        stopping,
                    ),
                }
            }
            Err(AgentError::WindowBusy) => respond(stream, 409, TEXT, BUSY.as_bytes(), stopping),
            Err(e) => respond(stream, 503, TEXT, format!("{e}\n").as_bytes(), stopping),
        }
    }
}

/// Writes one whole answer and closes the connection. A client that went
/// away, or that has not taken it all within [`ANSWER_DEADLINE`], only loses
/// it; so does every client once the server is stopping.
fn respond(stream: TcpStream, code: u16, content_type: &str, body: &[u8], stop: &AtomicBool) {
    let deadline = Instant::now() + ANSWER_DEADLINE;
    respond_by(stream, code, content_type, body, deadline, stop);
}

/// [`respond`], by `deadline`; whether the whole answer was written.
fn respond_by(
    mut stream: TcpStream,
    code: u16,
    content_type: &str,
    body: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> bool {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason_phrase(code),
        body.len()
    );
    if code == 200 && content_type == PPROF {
        head.push_str("Content-Disposition: attachment; filename=\"profile\"\r\n");
    }
    head.push_str("\r\n");
    let sent = stream.set_nonblocking(true).is_ok()
        && write_by(&mut stream, head.as_bytes(), deadline, stop)
        && write_by(&mut stream, body, deadline, stop);
    if sent {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    // Bytes the client sent that were never read would make the close a
    // reset, which can reach the client before the answer: read them off.
    let mut rest = [0u8; 2048];
    while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
    sent
}

/// Writes all of `bytes` to a non-blocking `stream`, waiting in `poll` while
/// its buffer is full, until `deadline` or `stop`; whether all went out.
fn write_by(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> bool {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Acquire: pairs with `Server::stop`'s Release.
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || stop.load(Ordering::Acquire) {
                    return false;
                }
                let mut fd = libc::pollfd {
                    fd: stream.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let wait = left.min(STOP_CHECK).as_millis() as i32 + 1;
                // SAFETY: one valid pollfd. Its result is not needed: the
                // next write says whether there is room.
                unsafe { libc::poll(&mut fd, 1, wait) };
            }
            Err(_) => return false,
        }
    }
    true
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    }
}

/// The status the endpoint answers a request head with (its bytes up to,
/// not including, the blank line that ends it) before any profile is taken:
/// 200 for the index or a profile it would take, 400 for a request line that
/// does not parse or a bad `seconds`, 404 for what it does not serve, 405
/// for a method other than GET. (A profile asked for while one is being
/// taken is 409; a head that never ends, 408 or 431.) The fuzz target
/// `pprof_request` holds every input to these four.
///
/// ```
/// use jitmap::agent::serve::status_of;
/// assert_eq!(status_of(b"GET /debug/pprof/profile?seconds=3 HTTP/1.1"), 200);
/// assert_eq!(status_of(b"GET /debug/pprof/profile?seconds=0 HTTP/1.1"), 400);
/// assert_eq!(status_of(b"GET /debug/pprof/heap HTTP/1.1"), 404);
/// assert_eq!(status_of(b"DELETE / HTTP/1.1"), 405);
/// ```
pub fn status_of(head: &[u8]) -> u16 {
    match parse_head(head) {
        Err(status) => status.code(),
        Ok(request) => match route(&request.target) {
            Route::Index | Route::Profile(_) => 200,
            Route::BadRequest(_) => 400,
            Route::NotFound => 404,
        },
    }
}

/// A request line that parsed.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    target: String,
}

/// Why a head gets no route.
#[derive(Debug, PartialEq, Eq)]
enum Status {
    /// Not `METHOD TARGET HTTP/1.x`.
    Malformed,
    /// A method other than GET.
    NotGet(String),
    /// Over [`MAX_HEAD`] bytes without its end.
    HeadTooLarge,
    /// The client closed (or reset) before its head was complete.
    Closed,
}

impl Status {
    fn code(&self) -> u16 {
        match self {
            Self::Malformed | Self::Closed => 400,
            Self::NotGet(_) => 405,
            Self::HeadTooLarge => 431,
        }
    }

    fn reason(&self) -> String {
        match self {
            Self::Malformed | Self::Closed => "not an HTTP/1 request line\n".into(),
            Self::NotGet(method) => format!("only GET is served, not {method}\n"),
            Self::HeadTooLarge => format!("the request head is over {MAX_HEAD} bytes\n"),
        }
    }
}

/// Parses a request head (without its final blank line): its request line
/// must be `GET /target HTTP/1.x`; header lines are not needed.
fn parse_head(head: &[u8]) -> Result<Request, Status> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|_| Status::Malformed)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Status::Malformed);
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') || method.is_empty() {
        return Err(Status::Malformed);
    }
    if method != "GET" {
        return Err(Status::NotGet(method.chars().take(16).collect()));
    }
    Ok(Request {
        target: target.to_owned(),
    })
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Index,
    Profile(u64),
    BadRequest(String),
    NotFound,
}

/// Routes a request line's URL.
fn route(url: &str) -> Route {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    match path {
        "/debug/pprof" | "/debug/pprof/" => Route::Index,
        "/debug/pprof/profile" => {
            let seconds = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == "seconds")
                .map(|(_, v)| v);
            match seconds {
                None => Route::Profile(DEFAULT_SECONDS),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (1..=MAX_SECONDS).contains(&n) => Route::Profile(n),
                    _ => Route::BadRequest(format!(
                        "seconds must be a whole number from 1 to {MAX_SECONDS}, not {v:?}"
                    )),
                },
            }
        }
        _ => Route::NotFound,
    }
}

/// The index page.
const INDEX: &str = "<html><head><title>/debug/pprof/</title></head><body>\n\
<p>jitmap agent: CPU profiles of this process's threads, JIT frames named.</p>\n\
<ul><li><a href=\"profile?seconds=30\">profile</a>: a CPU profile of the next \
<code>seconds</code> (1 to 300, default 30), gzipped pprof</li></ul>\n\
</body></html>\n";

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::{Request, Route, Status, parse_head, respond_by, route};

    /// A connected pair: the server's end and the client's.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (server, client)
    }

    /// Bytes the client takes until the server closes, reading `chunk`
    /// bytes and then resting `rest` each time.
    fn drain(mut client: TcpStream, chunk: usize, rest: Duration) -> usize {
        let mut buf = vec![0u8; chunk];
        let mut total = 0;
        loop {
            match client.read(&mut buf) {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
            std::thread::sleep(rest);
        }
    }

    #[test]
    fn an_answer_read_to_its_end_is_whole() {
        let (server, client) = pair();
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            (&client).read_to_end(&mut out).unwrap();
            out
        });
        let deadline = Instant::now() + Duration::from_secs(600);
        let body = vec![7u8; 3 << 20];
        assert!(respond_by(
            server,
            200,
            "x",
            &body,
            deadline,
            &AtomicBool::new(false)
        ));
        let got = reader.join().unwrap();
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: x\r\nContent-Length: 3145728\r\n";
        assert_eq!(&got[..head.len()], head);
        assert_eq!(
            got.len() - got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4,
            3 << 20
        );
    }

    /// A client that takes a little before each send would time out: the
    /// answer still ends at its deadline, cut short. (On the old code each
    /// partial send restarted a 10 s timeout, so this answer of 256 MiB at
    /// 64 KiB per 50 ms would have taken over three minutes.)
    #[test]
    fn a_client_that_reads_a_little_at_a_time_loses_its_answer_at_the_deadline() {
        let (server, client) = pair();
        let reader = std::thread::spawn(move || drain(client, 64 << 10, Duration::from_millis(50)));
        let deadline = Instant::now() + Duration::from_secs(1);
        let body = vec![0u8; 256 << 20];
        assert!(!respond_by(
            server,
            200,
            "x",
            &body,
            deadline,
            &AtomicBool::new(false)
        ));
        let taken = reader.join().unwrap();
        assert!(taken > 0 && taken < body.len(), "{taken}");
    }

    /// Stopping ends an answer being written to a client that does not
    /// read, long before its deadline.
    #[test]
    fn stopping_ends_an_answer_in_progress() {
        let (server, client) = pair();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(3600);
                respond_by(server, 200, "x", &vec![0u8; 256 << 20], deadline, &stop)
            })
        };
        stop.store(true, Ordering::Release);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(writer.join().unwrap()).unwrap());
        let sent = finished
            .recv_timeout(Duration::from_secs(120))
            .expect("the answer went on after the stop");
        assert!(!sent);
        drop(client);
    }

    #[test]
    fn request_lines_parse_or_get_their_status() {
        let get = |target: &str| {
            Ok(Request {
                target: target.into(),
            })
        };
        assert_eq!(
            parse_head(b"GET /debug/pprof/ HTTP/1.1"),
            get("/debug/pprof/")
        );
        assert_eq!(
            parse_head(b"GET /x?seconds=3 HTTP/1.0\r\nHost: a\r\nAccept: */*"),
            get("/x?seconds=3")
        );
        assert_eq!(
            parse_head(b"POST /debug/pprof/ HTTP/1.1"),
            Err(Status::NotGet("POST".into()))
        );
        for bad in [
            &b""[..],
            b"GET",
            b"GET /",
            b"GET / HTTP/2",
            b"GET x HTTP/1.1",
            b"GET  / HTTP/1.1",
            b"GET / HTTP/1.1 extra",
            b"\xff / HTTP/1.1",
        ] {
            assert_eq!(parse_head(bad), Err(Status::Malformed), "{bad:?}");
        }
        assert_eq!(Status::Malformed.code(), 400);
        assert_eq!(Status::NotGet("PUT".into()).code(), 405);
        assert_eq!(Status::HeadTooLarge.code(), 431);
    }

    #[test]
    fn requests_are_routed_as_go_serves_them() {
        assert_eq!(route("/debug/pprof/"), Route::Index);
        assert_eq!(route("/debug/pprof"), Route::Index);
        assert_eq!(route("/debug/pprof/profile"), Route::Profile(30));
        assert_eq!(route("/debug/pprof/profile?seconds=3"), Route::Profile(3));
        assert_eq!(
            route("/debug/pprof/profile?x=1&seconds=300"),
            Route::Profile(300)
        );
        for bad in ["0", "301", "-1", "1.5", "abc", ""] {
            assert!(
                matches!(route(&format!("/debug/pprof/profile?seconds={bad}")), Route::BadRequest(r) if r.contains(&format!("{bad:?}"))),
                "{bad}"
            );
        }
        assert_eq!(route("/debug/pprof/heap"), Route::NotFound);
        assert_eq!(route("/"), Route::NotFound);
    }
}
