//! How an SQS event source gathers a batch before it invokes (#38): the stacks'
//! `DeliveryBatchSize` and `DeliveryBatchingWindowSeconds`, AWS's `BatchSize` and
//! `MaximumBatchingWindowInSeconds`.
//!
//! Lambda invokes as soon as the batch holds `BatchSize` messages, the window has passed since
//! the first, or the batch reaches the 6 MB invocation payload, whichever comes first. Without a
//! window it invokes with what one receive found. AWS refuses a batch size above 10 without a
//! window of at least 1 s, and windows above 300 s; so does the runner.

use std::time::Duration;

use gridrelay_shared::limits::LimitError;

/// The most messages one SQS receive answers (what each receive asks for, at most).
pub const RECEIVE_MAX_MESSAGES: usize = 10;

/// The largest batch an SQS event source allows without a window.
pub const MAX_BATCH_SIZE_WITHOUT_WINDOW: u32 = 10;

/// The largest batch an SQS event source allows (standard queues, with a window).
pub const MAX_BATCH_SIZE: u32 = 10_000;

/// The longest window an SQS event source allows.
pub const MAX_WINDOW_SECONDS: u64 = 300;

/// A synchronous invocation's largest payload (6 MB): an event source never hands more.
pub const INVOCATION_PAYLOAD_LIMIT: usize = 6 * 1024 * 1024;

/// The longest one SQS long poll waits.
const LONGEST_POLL_SECONDS: u64 = 20;

/// An event source's batch size and window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSourceBatching {
    batch_size: u32,
    window: Duration,
}

impl Default for EventSourceBatching {
    /// AWS's defaults and the stacks': 10 messages, no window (G3: nothing held back).
    fn default() -> Self {
        Self {
            batch_size: MAX_BATCH_SIZE_WITHOUT_WINDOW,
            window: Duration::ZERO,
        }
    }
}

/// What the event source does next with the messages it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gather {
    /// Invoke the function with them.
    Invoke,
    /// Receive up to `max` more, waiting up to `wait_seconds` for the first.
    Receive { max: usize, wait_seconds: u64 },
    /// Less than a second of the window is left (SQS waits whole seconds): sleep it out, then
    /// take what has arrived without waiting.
    SleepThenReceive { sleep: Duration, max: usize },
}

impl EventSourceBatching {
    /// A batch size and window, refused as AWS refuses them, naming the runner's flags.
    pub fn new(batch_size: u32, window_seconds: u64) -> Result<Self, LimitError> {
        if window_seconds > MAX_WINDOW_SECONDS {
            return Err(LimitError::new(
                "--delivery-batching-window-seconds",
                window_seconds,
                format!(
                    "0 to {MAX_WINDOW_SECONDS} (the SQS event source's MaximumBatchingWindowInSeconds)"
                ),
            ));
        }
        let largest = if window_seconds == 0 {
            MAX_BATCH_SIZE_WITHOUT_WINDOW
        } else {
            MAX_BATCH_SIZE
        };
        if !(1..=largest).contains(&batch_size) {
            return Err(LimitError::new(
                "--delivery-batch-size",
                batch_size,
                format!(
                    "1 to {largest} with a batching window of {window_seconds} s (above \
                     {MAX_BATCH_SIZE_WITHOUT_WINDOW}, AWS requires \
                     --delivery-batching-window-seconds of at least 1; {MAX_BATCH_SIZE} at most)"
                ),
            ));
        }
        Ok(Self {
            batch_size,
            window: Duration::from_secs(window_seconds),
        })
    }

