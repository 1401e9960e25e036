//! rm-http-serve: the accept loop that rm's HTTP servers (the receiver in `rm-agent`, and
//! `rm-relay`) share, so the rules that keep a public listener healthy live in one place: at most
//! [`Limits::max_connections`] served at once (further ones wait in the kernel's accept queue), a
//! client that does not send its headers in time is cut off, an `accept` error backs off instead
//! of spinning, answers leave without Nagle's delay, and a shutdown stops accepting and then
//! waits, up to a bound, for the requests in flight.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
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
        // Answers are small writes that must leave at once.
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let service = service_fn(move |req| {
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
}
