//! A function's instances, as Lambda keeps them: as many as invocations run at once, each
//! running one invocation at a time.
//!
//! On AWS every concurrent `deliver` invocation is its own instance with its own request
//! limits (its total in flight, each endpoint's adaptive limit) and its own file descriptors.
//! The runner plays that: each of its concurrent invocations takes an idle instance and gives
//! it back when it ends, so four invocations at once have four instances' limits, not one
//! shared between them. Each has its own connection pool too; what they share here (the warm
//! caches, the stores, the subscriptions' caps) is said where the runner builds them.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Idle instances, and a permit for each.
pub(crate) struct Instances<T> {
    idle: Mutex<Vec<Arc<T>>>,
    free: Arc<Semaphore>,
}

impl<T> Instances<T> {
    pub(crate) fn new(all: Vec<Arc<T>>) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(all.len())),
            idle: Mutex::new(all),
        })
    }

    /// An idle instance, waiting for one if all are running (the pollers never run more
    /// invocations at once than there are instances, so they do not wait).
    pub(crate) async fn take(self: &Arc<Self>) -> Instance<T> {
        // The semaphore is never closed, and a permit means an idle instance is in the list.
        let permit = Arc::clone(&self.free)
            .acquire_owned()
            .await
            .expect("the instances' semaphore is never closed");
        let instance = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .expect("a free permit means an idle instance");
        Instance {
            instance,
            pool: Arc::clone(self),
            _permit: permit,
        }
    }
}

/// One instance while an invocation runs on it; dropped, it is idle again.
pub(crate) struct Instance<T> {
    instance: Arc<T>,
    pool: Arc<Instances<T>>,
    // Released after the instance is back in the list (fields drop after `drop`).
    _permit: OwnedSemaphorePermit,
}

impl<T> std::ops::Deref for Instance<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.instance
    }
}

impl<T> Drop for Instance<T> {
    fn drop(&mut self) {
        self.pool
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&self.instance));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;

    /// Invocations at once never share an instance, and an instance that ends is taken again.
    #[tokio::test]
    async fn concurrent_invocations_each_have_an_instance_of_their_own() {
        let pool = Instances::new((0..3).map(Arc::new).collect());
        let (a, b, c) = (pool.take().await, pool.take().await, pool.take().await);
        let running: HashSet<i32> = [*a, *b, *c].into();
        assert_eq!(running.len(), 3, "three invocations, three instances");
        // A fourth waits until one ends, then gets that one.
        let mut fourth = Box::pin(pool.take());
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut fourth)
                .await
                .is_err(),
            "no idle instance: the fourth invocation waits"
        );
        let ended = *b;
        drop(b);
        let d = tokio::time::timeout(Duration::from_secs(1), fourth)
            .await
            .expect("an instance was given back");
        assert_eq!(*d, ended);
        assert_ne!(*d, *a);
        assert_ne!(*d, *c);
    }
}