    pub fn batch_size(&self) -> u32 {
        self.batch_size
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// How many messages the first receive of a batch asks for.
    pub(crate) fn first_receive(&self) -> usize {
        (self.batch_size as usize).min(RECEIVE_MAX_MESSAGES)
    }

    /// What comes next for a batch holding `held` messages of `payload` bytes, the first
    /// received `since_first` ago.
    pub(crate) fn next(&self, held: usize, payload: usize, since_first: Duration) -> Gather {
        let wanted = (self.batch_size as usize).saturating_sub(held);
        if wanted == 0 || payload >= INVOCATION_PAYLOAD_LIMIT {
            return Gather::Invoke;
        }
        let left = self.window.saturating_sub(since_first);
        if left.is_zero() {
            return Gather::Invoke;
        }
        let max = wanted.min(RECEIVE_MAX_MESSAGES);
        match left.as_secs() {
            0 => Gather::SleepThenReceive { sleep: left, max },
            whole => Gather::Receive {
                max,
                wait_seconds: whole.min(LONGEST_POLL_SECONDS),
            },
        }
    }
}

/// How many of `sizes` (each message's share of the invocation payload, in order) one
/// invocation takes: as many as fit in [`INVOCATION_PAYLOAD_LIMIT`], and at least one (a
/// single message is never larger: SQS caps messages at 1 MiB). The rest wait for the next.
pub(crate) fn fitting(sizes: &[usize]) -> usize {
    let mut total = 0;
    let taken = sizes
        .iter()
        .take_while(|&&size| {
            total += size;
            total <= INVOCATION_PAYLOAD_LIMIT
        })
        .count();
    taken.max(1).min(sizes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_window_a_receive_is_invoked_at_once() {
        let batching = EventSourceBatching::default();
        assert_eq!(batching.first_receive(), 10);
        assert_eq!(batching.next(1, 500, Duration::ZERO), Gather::Invoke);
        assert_eq!(batching.next(7, 500, Duration::ZERO), Gather::Invoke);
    }

    #[test]
    fn a_window_receives_until_the_batch_is_full() {
        let batching = EventSourceBatching::new(25, 3).unwrap();
        assert_eq!(
            batching.next(1, 500, Duration::from_millis(200)),
            Gather::Receive {
                max: 10,
                wait_seconds: 2
            }
        );
        assert_eq!(
            batching.next(20, 500, Duration::from_millis(200)),
            Gather::Receive {
                max: 5,
                wait_seconds: 2
            }
        );
        assert_eq!(batching.next(25, 500, Duration::ZERO), Gather::Invoke);
    }

    #[test]
    fn the_windows_last_fraction_of_a_second_is_slept_then_taken_without_waiting() {
        let batching = EventSourceBatching::new(100, 1).unwrap();
        assert_eq!(
            batching.next(3, 500, Duration::from_millis(300)),
            Gather::SleepThenReceive {
                sleep: Duration::from_millis(700),
                max: 10
            }
        );
        assert_eq!(
            batching.next(3, 500, Duration::from_secs(1)),
            Gather::Invoke
        );
        assert_eq!(
            batching.next(3, 500, Duration::from_secs(5)),
            Gather::Invoke
        );
    }

    #[test]
    fn a_long_window_waits_at_most_an_sqs_long_poll_at_a_time() {
        let batching = EventSourceBatching::new(10_000, 300).unwrap();
        assert_eq!(
            batching.next(1, 500, Duration::ZERO),
            Gather::Receive {
                max: 10,
                wait_seconds: 20
            }
        );
    }

    #[test]
    fn a_batch_at_the_payload_limit_is_invoked() {
        let batching = EventSourceBatching::new(10_000, 60).unwrap();
        assert_eq!(
            batching.next(30, INVOCATION_PAYLOAD_LIMIT, Duration::ZERO),
            Gather::Invoke
        );
    }

    #[test]
    fn an_invocation_takes_what_fits_in_its_payload_and_at_least_one_message() {
        let mib = 1024 * 1024;
        assert_eq!(fitting(&[mib; 8]), 6);
        assert_eq!(fitting(&[500; 3]), 3);
        assert_eq!(fitting(&[7 * mib, 10]), 1);
        assert_eq!(fitting(&[]), 0);
    }

    #[test]
    fn settings_aws_refuses_are_refused_naming_the_flag_the_value_and_the_range() {
        let e = EventSourceBatching::new(11, 0).unwrap_err();
        assert_eq!(e.field, "--delivery-batch-size");
        assert_eq!(e.value, "11");
        assert!(e.allowed.starts_with("1 to 10 "), "{}", e.allowed);
        let e = EventSourceBatching::new(0, 1).unwrap_err();
        assert_eq!(e.field, "--delivery-batch-size");
        assert!(e.allowed.starts_with("1 to 10000 "), "{}", e.allowed);
        let e = EventSourceBatching::new(10_001, 1).unwrap_err();
        assert_eq!(e.value, "10001");
        let e = EventSourceBatching::new(10, 301).unwrap_err();
        assert_eq!(e.field, "--delivery-batching-window-seconds");
        assert_eq!(e.value, "301");
        assert!(EventSourceBatching::new(10_000, 1).is_ok());
        assert!(EventSourceBatching::new(1, 0).is_ok());
    }
}
