//! The retry ladder (R1) with its small randomization (R2).
//!
//! Pure: the caller passes the random draw, so tests can pin it.

use std::time::Duration;

use crate::time_scale::TimeScale;

/// Waits between attempts: 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h, 6 h, then every
/// 12 h (R1).
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySchedule {
    steps: Vec<Duration>,
    repeat: Duration,
    /// R2: up to this fraction of a step is added at random...
    jitter_fraction: f64,
    /// ...but never more than this.
    jitter_cap: Duration,
}

impl Default for RetrySchedule {
    fn default() -> Self {
        Self::event_grid()
    }
}

impl RetrySchedule {
    pub fn event_grid() -> Self {
        let s = Duration::from_secs;
        Self {
            steps: vec![
                s(10),
                s(30),
                s(60),
                s(300),
                s(600),
                s(1800),
                s(3600),
                s(3 * 3600),
                s(6 * 3600),
            ],
            repeat: s(12 * 3600),
            jitter_fraction: 0.1,
            jitter_cap: s(120),
        }
    }

    /// The 2019 revision's ladder (S6, `002_*`): 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h,
    /// then hourly.
    pub fn event_grid_2019() -> Self {
        let s = Duration::from_secs;
        Self {
            steps: vec![s(10), s(30), s(60), s(300), s(600), s(1800)],
            repeat: s(3600),
            ..Self::event_grid()
        }
    }

    /// The schedule's wait after `failed_attempts` attempts have failed (1 for the first).
    pub fn step(&self, failed_attempts: u32) -> Duration {
        let index = failed_attempts.saturating_sub(1) as usize;
        self.steps.get(index).copied().unwrap_or(self.repeat)
    }

    /// The longest wait the ladder has: how far an endpoint's `Retry-After` is honoured.
    pub fn longest_step(&self) -> Duration {
        self.steps.iter().copied().fold(self.repeat, Duration::max)
    }

    /// The largest randomization added to `base` (R2).
    pub fn jitter_bound(&self, base: Duration) -> Duration {
        base.mul_f64(self.jitter_fraction).min(self.jitter_cap)
    }

    /// The wait before the next attempt: the larger of the step and the status minimum (R1, S5),
    /// plus `draw` (in [0, 1)) of the jitter bound (R2), scaled.
    pub fn next_wait(
        &self,
        failed_attempts: u32,
        status_minimum: Duration,
        draw: f64,
        scale: TimeScale,
    ) -> Duration {
        let base = self.step(failed_attempts).max(status_minimum);
        let jitter = self.jitter_bound(base).mul_f64(draw.clamp(0.0, 1.0));
        scale.apply(base + jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// R1: the ladder, then every 12 hours.
    #[test]
    fn ladder_matches_event_grid_r1() {
        let s = RetrySchedule::event_grid();
        let minutes: Vec<f64> = (1..=12).map(|n| s.step(n).as_secs_f64() / 60.0).collect();
        let expected = [
            10.0 / 60.0,
            0.5,
            1.0,
            5.0,
            10.0,
            30.0,
            60.0,
            180.0,
            360.0,
            720.0,
            720.0,
            720.0,
        ];
        assert_eq!(minutes, expected);
    }

    /// S6: the 2019 revision's ladder goes hourly after the first hour.
    #[test]
    fn ladder_2019_goes_hourly_s6() {
        let s = RetrySchedule::event_grid_2019();
        let seconds: Vec<u64> = (1..=10).map(|n| s.step(n).as_secs()).collect();
        assert_eq!(
            seconds,
            [10, 30, 60, 300, 600, 1800, 3600, 3600, 3600, 3600]
        );
        assert_eq!(s.longest_step(), Duration::from_secs(3600));
    }

    /// R1 + S5: the wait is the larger of the step and the status minimum.
    #[test]
    fn status_minimum_wins_when_larger_r1_s5() {
        let s = RetrySchedule::event_grid();
        let w = s.next_wait(1, Duration::from_secs(120), 0.0, TimeScale::REAL);
        assert_eq!(w, Duration::from_secs(120));
        let w = s.next_wait(5, Duration::from_secs(30), 0.0, TimeScale::REAL);
        assert_eq!(w, Duration::from_secs(600));
    }

    proptest! {
        /// R1, R2: randomization only adds, stays small, and scaling multiplies the result.
        #[test]
        fn jitter_adds_a_bounded_amount_r2(n in 1u32..40, min_s in 0u64..400, draw in 0.0f64..1.0) {
            let s = RetrySchedule::event_grid();
            let base = s.step(n).max(Duration::from_secs(min_s));
            let w = s.next_wait(n, Duration::from_secs(min_s), draw, TimeScale::REAL);
            prop_assert!(w >= base);
            prop_assert!(w <= base + base / 10);
            prop_assert!(w - base <= Duration::from_secs(120));
            let scaled = s.next_wait(n, Duration::from_secs(min_s), draw, TimeScale::new(0.01).unwrap());
            prop_assert!((scaled.as_secs_f64() - w.as_secs_f64() * 0.01).abs() < 1e-6);
        }

        /// R1: steps never shrink as attempts go on.
        #[test]
        fn steps_never_shrink_r1(n in 1u32..60) {
            let s = RetrySchedule::event_grid();
            prop_assert!(s.step(n + 1) >= s.step(n));
        }
    }
}
