//! The closed-loop Homa client: one endpoint keeping K fixed-size echo RPCs
//! outstanding, a new one sent as each completes, until a count or a time
//! is reached. `homa client` runs it against any server; `rate-bench` runs
//! N of them against its Homa server.

use crate::payload::Payloads;
use crate::stats::{new_histogram, record};
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// One closed-loop client.
#[derive(Clone, Debug)]
pub struct ClosedLoop {
    pub server: SocketAddr,
    /// Local address of the client's endpoint.
    pub bind: SocketAddr,
    pub config: homa::EndpointConfig,
    /// Request size in bytes.
    pub size: usize,
    /// RPCs outstanding at once.
    pub outstanding: usize,
    /// Send at most this many RPCs...
    pub max_rpcs: u64,
    /// ...and none after this.
    pub until: Option<Instant>,
    /// Record RPCs completing in `[from, until)` (all when `None`).
    pub measure_from: Option<Instant>,
    /// Outstanding RPCs not answered this long after the last was sent fail
    /// the client (as a dead server would).
    pub drain: Duration,
}

/// What a closed-loop client measured.
#[derive(Debug)]
pub struct ClosedLoopResult {
    /// Round-trip times of the recorded RPCs, ns.
    pub latency: Histogram<u64>,
    /// RPCs answered (recorded or not).
    pub completed: u64,
    /// RPCs that failed, and the first error.
    pub failed: u64,
    pub first_error: Option<homa::Error>,
    /// Echoes of the request's length whose bytes differ from it.
    pub bad_echo: u64,
    /// Response bytes received.
    pub bytes_back: u64,
    /// Seconds of the recorded window (from `measure_from` or the start, to
    /// `until` or the last send).
    pub window_secs: f64,
}

impl ClosedLoop {
    /// Runs the loop to its bound; fails only when the endpoint does (or
    /// RPCs stay unanswered past `drain`), counting failed RPCs otherwise.
    pub fn run(&self) -> anyhow::Result<ClosedLoopResult> {
        let ep = homa::Endpoint::bind_with(self.bind, self.config.clone())?;
        let result = self.drive(&ep);
        ep.shutdown();
        result
    }

    /// Whether `t` is before `until` (always, without one).
    fn before_until(&self, t: Instant) -> bool {
        !matches!(self.until, Some(u) if t >= u)
    }

    fn drive(&self, ep: &homa::Endpoint) -> anyhow::Result<ClosedLoopResult> {
        const SEQ: u64 = 6;
        let payloads = Payloads::new(self.size);
        let msg = payloads.payload(SEQ, self.size);
        let start = Instant::now();
        let from = self.measure_from.unwrap_or(start);
        let mut r = ClosedLoopResult {
            latency: new_histogram(),
            completed: 0,
            failed: 0,
            first_error: None,
            bad_echo: 0,
            bytes_back: 0,
            window_secs: 0.0,
        };
        let mut started: Vec<(homa::RpcId, Instant)> = Vec::with_capacity(self.outstanding);
        let (mut sent, mut last_send) = (0u64, start);
        let more = |sent: u64| sent < self.max_rpcs && self.before_until(Instant::now());
        loop {
            while started.len() < self.outstanding.max(1) && more(sent) {
                let t0 = Instant::now();
                started.push((ep.send_request_shared(self.server, msg.clone())?, t0));
                (sent, last_send) = (sent + 1, t0);
            }
            if started.is_empty() {
                break;
            }
            anyhow::ensure!(
                last_send.elapsed() < self.drain,
                "{} RPCs unanswered {:?} after the last was sent",
                started.len(),
                self.drain
            );
            let Some(resp) = ep.recv_response_timeout(Duration::from_millis(100))? else {
                continue;
            };
            let Some(i) = started.iter().position(|(id, _)| *id == resp.id) else {
                continue;
            };
            let (_, t0) = started.swap_remove(i);
            let now = Instant::now();
            match resp.result {
                Ok(m) => {
                    r.completed += 1;
                    r.bytes_back += m.len() as u64;
                    // An echo server returns the payload; check it when it does.
                    if m.len() == self.size && !payloads.matches(SEQ, &m.contiguous()) {
                        r.bad_echo += 1;
                    }
                    if now >= from && self.before_until(now) {
                        record(&mut r.latency, now.duration_since(t0).as_nanos() as u64);
                    }
                }
                Err(e) => {
                    r.failed += 1;
                    r.first_error.get_or_insert(e);
                }
            }
        }
        let end = self.until.map_or(Instant::now(), |u| u.min(Instant::now()));
        r.window_secs = end.saturating_duration_since(from).as_secs_f64();
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_rpc_against_an_echo_server() {
        let server = homa::Endpoint::bind("127.0.0.1:0").unwrap();
        let srv = server.clone();
        let echo = std::thread::spawn(move || {
            srv.serve(|req| {
                let (m, responder) = req.into_parts();
                let _ = responder.reply(m.into_bytes());
            })
        });
        let c = ClosedLoop {
            server: server.local_addr(),
            bind: "127.0.0.1:0".parse().unwrap(),
            config: homa::EndpointConfig::default(),
            size: 3000,
            outstanding: 3,
            max_rpcs: 50,
            until: None,
            measure_from: None,
            drain: Duration::from_secs(5),
        };
        let r = c.run().unwrap();
        assert_eq!((r.completed, r.failed, r.bad_echo), (50, 0, 0));
        assert_eq!(r.latency.len(), 50);
        assert_eq!(r.bytes_back, 50 * 3000);
        server.shutdown();
        echo.join().unwrap().unwrap();
    }
}
