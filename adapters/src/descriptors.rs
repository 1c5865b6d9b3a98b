//! New connections only while the process has file descriptors to spare.
//!
//! The sender keeps an endpoint's connections open between requests and between warm
//! invocations, as many as the endpoint had in flight, so the next burst starts warm instead of
//! opening (and leaving in TIME_WAIT) hundreds of sockets. Lambda gives a function 1,024 file
//! descriptors, and idle connections to endpoints a worker no longer sends to would otherwise
//! hold them until their idle timeout while another endpoint needs new ones, and the AWS SDK's
//! calls (deleting messages, re-enqueueing, writing state) need a few too.
//!
//! So every new connection first counts the process's open descriptors ([`DescriptorGuard`],
//! in the sender's connector, [`GuardedConnector`]): from [`FLUSH_AT`] below the limit it asks
//! for the idle pool to be dropped ([`DescriptorGuard::flush_wanted`]); within [`RESERVE`] of
//! it the connection is refused, a failed attempt retried on the ladder, so the descriptors
//! left are the AWS calls'. Counting is a directory read on Linux, never per request and not
//! per new connection either (an endpoint that closes its connections would pay one per
//! request): the count read last plus the connections opened since is the estimate, read
//! again from twice the flush mark's distance below the limit, or when it is a second old.
//! Between reads it misses descriptors opened elsewhere (the SDK's sockets, DNS), which the
//! margin covers. Elsewhere (no `/proc`) the guard lets everything through.
//!
//! A dropped pool closes its idle connections once the last request sent on it has its answer
//! (the client's requests hold it until then): at once when endpoints answer, up to the
//! attempt timeout and R4's late window when one hangs. Until then new connections may be
//! refused within the reserve, failed attempts that are retried, never the AWS calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use futures::future::{Either, Ready, ready};

/// Descriptors kept for everything that is not an endpoint connection.
pub const RESERVE: usize = 64;
/// How far below the limit the idle pool is dropped.
pub const FLUSH_AT: usize = 2 * RESERVE;
/// The limit assumed where the process's own cannot be read (Lambda's).
pub const DEFAULT_LIMIT: usize = 1024;

/// A connection refused to keep descriptors for the AWS calls.
#[derive(Debug, thiserror::Error)]
#[error(
    "no file descriptor to spare for a new connection: {open} of the process's {limit} are open, \
     {RESERVE} are kept for AWS calls"
)]
pub struct NoDescriptorToSpare {
    pub open: usize,
    pub limit: usize,
}

/// How long a count of open descriptors is trusted (plus the connections opened since).
const COUNT_FOR: Duration = Duration::from_secs(1);

/// The count and the limit a guard checks, and where it asks for a flush.
#[derive(Debug, Clone)]
pub struct DescriptorGuard {
    limit: usize,
    flush: Arc<AtomicBool>,
    count: Arc<Mutex<Option<Count>>>,
}

/// Descriptors open when last read, and connections opened since.
#[derive(Debug)]
struct Count {
    read: usize,
    at: Instant,
    opened_since: usize,
}

impl DescriptorGuard {
    /// A guard under `limit` descriptors (the process's soft limit: [`process_limit`]).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            flush: Arc::new(AtomicBool::new(false)),
            count: Arc::new(Mutex::new(None)),
        }
    }

    /// About as many descriptors as are open now, counting one more for the connection
    /// about to open: the last count plus what was opened since, read again (`read_open`) from
    /// twice the flush mark's distance below the limit or when the count is old.
    fn estimate_with_one_more(&self, read_open: impl FnOnce() -> Option<usize>) -> Option<usize> {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = count.as_mut()
            && c.read + c.opened_since + 2 * FLUSH_AT < self.limit
            && c.at.elapsed() < COUNT_FOR
        {
            let estimate = c.read + c.opened_since;
            c.opened_since += 1;
            return Some(estimate);
        }
        let read = read_open()?;
        *count = Some(Count {
            read,
            at: Instant::now(),
            opened_since: 1,
        });
        Some(read)
    }

    /// Whether a connection found descriptors running short since this was last asked.
    pub fn flush_wanted(&self) -> bool {
        self.flush.swap(false, Ordering::AcqRel)
    }

    /// Whether a new connection may be opened with `open` descriptors in use; asks for a flush
    /// when they run short.
    pub fn admit(&self, open: usize) -> Result<(), NoDescriptorToSpare> {
        if open + FLUSH_AT >= self.limit {
            self.flush.store(true, Ordering::Release);
        }
        if open + RESERVE >= self.limit {
            return Err(NoDescriptorToSpare {
                open,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// The process's soft limit on open files, from `/proc/self/limits` ([`DEFAULT_LIMIT`] where
/// it cannot be read).
pub fn process_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|soft| soft.parse().ok())
        })
        .unwrap_or(DEFAULT_LIMIT)
}

