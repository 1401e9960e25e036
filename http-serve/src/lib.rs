//! rm-http-serve: the accept loop that rm's HTTP servers (the receiver in `rm-agent`, and
//! `rm-relay`) share, so the rules that keep a public listener healthy live in one place: at most
//! [`Limits::max_connections`] served at once (further ones wait in the kernel's accept queue), at
//! most [`MAX_CONNECTIONS_PER_PEER`] of them from one address (further ones are closed at once),
//! a client that does not send its headers in time is cut off, an `accept` error backs off instead
//! of spinning, answers leave without Nagle's delay, and a shutdown stops accepting and then
//! waits, up to a bound, for the requests in flight.

pub mod budget;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// After a failed `accept` (out of file descriptors and the like), the loop waits this long.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Connections served at once from one peer address. Without it one sender could take every
/// connection slot and keep GitHub out; with it a sender needs many addresses. A reverse proxy in
/// front (all connections from its one address) keeps far fewer open (nginx's `keepalive 8` in
/// deploy/proxy), and GitHub's bursts of hundreds of deliveries come from many addresses, each
/// answered in milliseconds. A connection past it is closed as soon as it is accepted.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;

/// Whether a peer already holding `held` connections may have one more.
pub fn admits(held: usize, per_peer: usize) -> bool {
    held < per_peer
}

/// The connections each peer address holds now.
#[derive(Debug, Default)]
struct PeerCounts {
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in [`PeerCounts`], given back when dropped.
struct PeerSlot {
    counts: Arc<PeerCounts>,
    ip: IpAddr,
}

impl PeerCounts {
    /// A slot for a connection from `ip`, if that peer holds fewer than `per_peer`.
    fn take(self: &Arc<Self>, ip: IpAddr, per_peer: usize) -> Option<PeerSlot> {
        // An IPv4 peer on a dual-stack socket is one peer, whichever form it comes in.
        let ip = ip.to_canonical();
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(ip).or_insert(0);
        if !admits(*count, per_peer) {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            counts: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut held = self
            .counts
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            // The map holds only peers with a connection open: it cannot grow without bound.
            if *count == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// The address a request's connection comes from, in the request's extensions: a server that
/// knows its clients by where they connect from (the host-local cache knows runners so) reads it
/// there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// The bounds a server runs under.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// A client that has not sent its headers by then is cut off.
    pub header_read_timeout: Duration,
    /// How long a shutdown waits for requests in flight to be answered.
    pub drain_timeout: Duration,
}

/// Serves connections from `listener` with `handle` until `shutdown` completes. Then it stops
/// accepting, calls `stopping` (a server with long-lived responses, like event streams, ends them
/// there) and waits up to [`Limits::drain_timeout`] for the requests in flight.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    limits: Limits,
    handle: H,
    shutdown: impl Future<Output = ()>,
    stopping: impl FnOnce(),
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(PeerCounts::default());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(peer_slot) = peers.take(peer.ip(), MAX_CONNECTIONS_PER_PEER) else {
            // Dropping the stream closes it; the permit goes back with `permit`.
            tracing::debug!(%peer, "closed a connection past the per-peer limit");
            continue;
        };
        // Answers are small writes that must leave at once.
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let service = service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(Peer(peer));
            let answer = handle(req);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
            drop(peer_slot);
            drop(permit);
        });
    }
    drop(listener);
    stopping();
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the drain timeout");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 1,
        header_read_timeout: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(5),
    };

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// [`get`], with a refused or closed connection as `None` instead of a panic.
    async fn try_get(addr: std::net::SocketAddr) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        Some(answer)
    }

    #[tokio::test]
    async fn answers_bounds_connections_and_drains_at_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            LIMITS,
            |_req| async { Response::new(Full::new(Bytes::from_static(b"hello"))) },
            async {
                let _ = stop_rx.await;
            },
            move || {
                let _ = stopping_tx.send(());
            },
        ));
        assert!(get(addr).await.ends_with("hello"));

        // The one slot is held by a client that sends no headers until it is cut off; the
        // next client waits for the slot instead of being refused.
        let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(10), get(addr))
            .await
            .expect("the silent client was never cut off");
        assert!(next.ends_with("hello"));
        drop(idle);

        stop_tx.send(()).unwrap();
        stopping_rx.await.unwrap();
        server.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_gets_it_back() {
        let counts = Arc::new(PeerCounts::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = counts.take(a, 2).unwrap();
        let _second = counts.take(mapped, 2).unwrap();
        assert!(
            counts.take(a, 2).is_none(),
            "the mapped form is the same peer"
        );
        let _other = counts.take(b, 2).unwrap();
        drop(first);
        let _again = counts.take(a, 2).unwrap();
        assert!(!admits(2, 2) && admits(1, 2));
    }

    /// A peer holding [`MAX_CONNECTIONS_PER_PEER`] connections has its next one closed at once,
    /// though the server has room; once one of its connections ends, it is served again.
    #[tokio::test]
    async fn connections_past_the_per_peer_limit_are_closed_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: MAX_CONNECTIONS_PER_PEER + 16,
            // Long enough that no idle connection below is cut off during the test.
            header_read_timeout: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(5),
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            limits,
            |_req| async { Response::new(Full::new(Bytes::from_static(b"hello"))) },
            async {
                let _ = stop_rx.await;
            },
            || {},
        ));
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_PEER {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // The accept loop takes connections in order: by the time it takes this one, it has
        // counted all of the above.
        let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(30), over.read(&mut buf))
            .await
            .expect("a connection past the limit was left open");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

        // One held connection still works, and once it ends the peer may connect again.
        let mut first = held.remove(0);
        first
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        first.read_to_string(&mut answer).await.unwrap();
        assert!(answer.ends_with("hello"), "{answer}");
        let mut served = false;
        for _ in 0..100 {
            // The server sees the closed connection a little after the client does.
            if tokio::time::timeout(Duration::from_secs(5), try_get(addr))
                .await
                .is_ok_and(|answer| answer.is_some_and(|a| a.ends_with("hello")))
            {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            served,
            "the peer was not served again after a connection ended"
        );
        drop(held);
        stop_tx.send(()).unwrap();
        server.await.unwrap();
    }
}
