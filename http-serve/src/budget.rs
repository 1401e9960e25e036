//! The bytes that request bodies may hold while they stream in and until their delivery is
//! committed, across all requests: what keeps junk sent before any signature can be checked from
//! exhausting the host's memory. One implementation for both public intakes: the receiver's
//! webhook path and the relay's ingest (`POST /hooks/...`), each with a budget of its own.
//!
//! Every request may hold its first [`BodyLimits::allowance`] bytes without asking anyone; the
//! server serves at most `max_connections` requests at once (HTTP/1.1, one request at a time per
//! connection), so these allowances are bounded by `max_connections × allowance` and a small body
//! (a GitHub delivery is typically ~10 KiB) is never refused for lack of memory, however many junk
//! bodies are streaming. Bytes past the allowance come from one shared pool of
//! [`BodyLimits::pool`] bytes; when it cannot give them, the request is refused at once (the
//! receiver answers 503 with `Retry-After`) and everything it held is released. The bytes held at
//! most are therefore `max_connections × allowance + pool`, whatever the senders do.
//!
//! What is counted is the buffer's capacity, not its length: it is the allocation that costs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hyper::body::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Bytes every request's body may hold without drawing on the shared pool. GitHub's
/// `workflow_job` deliveries are 7-30 KiB, so one fits whole and is never refused for memory:
/// the allowances of all requests together are at most the server's `max_connections` x this
/// (1024 connections: 64 MiB).
pub const BODY_ALLOWANCE_BYTES: usize = 64 * 1024;
/// Bytes shared by all bodies past their allowance, while they stream in and until their
/// delivery is committed: room for seven 25 MiB bodies at once. With the allowances of 1024
/// connections, body buffers never hold more than 256 MiB, whatever senders do before anything
/// about them can be checked.
pub const BODY_POOL_BYTES: usize = 192 * 1024 * 1024;
/// What a body refused for want of memory is told to wait (`Retry-After`, seconds). GitHub does
/// not retry by itself; rm-agent's redelivery and recovery bring such a delivery back.
pub const BUSY_RETRY_AFTER_SECS: u32 = 5;

/// The bounds of [`BodyBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Bytes each request may hold without drawing on the pool.
    pub allowance: usize,
    /// Bytes shared by every request's body past its allowance.
    pub pool: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits {
            allowance: BODY_ALLOWANCE_BYTES,
            pool: BODY_POOL_BYTES,
        }
    }
}

/// Why a body could not take more bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The body would pass the per-body cap.
    TooLarge,
    /// The shared pool has not got the bytes now.
    Busy,
}

/// The shared pool and the gauges `/metrics` reads.
#[derive(Debug)]
pub struct BodyBudget {
    limits: BodyLimits,
    pool: Arc<Semaphore>,
    /// Capacity of every body buffer alive now, allowances included.
    held: AtomicUsize,
    /// The most [`Self::held`] has been since start.
    high_water: AtomicUsize,
}

impl BodyBudget {
    pub fn new(limits: BodyLimits) -> Self {
        // A semaphore counts at most `Semaphore::MAX_PERMITS`; a larger pool is that.
        let pool = limits.pool.min(Semaphore::MAX_PERMITS);
        BodyBudget {
            limits: BodyLimits { pool, ..limits },
            pool: Arc::new(Semaphore::new(pool)),
            held: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
        }
    }

    /// Bytes held by body buffers now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes body buffers have held at once since start.
    pub fn high_water(&self) -> usize {
        self.high_water.load(Ordering::Relaxed)
    }

    /// An empty buffer for one body of at most `max_len` bytes, `declared` by its Content-Length
    /// if it has one.
    pub fn buffer(self: &Arc<Self>, declared: Option<usize>, max_len: usize) -> BodyBuffer {
        BodyBuffer {
            budget: Arc::clone(self),
            bytes: Vec::new(),
            declared,
            max_len,
            accounted: 0,
            permit: None,
        }
    }

    fn add(&self, n: usize) {
        let now = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.high_water.fetch_max(now, Ordering::Relaxed);
    }
}

