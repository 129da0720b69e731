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
//! A bad or out-of-range `seconds` gets 400 with a one-line reason; a
//! profile asked for while one is being taken gets 409; a client that goes
//! away mid-profile only loses its answer. The server runs on threads of its
//! own and never touches the signal path; stopping the agent stops it.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{AgentError, Shared};

/// The longest window a request may ask for, in seconds.
pub const MAX_SECONDS: u64 = 300;
/// The window when a request names none, in seconds (Go's default).
pub const DEFAULT_SECONDS: u64 = 30;

/// The running endpoint; [`super::Agent::stop`] (or dropping the agent)
/// stops it.
pub(super) struct Server {
    server: Arc<tiny_http::Server>,
    accept: Option<JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    address: SocketAddr,
}

impl Server {
    /// Binds `address` and starts answering on a thread of its own.
    pub(super) fn start(
        shared: Arc<Shared>,
        address: impl ToSocketAddrs,
        period_ns: u64,
    ) -> Result<Self, AgentError> {
        let server = tiny_http::Server::http(address).map_err(|e| AgentError::Serve {
            reason: e.to_string(),
        })?;
        let address = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| AgentError::Serve {
                reason: "not an IP address".into(),
            })?;
        let server = Arc::new(server);
        let stopping = Arc::new(AtomicBool::new(false));
        let accept = {
            let (server, stopping) = (Arc::clone(&server), Arc::clone(&stopping));
            std::thread::Builder::new()
                .name("jitmap-pprof".into())
                .spawn(move || accept(&server, &shared, &stopping, period_ns))
                .map_err(|e| AgentError::Serve {
                    reason: format!("spawning the server thread: {e}"),
                })?
        };
        Ok(Self {
            server,
            accept: Some(accept),
            stopping,
            address,
        })
    }

    /// The address it listens on.
    pub(super) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops accepting, ends a window in progress early and waits for the
    /// server's threads.
    pub(super) fn stop(&mut self) {
        // Release: a profile thread that sees the flag ends its window.
        self.stopping.store(true, Ordering::Release);
        self.server.unblock();
        if let Some(accept) = self.accept.take() {
            // The accept loop cannot panic short of a bug; nothing to report.
            let _ = accept.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
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

fn text(status: u16, body: &str) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    tiny_http::Response::from_string(body).with_status_code(status)
}

/// Answers requests until the server is unblocked. Profiles are taken on a
/// thread each, so that the loop keeps answering (409 to a second one).
fn accept(
    server: &tiny_http::Server,
    shared: &Arc<Shared>,
    stopping: &Arc<AtomicBool>,
    period_ns: u64,
) {
    let mut profiles: Vec<JoinHandle<()>> = Vec::new();
    for request in server.incoming_requests() {
        profiles.retain(|p| !p.is_finished());
        if *request.method() != tiny_http::Method::Get {
            let _ = request.respond(text(405, "only GET is served\n"));
            continue;
        }
        match route(request.url()) {
            Route::Index => {
                let html = tiny_http::Header::from_bytes("Content-Type", "text/html").ok();
                let mut response = text(200, INDEX);
                if let Some(h) = html {
                    response = response.with_header(h);
                }
                // A client that went away only loses its answer.
                let _ = request.respond(response);
            }
            Route::BadRequest(reason) => {
                let _ = request.respond(text(400, &format!("{reason}\n")));
            }
            Route::NotFound => {
                let _ = request.respond(text(404, "not served: see /debug/pprof/\n"));
            }
            Route::Profile(seconds) => {
                // Acquire: pairs with the window's own release of the flag.
                if shared.window_busy.load(Ordering::Acquire) {
                    let _ = request.respond(text(409, "a profile is being taken already\n"));
                    continue;
                }
                let (shared, stopping) = (Arc::clone(shared), Arc::clone(stopping));
                let spawned = std::thread::Builder::new()
                    .name("jitmap-pprof-profile".into())
                    .spawn(move || profile(request, &shared, &stopping, seconds, period_ns));
                if let Ok(handle) = spawned {
                    profiles.push(handle);
                }
            }
        }
    }
    for p in profiles {
        let _ = p.join();
    }
}

/// Takes one window and answers with its gzipped pprof.
fn profile(
    request: tiny_http::Request,
    shared: &Shared,
    stopping: &AtomicBool,
    seconds: u64,
    period_ns: u64,
) {
    // Acquire: pairs with `Server::stop`'s Release.
    let cancel = || stopping.load(Ordering::Acquire);
    let response = match shared.window(Duration::from_secs(seconds), &cancel) {
        Ok(profile) => {
            let mut body = Vec::new();
            match profile.write_pprof(period_ns, &mut body) {
                Ok(()) => {
                    let mut response = tiny_http::Response::from_data(body);
                    for (name, value) in [
                        ("Content-Type", "application/octet-stream"),
                        ("Content-Disposition", "attachment; filename=\"profile\""),
                    ] {
                        if let Ok(h) = tiny_http::Header::from_bytes(name, value) {
                            response = response.with_header(h);
                        }
                    }
                    response
                }
                Err(e) => text(500, &format!("encoding the profile: {e}\n")),
            }
        }
        Err(AgentError::WindowBusy) => text(409, "a profile is being taken already\n"),
        Err(e) => text(503, &format!("{e}\n")),
    };
    // A client that disconnected mid-profile only loses its answer.
    let _ = request.respond(response);
}

#[cfg(test)]
mod tests {
    use super::{Route, route};

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
