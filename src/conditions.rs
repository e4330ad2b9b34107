//! Condition helpers with metav1.Condition semantics.
//!
//! lastTransitionTime moves only when a condition's status changes; reason, message and
//! observedGeneration follow every reconcile. Time comes from a [`Clock`] so tests can fix it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition status values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    /// The API string of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition the controller wants to be true now, before time and generation are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: Status,
    pub reason: String,
    pub message: String,
    /// Whether turning to this status reports a failure (a Warning Event): a False stage does.
    pub warning: bool,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
            warning: status == Status::False,
        }
    }
}

/// Source of the current time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that always says the same time (tests).
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub Timestamp);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        self.0
    }
}

/// A transition of one condition's status, for Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub type_: &'static str,
    pub from: Option<String>,
    pub to: Status,
    pub reason: String,
    pub message: String,
    /// Whether this transition reports a failure (published as a Warning Event).
    pub warning: bool,
}

/// Sets `desired` in `conditions` and reports a transition when its status changed (or it is new).
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: &Desired,
    generation: Option<i64>,
    clock: &dyn Clock,
) -> Option<Transition> {
    let message = truncate(&desired.message, 32 * 1024);
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let changed = existing.status != desired.status.as_str();
            let from = existing.status.clone();
            if changed {
                existing.status = desired.status.as_str().to_string();
                existing.last_transition_time = seconds(clock.now());
            }
            existing.reason = desired.reason.clone();
            existing.message = message.clone();
            existing.observed_generation = generation;
            changed.then(|| Transition {
                type_: desired.type_,
                from: Some(from),
                to: desired.status,
                reason: desired.reason.clone(),
                message,
                warning: desired.warning,
            })
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_string(),
                status: desired.status.as_str().to_string(),
                reason: desired.reason.clone(),
                message: message.clone(),
                observed_generation: generation,
                last_transition_time: seconds(clock.now()),
            });
            Some(Transition {
                type_: desired.type_,
                from: None,
                to: desired.status,
                reason: desired.reason.clone(),
                message,
                warning: desired.warning,
            })
        }
    }
}

/// Finds a condition by type.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The Ready summary: True when every stage condition is True (or the pipeline ended early on
/// purpose, such as on demand); otherwise False, naming the first stage that is not done.
pub fn ready_summary(stages: &[Desired], on_demand: Option<&str>) -> Desired {
    match stages.iter().find(|d| d.status != Status::True) {
        None => Desired::new(
            READY,
            Status::True,
            ALL_STAGES_DONE,
            "every stage is done; the model answers",
        ),
        Some(_) if on_demand.is_some() => Desired::new(
            READY,
            Status::True,
            ON_DEMAND,
            on_demand.unwrap_or_default(),
        ),
        // Ready is False all through a normal rollout; only a failed stage makes that a warning.
        Some(first) => Desired {
            warning: first.status == Status::False,
            ..Desired::new(
                READY,
                Status::False,
                first.reason.clone(),
                format!(
                    "{} is {}: {}",
                    first.type_,
                    first.status.as_str(),
                    first.message
                ),
            )
        },
    }
}

/// Type of the summary condition.
pub const READY: &str = "Ready";
/// Ready's reason when every stage is done.
pub const ALL_STAGES_DONE: &str = "AllStagesDone";
/// Ready's reason when replicas is 0 and the pipeline ended after Catalog on purpose.
pub const ON_DEMAND: &str = "OnDemand";
/// The reasons Ready has of its own (otherwise it carries the first unfinished stage's).
pub const READY_REASONS: [&str; 2] = [ALL_STAGES_DONE, ON_DEMAND];

// metav1.Time serialises whole seconds; keeping only those makes a round trip compare equal.
fn seconds(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// At most `max` bytes of `s`, cut on a char boundary, marked when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let end = (0..=max)
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}…", s.get(..end).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(second: i64) -> FixedClock {
        FixedClock(Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    fn resolved(status: Status, reason: &str) -> Desired {
        Desired::new("Resolved", status, reason, format!("{reason} message"))
    }

    #[test]
    fn a_new_condition_is_added_with_the_clock_time_and_reported_as_a_transition() {
        let mut conds = vec![];
        let t = set(
            &mut conds,
            &resolved(Status::Unknown, "Resolving"),
            Some(1),
            &clock(0),
        );
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, seconds(clock(0).0));
        assert_eq!(conds[0].observed_generation, Some(1));
        assert_eq!(t.unwrap().from, None);
    }

    #[test]
    fn transition_time_is_kept_when_the_status_does_not_change() {
        let mut conds = vec![];
        set(
            &mut conds,
            &resolved(Status::Unknown, "Resolving"),
            Some(1),
            &clock(0),
        );
        let t = set(
            &mut conds,
            &resolved(Status::Unknown, "StillResolving"),
            Some(2),
            &clock(60),
        );
        assert!(t.is_none(), "same status is not a transition");
        assert_eq!(conds[0].last_transition_time, seconds(clock(0).0));
        assert_eq!(
            conds[0].reason, "StillResolving",
            "reason follows the latest reconcile"
        );
        assert_eq!(
            conds[0].observed_generation,
            Some(2),
            "observedGeneration follows the spec"
        );
    }

    #[test]
    fn transition_time_moves_when_the_status_changes() {
        let mut conds = vec![];
        set(
            &mut conds,
            &resolved(Status::Unknown, "Resolving"),
            Some(1),
            &clock(0),
        );
        let t = set(
            &mut conds,
            &resolved(Status::True, "Resolved"),
            Some(1),
            &clock(90),
        )
        .unwrap();
        assert_eq!(conds[0].last_transition_time, seconds(clock(90).0));
        assert_eq!(t.from.as_deref(), Some("Unknown"));
        assert_eq!(t.to, Status::True);
    }

    #[test]
    fn ready_is_true_only_when_every_stage_is() {
        let all = vec![
            resolved(Status::True, "Ok"),
            Desired::new("Checked", Status::True, "Ok", "ok"),
        ];
        assert_eq!(ready_summary(&all, None).status, Status::True);
        let some = vec![
            resolved(Status::True, "Ok"),
            Desired::new("Checked", Status::False, "NoNodeFits", "too big"),
        ];
        let r = ready_summary(&some, None);
        assert_eq!(r.status, Status::False);
        assert_eq!(
            r.reason, "NoNodeFits",
            "Ready carries the blocking stage's reason"
        );
        assert!(
            r.message.contains("Checked is False: too big"),
            "{}",
            r.message
        );
    }

    #[test]
    fn ready_is_true_with_reason_on_demand_when_replicas_is_zero() {
        let stages = vec![
            resolved(Status::True, "Ok"),
            Desired::new("Placed", Status::Unknown, "OnDemand", "0 replicas"),
        ];
        let r = ready_summary(&stages, Some("cataloged; scale up to start"));
        assert_eq!((r.status, r.reason.as_str()), (Status::True, "OnDemand"));
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let long = "é".repeat(40_000);
        let mut conds = vec![];
        set(
            &mut conds,
            &Desired::new("Resolved", Status::False, "X", long),
            None,
            &clock(0),
        );
        assert!(conds[0].message.len() <= 32 * 1024 + 3);
    }
}