/// One body's bytes as they arrive, and the share of the budget they hold. Dropping it (or the
/// [`Hold`] it becomes) gives that share back.
#[derive(Debug)]
pub struct BodyBuffer {
    budget: Arc<BodyBudget>,
    bytes: Vec<u8>,
    declared: Option<usize>,
    max_len: usize,
    /// Bytes of capacity counted in [`BodyBudget::held`] for this buffer.
    accounted: usize,
    /// What this buffer drew from the pool, past its allowance.
    permit: Option<OwnedSemaphorePermit>,
}

/// Keeps a body's share of the budget until the delivery it became is answered.
#[derive(Debug)]
pub struct Hold {
    budget: Arc<BodyBudget>,
    accounted: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.budget
            .held
            .fetch_sub(self.accounted, Ordering::Relaxed);
    }
}

impl BodyBuffer {
    /// Appends `chunk`, growing the buffer within the budget; on a refusal nothing is appended.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Refused> {
        let len = self.bytes.len();
        let needed = len.checked_add(chunk.len()).ok_or(Refused::TooLarge)?;
        if needed > self.max_len {
            return Err(Refused::TooLarge);
        }
        if needed > self.bytes.capacity() {
            let capacity = grown_capacity(
                self.bytes.capacity(),
                needed,
                self.declared,
                self.max_len,
                self.budget.limits.allowance,
            );
            self.account(capacity)?;
            self.bytes.reserve_exact(capacity - len);
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// The body's bytes, and the budget they hold until the `Hold` is dropped.
    pub fn finish(mut self) -> (Vec<u8>, Hold) {
        let bytes = std::mem::take(&mut self.bytes);
        let hold = Hold {
            budget: Arc::clone(&self.budget),
            accounted: std::mem::take(&mut self.accounted),
            _permit: self.permit.take(),
        };
        (bytes, hold)
    }

    /// Counts a capacity of `capacity` bytes for this buffer, drawing what passes the
    /// allowance from the pool.
    fn account(&mut self, capacity: usize) -> Result<(), Refused> {
        let allowance = self.budget.limits.allowance;
        let from_pool = capacity.saturating_sub(allowance);
        let drawn = self.accounted.saturating_sub(allowance);
        if from_pool > drawn {
            let more = u32::try_from(from_pool - drawn).map_err(|_| Refused::Busy)?;
            let permit = match Arc::clone(&self.budget.pool).try_acquire_many_owned(more) {
                Ok(permit) => permit,
                Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                    return Err(Refused::Busy);
                }
            };
            match &mut self.permit {
                Some(held) => held.merge(permit),
                None => self.permit = Some(permit),
            }
        }
        self.budget.add(capacity - self.accounted);
        self.accounted = capacity;
        Ok(())
    }
}

impl Drop for BodyBuffer {
    fn drop(&mut self) {
        self.budget
            .held
            .fetch_sub(self.accounted, Ordering::Relaxed);
    }
}

/// Why a body was not read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Over the per-body cap (answer 413), or the pool is spent (answer 503 with
    /// [`BUSY_RETRY_AFTER_SECS`]); either way, close the connection rather than drain the rest.
    Refused(Refused),
    /// The connection failed mid-body.
    Read,
}

/// Reads `body` into one buffer as it streams in (the only copy made), each chunk within
/// `budget` and the per-body cap `max_len`. The caller bounds the time it may take.
pub async fn read_body<B>(
    budget: &Arc<BodyBudget>,
    mut body: B,
    declared: Option<usize>,
    max_len: usize,
) -> Result<(Vec<u8>, Hold), BodyError>
where
    B: Body + Unpin,
    B::Data: AsRef<[u8]>,
{
    use http_body_util::BodyExt as _;
    let mut buffer = budget.buffer(declared, max_len);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Read)?;
        if let Some(chunk) = frame.data_ref() {
            buffer.push(chunk.as_ref()).map_err(BodyError::Refused)?;
        }
    }
    Ok(buffer.finish())
}

