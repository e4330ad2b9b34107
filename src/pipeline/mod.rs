//! The six stages in order. Each reconcile runs them from the top and stops at the first one
//! that is not done; a done stage is cheap to run again because every stage is idempotent.

pub mod catalog;
pub mod check;
pub mod mirror;
pub mod place;
pub mod resolve;
pub mod smoke;

use std::time::Duration;

use crate::api::{ModelServe, ModelServeStatus};
use crate::conditions::{Desired, Status};
use crate::controller::Context;

/// The stages of DESIGN.md, in pipeline order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Resolve,
    Check,
    Mirror,
    Catalog,
    Place,
    SmokeTest,
}

impl Stage {
    /// Every stage, in the order they run.
    pub const ALL: [Stage; 6] = [
        Stage::Resolve,
        Stage::Check,
        Stage::Mirror,
        Stage::Catalog,
        Stage::Place,
        Stage::SmokeTest,
    ];

    /// The stage's name as written in status.stage.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Resolve => "Resolve",
            Stage::Check => "Check",
            Stage::Mirror => "Mirror",
            Stage::Catalog => "Catalog",
            Stage::Place => "Place",
            Stage::SmokeTest => "SmokeTest",
        }
    }

    /// The type of the condition this stage owns.
    pub fn condition(self) -> &'static str {
        match self {
            Stage::Resolve => "Resolved",
            Stage::Check => "Checked",
            Stage::Mirror => "Mirrored",
            Stage::Catalog => "Cataloged",
            Stage::Place => "Placed",
            Stage::SmokeTest => "SmokeTested",
        }
    }
}

/// How one stage ended in this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The stage holds; the pipeline moves on.
    Done { reason: String, message: String },
    /// In progress; look again after `after`.
    Waiting {
        reason: String,
        message: String,
        after: Duration,
    },
    /// Cannot succeed as things are: until the spec changes (`retry: None`), or until something
    /// outside the spec changes, looked at again after `retry`.
    Failed {
        reason: String,
        message: String,
        retry: Option<Duration>,
    },
    /// Not built yet: said plainly rather than pretended.
    NotImplemented,
}

impl Outcome {
    fn condition(&self, stage: Stage) -> Desired {
        let c = stage.condition();
        match self {
            Outcome::Done { reason, message } => Desired::new(c, Status::True, reason, message),
            Outcome::Waiting {
                reason, message, ..
            } => Desired::new(c, Status::Unknown, reason, message),
            Outcome::Failed {
                reason, message, ..
            } => Desired::new(c, Status::False, reason, message),
            Outcome::NotImplemented => Desired::new(
                c,
                Status::Unknown,
                "NotImplemented",
                format!(
                    "the {} stage is not built yet in this modelserve version; the pipeline stops here",
                    stage.name()
                ),
            ),
        }
    }
}

/// What one pass of the pipeline decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The stage now running or failed; None when every stage is done.
    pub stage: Option<Stage>,
    /// One desired condition per stage, in pipeline order.
    pub conditions: Vec<Desired>,
    /// Set when replicas is 0 and the pipeline stopped after Catalog on purpose.
    pub on_demand: Option<String>,
    /// When to look again, if a stage is waiting.
    pub requeue: Option<Duration>,
}

/// Runs the stages in order, letting each write its part of `status`.
pub async fn run(
    ctx: &Context,
    ms: &ModelServe,
    status: &mut ModelServeStatus,
) -> Result<Report, crate::Error> {
    let mut outcomes = Vec::with_capacity(Stage::ALL.len());
    for stage in Stage::ALL {
        if stage == Stage::Place && ms.spec.replicas == 0 {
            // No replica runs on demand: what an earlier one was and answered is history.
            status.placement = None;
            status.smoke = None;
            break;
        }
        let outcome = run_stage(stage, ctx, ms, status).await?;
        let done = matches!(outcome, Outcome::Done { .. });
        outcomes.push((stage, outcome));
        if !done {
            break;
        }
    }
    Ok(decide(&outcomes, ms.spec.replicas))
}

async fn run_stage(
    stage: Stage,
    ctx: &Context,
    ms: &ModelServe,
    status: &mut ModelServeStatus,
) -> Result<Outcome, crate::Error> {
    Ok(match stage {
        Stage::Resolve => resolve::run(ctx, ms, &mut status.resolved).await,
        // Later stages read what Resolve wrote in this same pass, not the object's old status.
        Stage::Check => match status.resolved.clone() {
            Some(r) => check::run(ctx, ms, &r, &mut status.check).await,
            None => not_resolved(),
        },
        Stage::Mirror => match status.resolved.clone() {
            Some(r) => mirror::run(ctx, ms, &r, &mut status.mirror, &mut status.progress).await,
            None => not_resolved(),
        },
        Stage::Catalog => catalog::run(ctx, ms, status).await,
        Stage::Place => place::run(ctx, ms, status).await,
        Stage::SmokeTest => smoke::run(ctx, ms, status).await,
    })
}

