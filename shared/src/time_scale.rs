//! One factor that multiplies every wait gridrelay imposes.
//!
//! The retry ladder runs for 24 hours; tests and demos run it in seconds by setting
//! `GRIDRELAY_TIME_SCALE` (for example `0.01`). Scaled: schedule steps (R1), status minimums
//! (S5), the attempt timeout (S2), the dead-letter delay (L4), event TTLs (R5) and the four-hour
//! dead-letter limit (L5). Nothing else about behaviour changes.

use std::time::Duration;

use crate::limits::LimitError;

/// The environment variable that sets the factor.
pub const TIME_SCALE_ENV: &str = "GRIDRELAY_TIME_SCALE";

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeScale(f64);

impl Default for TimeScale {
    fn default() -> Self {
        Self::REAL
    }
}

impl TimeScale {
    /// Real time: every wait as the spec gives it.
    pub const REAL: TimeScale = TimeScale(1.0);

    /// A factor in (0, 1]: waits can be shortened, never stretched.
    pub fn new(factor: f64) -> Result<Self, LimitError> {
        if factor.is_finite() && factor > 0.0 && factor <= 1.0 {
            Ok(Self(factor))
        } else {
            Err(LimitError::new(
                TIME_SCALE_ENV,
                factor,
                "a number greater than 0 and at most 1",
            ))
        }
    }

    /// Parses the environment variable's text; unset means real time.
    pub fn parse(text: Option<&str>) -> Result<Self, LimitError> {
        match text.map(str::trim) {
            None | Some("") => Ok(Self::REAL),
            Some(t) => {
                let factor: f64 = t.parse().map_err(|_| {
                    LimitError::new(
                        TIME_SCALE_ENV,
                        format!("{t:?}"),
                        "a number greater than 0 and at most 1",
                    )
                })?;
                Self::new(factor)
            }
        }
    }

    /// Reads `GRIDRELAY_TIME_SCALE`.
    pub fn from_env() -> Result<Self, LimitError> {
        Self::parse(std::env::var(TIME_SCALE_ENV).ok().as_deref())
    }

    pub fn factor(&self) -> f64 {
        self.0
    }

    /// The wait `d` as this scale imposes it.
    pub fn apply(&self, d: Duration) -> Duration {
        d.mul_f64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_every_wait_by_the_factor() {
        let s = TimeScale::new(0.01).unwrap();
        assert_eq!(s.apply(Duration::from_secs(100)), Duration::from_secs(1));
        assert_eq!(
            TimeScale::REAL.apply(Duration::from_secs(7)),
            Duration::from_secs(7)
        );
    }

    #[test]
    fn rejects_factors_outside_zero_to_one() {
        for bad in ["0", "-1", "2", "abc", "NaN"] {
            let err = TimeScale::parse(Some(bad)).unwrap_err();
            assert_eq!(err.field, TIME_SCALE_ENV);
        }
        assert_eq!(TimeScale::parse(None).unwrap(), TimeScale::REAL);
        assert_eq!(TimeScale::parse(Some("0.5")).unwrap().factor(), 0.5);
    }
}
