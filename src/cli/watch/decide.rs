//! What a watch decides about successive snapshots of one ModelServe: which condition changes
//! are worth a line, where the mirror stands, and whether the watch is over.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::api::{ModelServe, ModelServeStatus};
use crate::cli::watch::observe::{self, Speed};
use crate::conditions::READY;

/// One condition that changed status or reason, as the server wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLine {
    pub stage: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Where the mirror stands, with a speed measured from successive observations.
#[derive(Clone, Debug, PartialEq)]
pub struct MirrorProgress {
    pub done: u64,
    pub total: u64,
    /// 0 to 100, whatever the server said.
    pub percent: u8,
    pub bytes_per_second: Option<f64>,
}

/// How the watch ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every stage is done and the model answers.
    Ready,
    /// replicas is 0: cataloged, started by a later scale-up.
    OnDemand { message: String },
    /// A stage's condition is False: it waits for a change of spec (or of the cluster).
    Failed {
        stage: String,
        reason: String,
        message: String,
    },
}

/// What one observation changed, in the order to show it.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    Stage(StageLine),
    Mirror(MirrorProgress),
    Finished(Verdict),
}

/// Turns successive snapshots of one ModelServe into updates.
pub struct Follower {
    /// The spec generation the caller cares about; older statuses describe another spec.
    generation: i64,
    /// (status, reason) last shown per condition type; the keys are the known types only.
    seen: BTreeMap<&'static str, (String, String)>,
    speed: Speed,
}

impl Follower {
    /// Follows the status written for `generation` (the one the caller applied) or later.
    pub fn new(generation: i64) -> Follower {
        Follower {
            generation,
            seen: BTreeMap::new(),
            speed: Speed::default(),
        }
    }

