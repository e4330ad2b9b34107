//! The one backoff: capped exponential with jitter, used by every retry in modelserve (a
//! reconcile's transient failure, a registry request, a mirror download) so that many objects
//! failing together do not retry in lockstep.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// How a family of retries grows: from `first`, doubling, never above `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// A reconcile's transient failures: about 1 s, 2 s, 4 s ... and never above 5 minutes.
    pub const RECONCILE: Backoff = Backoff {
        first: Duration::from_secs(1),
        cap: Duration::from_secs(300),
    };

    /// The wait before attempt `n + 1` after `n` failures (n >= 1): the exponential step
    /// [`Backoff::base`] stretched by up to 100% at random (backon's jitter). Steps stop growing
    /// at half the cap, so even failures that have reached the cap stay spread over its second
    /// half instead of retrying in lockstep.
    pub fn delay(&self, failures: u32) -> Duration {
        let step = failures.saturating_sub(1).min(63) as usize;
        ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.cap / 2)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(step)
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// The exponential step without jitter: the floor the jittered delay never goes below.
    pub fn base(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        self.first
            .checked_mul(1u32 << exp)
            .unwrap_or(self.cap)
            .min(self.cap / 2)
    }
}

/// `d` stretched by up to `fraction` at random, so periodic work of many objects spreads out
/// (a resync every 10 minutes with 0.2 lands between 10 and 12 minutes).
pub fn jittered(d: Duration, fraction: f64) -> Duration {
    let mut b = [0u8; 4];
    let r = match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / f64::from(u32::MAX),
        Err(_) => 0.5,
    };
    d.mul_f64(1.0 + fraction.clamp(0.0, 1.0) * r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_its_first_step_with_jitter_and_stays_under_its_cap() {
        let b = Backoff::RECONCILE;
        for n in [1, 2, 3, 4, 9, 40, u32::MAX] {
            let d = b.delay(n);
            assert!(d >= b.base(n), "{n}: {d:?} below {:?}", b.base(n));
            assert!(d <= b.cap, "{n}: {d:?} above the cap");
            assert!(d <= b.base(n) * 2, "{n}: {d:?} jittered more than one step");
        }
        assert_eq!(b.base(1), Duration::from_secs(1));
        assert_eq!(b.base(4), Duration::from_secs(8));
        assert_eq!(b.base(u32::MAX), Duration::from_secs(150));
    }

    #[test]
    fn jitter_spreads_failures_that_happened_together() {
        let delays: std::collections::BTreeSet<_> =
            (0..20).map(|_| Backoff::RECONCILE.delay(3)).collect();
        assert!(
            delays.len() > 1,
            "twenty retries at one instant: {delays:?}"
        );
        let r = jittered(Duration::from_secs(600), 0.2);
        assert!((600.0..=720.0).contains(&r.as_secs_f64()), "{r:?}");
    }
}