/// The capacity a body buffer grows to when it needs `needed` bytes: the allowance at first, then
/// twice what it had (amortized copies), never more than a declared length that still holds nor
/// than `max_len`, never less than `needed`. A declared length is not reserved up front: a sender
/// that declares 25 MiB and trickles bytes holds about what it sent, not what it promised.
fn grown_capacity(
    capacity: usize,
    needed: usize,
    declared: Option<usize>,
    max_len: usize,
    allowance: usize,
) -> usize {
    let mut wanted = if capacity == 0 {
        allowance
    } else {
        capacity.saturating_mul(2)
    };
    if let Some(declared) = declared.filter(|d| *d >= needed) {
        wanted = wanted.min(declared);
    }
    wanted.min(max_len).max(needed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    const KIB: usize = 1024;

    fn budget(allowance: usize, pool: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget::new(BodyLimits { allowance, pool }))
    }

    #[test]
    fn capacity_starts_at_the_allowance_doubles_and_stops_at_the_declared_length_or_cap() {
        assert_eq!(
            grown_capacity(0, 10, Some(9 * KIB), 100 * KIB, 64 * KIB),
            9 * KIB
        );
        // A Content-Length that turned out short is not trusted again.
        assert_eq!(
            grown_capacity(9 * KIB, 9 * KIB + 1, Some(9 * KIB), 100 * KIB, 64 * KIB),
            18 * KIB
        );
        assert_eq!(grown_capacity(0, 10, None, 100 * KIB, 64 * KIB), 64 * KIB);
        // A large declared length is not reserved before the bytes come.
        assert_eq!(
            grown_capacity(0, 10, Some(1 << 30), 100 * KIB, 64 * KIB),
            64 * KIB
        );
        assert_eq!(
            grown_capacity(64 * KIB, 65 * KIB, Some(90 * KIB), 100 * KIB, 64 * KIB),
            90 * KIB
        );
        assert_eq!(
            grown_capacity(64 * KIB, 65 * KIB, None, 100 * KIB, 64 * KIB),
            100 * KIB
        );
        assert_eq!(grown_capacity(0, 200, None, 1000, 100), 200);
    }

    #[test]
    fn a_body_within_its_allowance_is_taken_even_when_the_pool_is_empty() {
        let budget = budget(16 * KIB, 0);
        let mut small = budget.buffer(Some(10 * KIB), 1 << 20);
        small.push(&[b'x'; 10 * KIB]).unwrap();
        assert_eq!(budget.held(), 10 * KIB);
        let mut large = budget.buffer(None, 1 << 20);
        large.push(&[b'x'; 16 * KIB]).unwrap();
        assert_eq!(large.push(b"x"), Err(Refused::Busy));
        let (bytes, hold) = small.finish();
        assert_eq!(bytes.len(), 10 * KIB);
        drop(large);
        assert_eq!(budget.held(), 10 * KIB, "the hold keeps its share");
        drop(hold);
        assert_eq!(budget.held(), 0);
        assert_eq!(budget.high_water(), 26 * KIB);
    }

    #[test]
    fn the_pool_is_shared_and_given_back() {
        let budget = budget(KIB, 8 * KIB);
        let mut first = budget.buffer(Some(9 * KIB), 1 << 20);
        first.push(&[0; 9 * KIB]).unwrap();
        let mut second = budget.buffer(Some(2 * KIB), 1 << 20);
        assert_eq!(second.push(&[0; 2 * KIB]), Err(Refused::Busy));
        assert!(second.bytes.is_empty(), "nothing appended on a refusal");
        drop(first);
        second.push(&[0; 2 * KIB]).unwrap();
        assert_eq!(budget.held(), 2 * KIB);
    }

    #[test]
    fn the_cap_is_per_body() {
        let budget = budget(KIB, 1 << 20);
        let mut body = budget.buffer(None, 3 * KIB);
        body.push(&[0; 2 * KIB]).unwrap();
        assert_eq!(body.push(&[0; 2 * KIB]), Err(Refused::TooLarge));
        body.push(&[0; KIB]).unwrap();
        assert_eq!(body.finish().0.len(), 3 * KIB);
    }

    #[test]
    fn growth_draws_only_what_passes_the_allowance() {
        let budget = budget(4 * KIB, 6 * KIB);
        let mut body = budget.buffer(None, 1 << 20);
        body.push(&[0; 4 * KIB]).unwrap();
        // Doubling to 8 KiB draws 4 KiB; the next doubling (16 KiB, 12 from the pool) does not fit.
        body.push(&[0; KIB]).unwrap();
        assert_eq!(budget.pool.available_permits(), 2 * KIB);
        assert_eq!(body.push(&[0; 4 * KIB]), Err(Refused::Busy));
        drop(body);
        assert_eq!(budget.pool.available_permits(), 6 * KIB);
        assert_eq!(budget.held(), 0);
    }
}