    /// The updates since the previous snapshot.
    pub fn observe(&mut self, ms: &ModelServe, now: Instant) -> Vec<Update> {
        let Some(status) = &ms.status else {
            return vec![];
        };
        if observe::observed_generation(status) < self.generation {
            return vec![];
        }
        let mut updates = Vec::new();
        for (stage, type_, c) in observe::conditions(status) {
            let unchanged = self
                .seen
                .get(type_)
                .is_some_and(|(s, r)| *s == c.status && *r == c.reason);
            if unchanged {
                continue;
            }
            self.seen
                .insert(type_, (c.status.clone(), c.reason.clone()));
            if !is_noise(type_, &c.status, &c.reason) {
                updates.push(Update::Stage(StageLine {
                    stage: stage.to_string(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                }));
            }
        }
        if let Some(m) = observe::mirror_reading(status) {
            self.speed.add(now, m.done);
            updates.push(Update::Mirror(MirrorProgress {
                done: m.done,
                total: m.total,
                percent: m.percent,
                bytes_per_second: self.speed.rate(),
            }));
        }
        if let Some(v) = verdict(status) {
            updates.push(Update::Finished(v));
        }
        updates
    }
}

/// Waiting stages and a not-yet-Ready summary repeat what the current stage says.
fn is_noise(type_: &str, status: &str, reason: &str) -> bool {
    reason == "WaitingForEarlierStage"
        || (type_ != READY && reason == "OnDemand")
        || (type_ == READY && status != "True")
}

/// The verdict a status gives, if the watch is over.
pub fn verdict(status: &ModelServeStatus) -> Option<Verdict> {
    if let Some(ready) = observe::condition(status, READY).filter(|c| c.status == "True") {
        return Some(if ready.reason == "OnDemand" {
            Verdict::OnDemand {
                message: ready.message.clone(),
            }
        } else {
            Verdict::Ready
        });
    }
    for (stage, type_, c) in observe::conditions(status) {
        // A failure the operator retries by itself is shown and followed, not the end.
        if c.status == "False" && type_ != READY && !crate::pipeline::reasons::retried(&c.reason) {
            return Some(Verdict::Failed {
                stage: stage.to_string(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::MirrorStatus;
    use crate::cli::watch::tests::{cond, model};

    fn lines(updates: &[Update]) -> Vec<String> {
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Stage(l) => Some(format!("{} {} {}", l.stage, l.status, l.reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn each_transition_is_one_line_in_pipeline_order_and_waiting_stages_are_quiet() {
        let mut f = Follower::new(1);
        let t = Instant::now();
        let u = f.observe(&model(1, "Resolve", &[("Unknown", "Resolving")]), t);
        assert_eq!(lines(&u), ["Resolve Unknown Resolving"]);
        let mirroring = model(
            1,
            "Mirror",
            &[
                ("True", "Resolved"),
                ("True", "Checked"),
                ("Unknown", "Mirroring"),
            ],
        );
        let u = f.observe(&mirroring, t);
        assert_eq!(
            lines(&u),
            [
                "Resolve True Resolved",
                "Check True Checked",
                "Mirror Unknown Mirroring"
            ]
        );
        let again = f.observe(&mirroring, t);
        assert!(lines(&again).is_empty(), "nothing changed: {again:?}");
    }

    #[test]
    fn a_status_of_an_older_generation_is_not_reported() {
        let mut f = Follower::new(2);
        let old = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        assert!(
            f.observe(&old, Instant::now()).is_empty(),
            "the failure belongs to the spec before this apply"
        );
        let new = model(2, "Resolve", &[("True", "Resolved")]);
        assert_eq!(
            lines(&f.observe(&new, Instant::now())),
            ["Resolve True Resolved"]
        );
    }

    #[test]
    fn a_status_with_no_conditions_gives_no_line_and_no_verdict() {
        let mut ms = model(1, "Resolve", &[]);
        let status = ms.status.as_mut().unwrap();
        status.conditions.clear();
        status.stage = None;
        assert_eq!(verdict(status), None);
        let mut f = Follower::new(1);
        assert!(f.observe(&ms, Instant::now()).is_empty());
        ms.status = None;
        assert!(f.observe(&ms, Instant::now()).is_empty());
    }

    #[test]
    fn a_false_stage_ends_the_watch_with_its_message() {
        let ms = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        assert_eq!(
            verdict(ms.status.as_ref().unwrap()),
            Some(Verdict::Failed {
                stage: "Resolve".into(),
                reason: "NoMatchingQuant".into(),
                message: "Resolve NoMatchingQuant".into()
            })
        );
    }

    #[test]
    fn ready_true_ends_the_watch_and_on_demand_is_told_apart() {
        let mut ms = model(1, "Ready", &[("True", "Ok"); 6]);
        let st = ms.status.as_mut().unwrap();
        st.conditions[6] = cond(READY, "True", "AllStagesDone", "done");
        assert_eq!(verdict(st), Some(Verdict::Ready));
        st.conditions[6] = cond(READY, "True", "OnDemand", "replicas is 0");
        assert_eq!(
            verdict(st),
            Some(Verdict::OnDemand {
                message: "replicas is 0".into()
            })
        );
    }

    #[test]
    fn a_failure_the_operator_retries_is_followed_and_one_it_does_not_ends_the_watch() {
        let ms = model(
            1,
            "Mirror",
            &[("True", "a"), ("True", "b"), ("False", "MirrorUnavailable")],
        );
        assert_eq!(verdict(ms.status.as_ref().unwrap()), None);
        let ms = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        assert!(matches!(
            verdict(ms.status.as_ref().unwrap()),
            Some(Verdict::Failed { reason, .. }) if reason == "NoMatchingQuant"
        ));
    }

    #[test]
    fn a_waiting_stage_is_not_a_verdict() {
        let ms = model(
            1,
            "Mirror",
            &[("True", "a"), ("True", "b"), ("Unknown", "Mirroring")],
        );
        assert_eq!(verdict(ms.status.as_ref().unwrap()), None);
    }

    /// The mirror progress of one observation of `done` bytes of 10 MiB, with `percent` as sent.
    fn progress_at(f: &mut Follower, done: i64, percent: i32, at: Instant) -> MirrorProgress {
        let mut ms = model(
            1,
            "Mirror",
            &[("True", "a"), ("True", "b"), ("Unknown", "Mirroring")],
        );
        ms.status.as_mut().unwrap().mirror = Some(MirrorStatus {
            bytes_per_second: None,
            eta_seconds: None,
            request: None,
            bytes_done: done,
            bytes_total: 10 << 20,
            percent,
            files: vec![],
        });
        f.observe(&ms, at)
            .into_iter()
            .find_map(|u| match u {
                Update::Mirror(p) => Some(p),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn mirror_progress_gets_a_speed_from_successive_observations() {
        let mut f = Follower::new(1);
        let t0 = Instant::now();
        let first = progress_at(&mut f, 0, 0, t0);
        assert_eq!(first.bytes_per_second, None, "one observation has no speed");
        let p = progress_at(&mut f, 2 << 20, 20, t0 + Duration::from_secs(2));
        assert_eq!(p.bytes_per_second, Some((1 << 20) as f64));
        assert_eq!(p.percent, 20);
    }

    #[test]
    fn an_absurd_percent_is_held_to_0_through_100() {
        let mut f = Follower::new(1);
        let t0 = Instant::now();
        assert_eq!(progress_at(&mut f, 1, 1000, t0).percent, 100);
        assert_eq!(progress_at(&mut f, 2, -5, t0).percent, 0);
    }
}
