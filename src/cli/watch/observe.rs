//! What a watch reads from the ModelServe the API server sends: the conditions of the stages in
//! pipeline order, and the mirror's numbers while it copies, with a speed measured across
//! observations. The server can send anything the schema lets through (no conditions, two of a
//! type, negative sizes, a percent of 1000), so everything here is read without trusting it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::api::ModelServeStatus;
use crate::conditions::READY;
use crate::pipeline::Stage;

/// (stage name, condition type) in pipeline order, then Ready.
pub fn condition_order() -> impl Iterator<Item = (&'static str, &'static str)> {
    Stage::ALL
        .iter()
        .map(|s| (s.name(), s.condition()))
        .chain(std::iter::once((READY, READY)))
}

/// The condition of `type_`: the first one, should the server send several.
pub fn condition<'a>(status: &'a ModelServeStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// (stage name, condition type, condition) of every stage that has one, in pipeline order, then
/// Ready; conditions of types this version does not know are left out.
pub fn conditions(
    status: &ModelServeStatus,
) -> impl Iterator<Item = (&'static str, &'static str, &Condition)> {
    condition_order().filter_map(|(stage, type_)| Some((stage, type_, condition(status, type_)?)))
}

/// The generation a status describes; a status without one describes none yet.
pub fn observed_generation(status: &ModelServeStatus) -> i64 {
    status.observed_generation.unwrap_or(0)
}

/// The mirror's numbers, as far as they make sense.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorReading {
    /// Bytes present; 0 when the server says a negative number.
    pub done: u64,
    /// Bytes of the whole set; 0 when the server says a negative number.
    pub total: u64,
    /// The server's percent, held to 0..=100.
    pub percent: u8,
}

/// The mirror's numbers while the Mirror stage runs (its condition Unknown); None before and after.
pub fn mirror_reading(status: &ModelServeStatus) -> Option<MirrorReading> {
    let mirroring = status.stage.as_deref() == Some(Stage::Mirror.name())
        && condition(status, Stage::Mirror.condition()).is_some_and(|c| c.status == "Unknown");
    let m = status.mirror.as_ref().filter(|_| mirroring)?;
    Some(MirrorReading {
        done: u64::try_from(m.bytes_done).unwrap_or(0),
        total: u64::try_from(m.bytes_total).unwrap_or(0),
        percent: clamp_percent(m.percent),
    })
}

/// A percent as a bar can draw it.
pub fn clamp_percent(percent: i32) -> u8 {
    u8::try_from(percent.clamp(0, 100)).unwrap_or(0)
}

/// Bytes per second over the last observations.
#[derive(Default)]
pub struct Speed {
    samples: VecDeque<(Instant, u64)>,
}

impl Speed {
    /// How far back the speed looks: long enough to smooth the controller's 3 s writes.
    const WINDOW: Duration = Duration::from_secs(15);
    /// Observations closer than this replace the latest one, so a server that sends updates
    /// as fast as it can does not fill the window with near-duplicates.
    const MIN_GAP: Duration = Duration::from_millis(500);
    /// The most observations kept, whatever happens.
    const MAX_SAMPLES: usize = 64;

    /// One observation of `done` bytes at `now`.
    pub fn add(&mut self, now: Instant, done: u64) {
        if self.samples.back().is_some_and(|&(_, d)| done < d) {
            // The download started over (a file failed its checksum): measure afresh.
            self.samples.clear();
        }
        // The latest observation slides forward until it stands MIN_GAP after the one before.
        if self
            .samples
            .iter()
            .nth_back(1)
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) < Self::MIN_GAP)
        {
            self.samples.pop_back();
        }
        self.samples.push_back((now, done));
        while self.samples.len() > Self::MAX_SAMPLES
            || (self.samples.len() > 2
                && self
                    .samples
                    .front()
                    .is_some_and(|&(t, _)| now.saturating_duration_since(t) > Self::WINDOW))
        {
            self.samples.pop_front();
        }
    }

    /// Bytes per second, once the observations span a second.
    pub fn rate(&self) -> Option<f64> {
        let (&(t0, d0), &(t1, d1)) = (self.samples.front()?, self.samples.back()?);
        let secs = t1.saturating_duration_since(t0).as_secs_f64();
        (secs >= 1.0).then(|| d1.saturating_sub(d0) as f64 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MirrorStatus;
    use crate::cli::watch::tests::cond;

    fn mirroring(done: i64, total: i64, percent: i32) -> ModelServeStatus {
        ModelServeStatus {
            stage: Some("Mirror".into()),
            conditions: vec![cond("Mirrored", "Unknown", "Mirroring", "copying")],
            mirror: Some(MirrorStatus {
                bytes_per_second: None,
                eta_seconds: None,
                request: None,
                bytes_done: done,
                bytes_total: total,
                percent,
                files: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_percent_of_1000_or_minus_5_is_held_to_the_bar() {
        assert_eq!(
            mirror_reading(&mirroring(5, 10, 1000)).unwrap().percent,
            100
        );
        assert_eq!(mirror_reading(&mirroring(5, 10, -5)).unwrap().percent, 0);
        assert_eq!(
            mirror_reading(&mirroring(5, 10, i32::MIN)).unwrap().percent,
            0
        );
        assert_eq!(mirror_reading(&mirroring(5, 10, 50)).unwrap().percent, 50);
    }

    #[test]
    fn negative_sizes_read_as_nothing_and_huge_ones_as_they_are() {
        let r = mirror_reading(&mirroring(-1, i64::MIN, 3)).unwrap();
        assert_eq!((r.done, r.total), (0, 0));
        let r = mirror_reading(&mirroring(i64::MAX, i64::MAX, 100)).unwrap();
        assert_eq!(r.done, i64::MAX as u64);
    }

    #[test]
    fn a_status_with_no_conditions_has_no_stage_and_no_mirror_reading() {
        let mut status = mirroring(5, 10, 50);
        status.conditions.clear();
        assert_eq!(conditions(&status).count(), 0);
        assert_eq!(mirror_reading(&status), None);
        assert_eq!(observed_generation(&ModelServeStatus::default()), 0);
    }

    #[test]
    fn unknown_and_repeated_condition_types_are_ignored() {
        let status = ModelServeStatus {
            conditions: vec![
                cond("Bogus", "True", "X", ""),
                cond("Resolved", "True", "First", ""),
                cond("Resolved", "False", "Second", ""),
            ],
            ..Default::default()
        };
        let seen: Vec<_> = conditions(&status)
            .map(|(stage, _, c)| (stage, c.reason.as_str()))
            .collect();
        assert_eq!(seen, [("Resolve", "First")]);
    }

    #[test]
    fn the_speed_keeps_a_bounded_window_however_fast_updates_come() {
        let mut s = Speed::default();
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            s.add(t0 + Duration::from_millis(i), i * 1000);
        }
        assert!(s.samples.len() <= 32, "{}", s.samples.len());
        // 1000 bytes a millisecond: a million a second.
        let rate = s.rate().unwrap();
        assert!((rate - 1e6).abs() < 1.0, "{rate}");
        let mut s = Speed::default();
        s.add(t0, 0);
        s.add(t0 + Duration::from_secs(2), 2 << 20);
        assert_eq!(s.rate(), Some((1 << 20) as f64));
        s.add(t0 + Duration::from_secs(3), 5);
        assert_eq!(s.rate(), None, "a restart measures afresh");
    }
}