fn not_resolved() -> Outcome {
    Outcome::Waiting {
        reason: "WaitingForResolve".into(),
        message: "nothing is resolved yet".into(),
        after: std::time::Duration::from_secs(5),
    }
}

/// The pure decision: conditions for every stage from the outcomes of those that ran.
pub fn decide(outcomes: &[(Stage, Outcome)], replicas: i32) -> Report {
    let mut conditions = Vec::with_capacity(Stage::ALL.len());
    let mut stage = None;
    let mut requeue = None;
    for (s, outcome) in outcomes {
        conditions.push(outcome.condition(*s));
        if !matches!(outcome, Outcome::Done { .. }) {
            stage = Some(*s);
            requeue = match outcome {
                Outcome::Waiting { after, .. } => Some(*after),
                Outcome::Failed { retry, .. } => *retry,
                _ => None,
            };
        }
    }
    let ran_to_catalog = outcomes.len() == 4 && stage.is_none();
    let on_demand = (replicas == 0 && ran_to_catalog).then(|| {
        "replicas is 0: the model is cataloged and starts on the next scale-up".to_string()
    });
    for s in Stage::ALL.iter().skip(outcomes.len()) {
        conditions.push(match &on_demand {
            Some(msg) => Desired::new(s.condition(), Status::Unknown, "OnDemand", msg.clone()),
            None => Desired::new(
                s.condition(),
                Status::Unknown,
                "WaitingForEarlierStage",
                format!(
                    "waits for the {} stage",
                    stage.map_or("previous", Stage::name)
                ),
            ),
        });
    }
    Report {
        stage,
        conditions,
        on_demand,
        requeue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done() -> Outcome {
        Outcome::Done {
            reason: "Ok".into(),
            message: "ok".into(),
        }
    }

    #[test]
    fn a_stage_not_built_is_reported_unknown_and_later_stages_wait() {
        let r = decide(&[(Stage::Resolve, Outcome::NotImplemented)], 1);
        assert_eq!(r.stage, Some(Stage::Resolve));
        assert_eq!(r.conditions.len(), 6);
        assert_eq!(
            (r.conditions[0].status, r.conditions[0].reason.as_str()),
            (Status::Unknown, "NotImplemented")
        );
        assert!(
            r.conditions[1..]
                .iter()
                .all(|c| c.reason == "WaitingForEarlierStage" && c.status == Status::Unknown)
        );
        assert_eq!(
            r.conditions.iter().map(|c| c.type_).collect::<Vec<_>>(),
            Stage::ALL.map(Stage::condition)
        );
    }

    #[test]
    fn a_permanent_failure_is_false_and_names_the_stage() {
        let f = Outcome::Failed {
            reason: "RepoNotFound".into(),
            message: "no such repo".into(),
            retry: None,
        };
        let r = decide(&[(Stage::Resolve, f)], 1);
        assert_eq!(r.conditions[0].status, Status::False);
        assert_eq!(r.stage, Some(Stage::Resolve));
        assert_eq!(
            r.requeue, None,
            "a permanent failure waits for a spec change"
        );
    }

    #[test]
    fn waiting_requeues_after_the_stage_asks() {
        let w = Outcome::Waiting {
            reason: "Downloading".into(),
            message: "41%".into(),
            after: Duration::from_secs(5),
        };
        let r = decide(
            &[
                (Stage::Resolve, done()),
                (Stage::Check, done()),
                (Stage::Mirror, w),
            ],
            1,
        );
        assert_eq!(r.stage, Some(Stage::Mirror));
        assert_eq!(r.requeue, Some(Duration::from_secs(5)));
    }

    #[test]
    fn zero_replicas_stops_after_catalog_on_demand() {
        let outcomes: Vec<_> = Stage::ALL[..4].iter().map(|s| (*s, done())).collect();
        let r = decide(&outcomes, 0);
        assert_eq!(r.stage, None);
        assert!(r.on_demand.is_some());
        assert_eq!(r.conditions[4].reason, "OnDemand");
        assert_eq!(r.conditions[5].reason, "OnDemand");
    }

    #[test]
    fn all_done_has_no_current_stage() {
        let outcomes: Vec<_> = Stage::ALL.iter().map(|s| (*s, done())).collect();
        let r = decide(&outcomes, 1);
        assert_eq!(r.stage, None);
        assert!(r.conditions.iter().all(|c| c.status == Status::True));
    }
}