/// Descriptors the process has open now (none where it cannot tell).
pub fn open_descriptors() -> Option<usize> {
    std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count())
}

/// An error a connector may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connector that asks the guard before each new connection.
#[derive(Debug, Clone)]
pub struct GuardedConnector<S> {
    guard: DescriptorGuard,
    inner: S,
}

impl<S> GuardedConnector<S> {
    pub fn new(guard: DescriptorGuard, inner: S) -> Self {
        Self { guard, inner }
    }
}

impl<S, R> tower_service::Service<R> for GuardedConnector<S>
where
    S: tower_service::Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future =
        Either<Ready<Result<S::Response, BoxError>>, futures::future::ErrInto<S::Future, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let open = self.guard.estimate_with_one_more(open_descriptors);
        match open.map(|open| self.guard.admit(open)) {
            Some(Err(refused)) => Either::Left(ready(Err(refused.into()))),
            _ => Either::Right(self.inner.call(request).err_into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_admitted_until_the_reserve_and_a_flush_is_asked_before() {
        let guard = DescriptorGuard::new(1024);
        assert!(guard.admit(100).is_ok());
        assert!(!guard.flush_wanted());
        assert!(guard.admit(1024 - FLUSH_AT).is_ok());
        assert!(
            guard.flush_wanted(),
            "short of descriptors: flush the idle pool"
        );
        assert!(!guard.flush_wanted(), "asked once per shortage seen");
        let refused = guard.admit(1024 - RESERVE).unwrap_err();
        assert_eq!((refused.open, refused.limit), (960, 1024));
        assert!(refused.to_string().contains("960 of the process's 1024"));
        assert!(guard.flush_wanted());
    }

    #[test]
    fn the_count_is_read_again_only_near_the_flush_mark() {
        let guard = DescriptorGuard::new(1024);
        let reads = std::cell::Cell::new(0);
        let read = |open| {
            reads.set(reads.get() + 1);
            Some(open)
        };
        assert_eq!(guard.estimate_with_one_more(|| read(100)), Some(100));
        // 100 open, and each connection since counted as open: no read until twice the flush
        // mark's distance from the limit.
        for opened in 1..(1024 - 2 * FLUSH_AT - 100) {
            assert_eq!(guard.estimate_with_one_more(|| read(0)), Some(100 + opened));
        }
        assert_eq!(reads.get(), 1);
        // At the mark, the real count: connections closed meanwhile lower it again.
        assert_eq!(guard.estimate_with_one_more(|| read(300)), Some(300));
        assert_eq!(reads.get(), 2);
        assert_eq!(guard.estimate_with_one_more(|| read(0)), Some(301));
        // Nothing readable (no /proc): no bound, the guard lets connections through.
        let blind = DescriptorGuard::new(1024);
        assert_eq!(blind.estimate_with_one_more(|| None), None);
    }

    #[test]
    fn the_process_limit_and_count_are_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(process_limit() >= 64);
            // stdin, stdout and stderr at least (other tests open files meanwhile).
            assert!(open_descriptors().expect("/proc/self/fd") >= 3);
        }
    }
}
