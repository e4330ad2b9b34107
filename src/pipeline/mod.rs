//! The six stages in order. Each reconcile runs them from the top and stops at the first one
//! that is not done; a done stage is cheap to run again because every stage is idempotent.

pub mod cache;
pub mod catalog;
pub mod check;
pub mod env;
pub mod mirror;
pub mod offloaded;
pub mod outcome;
pub mod place;
pub mod reasons;
pub mod resolve;
pub mod smoke;
pub mod token;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;

use crate::api::{ModelServe, ModelServeStatus};
use crate::conditions::{Desired, Status};
use crate::names::served_name_of;
pub use env::Env;
pub use outcome::{Failure, Outcome, Progress, Recovery, RunFailure};

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

impl Outcome {
    fn condition(&self, stage: Stage) -> Desired {
        let status = match self {
            Outcome::Done { .. } => Status::True,
            Outcome::Waiting { .. } => Status::Unknown,
            Outcome::Failed { .. } => Status::False,
        };
        Desired::new(stage.condition(), status, self.reason(), self.message())
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
    /// When to look again, if a stage is waiting or heals by itself.
    pub requeue: Option<Duration>,
    /// Set when a stage failed transiently: the controller's backoff decides when to retry,
    /// never sooner than this.
    pub transient: Option<Duration>,
}

/// Runs the stages in order, letting each write its part of `status`. A stage that panics or
/// runs past `settings.stage_timeout` fails this object only, as its own condition.
pub async fn run(env: &Env, ms: &ModelServe, status: &mut ModelServeStatus) -> Report {
    let mut outcomes = Vec::with_capacity(Stage::ALL.len());
    for stage in Stage::ALL {
        if stage == Stage::Place && ms.spec.replicas == 0 {
            // No replica runs on demand: what an earlier one was and answered is history.
            status.placement = None;
            status.smoke = None;
            break;
        }
        let outcome = guarded(
            stage,
            env.settings.stage_timeout,
            run_stage(stage, env, ms, status),
        )
        .await;
        let done = outcome.is_done();
        outcomes.push((stage, outcome));
        if !done {
            break;
        }
    }
    // The served name follows the spec, resolved or not again.
    if let Some(r) = status.resolved.as_mut() {
        r.served_name = served_name_of(&ms.spec);
    }
    let mut report = decide(&outcomes, ms.spec.replicas);
    if ms.spec.on_demand.is_some()
        && let Some(m) = report.on_demand.as_mut()
    {
        *m = ON_DEMAND_BY_GATEWAY.to_string();
    }
    report
}

/// The Ready message of an on-demand model at 0 replicas.
pub const ON_DEMAND_BY_GATEWAY: &str =
    "replicas is 0: on demand, the gateway loads the model on its first request";

/// Runs one stage so that a panic or a stage that will not end becomes its failed condition.
pub async fn guarded(stage: Stage, limit: Duration, run: impl Future<Output = Outcome>) -> Outcome {
    match tokio::time::timeout(limit, AssertUnwindSafe(run).catch_unwind()).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => {
            let message = outcome::panic_message(panic.as_ref());
            tracing::error!(stage = stage.name(), %message, "a stage panicked; only this ModelServe is affected");
            Outcome::failed(&RunFailure::InternalError {
                stage: stage.name(),
                message,
            })
        }
        Err(_) => Outcome::failed(&RunFailure::StageTimeout {
            stage: stage.name(),
            limit: limit.as_secs(),
        }),
    }
}

async fn run_stage(
    stage: Stage,
    env: &Env,
    ms: &ModelServe,
    status: &mut ModelServeStatus,
) -> Outcome {
    match stage {
        Stage::Resolve => resolve::run(env, ms, &mut status.resolved).await,
        // Later stages read what Resolve wrote in this same pass, not the object's old status.
        Stage::Check => match status.resolved.clone() {
            Some(r) => check::run(env, ms, &r, &mut status.check).await,
            None => not_resolved(),
        },
        Stage::Mirror => match status.resolved.clone() {
            Some(r) => mirror::run(env, ms, &r, &mut status.mirror, &mut status.progress).await,
            None => not_resolved(),
        },
        Stage::Catalog => catalog::run(env, ms, status).await,
        Stage::Place => place::run(env, ms, status).await,
        Stage::SmokeTest => smoke::run(env, ms, status).await,
    }
}

fn not_resolved() -> Outcome {
    Outcome::waiting(
        Progress::WaitingForResolve,
        "nothing is resolved yet",
        Duration::from_secs(5),
    )
}

/// The pure decision: conditions for every stage from the outcomes of those that ran.
pub fn decide(outcomes: &[(Stage, Outcome)], replicas: i32) -> Report {
    let mut conditions = Vec::with_capacity(Stage::ALL.len());
    let mut stage = None;
    let mut requeue = None;
    let mut transient = None;
    for (s, outcome) in outcomes {
        conditions.push(outcome.condition(*s));
        match outcome {
            Outcome::Done { .. } => continue,
            Outcome::Waiting { after, .. } => requeue = Some(*after),
            Outcome::Failed { recovery, .. } => match recovery {
                Recovery::Transient { at_least } => transient = Some(*at_least),
                Recovery::Heals(after) => requeue = Some(*after),
                Recovery::SpecChange => {}
            },
        }
        stage = Some(*s);
    }
    let ran_to_catalog = outcomes.len() == 4 && stage.is_none();
    let on_demand = (replicas == 0 && ran_to_catalog).then(|| {
        "replicas is 0: the model is cataloged and starts on the next scale-up".to_string()
    });
    for s in Stage::ALL.iter().skip(outcomes.len()) {
        let (reason, message) = match &on_demand {
            Some(msg) => (Progress::OnDemand, msg.clone()),
            None => (
                Progress::WaitingForEarlierStage,
                format!(
                    "waits for the {} stage",
                    stage.map_or("previous", Stage::name)
                ),
            ),
        };
        conditions.push(Desired::new(
            s.condition(),
            Status::Unknown,
            reason.reason(),
            message,
        ));
    }
    Report {
        stage,
        conditions,
        on_demand,
        requeue,
        transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done() -> Outcome {
        Outcome::done(Progress::Resolved, "ok")
    }

    #[test]
    fn later_stages_wait_for_the_first_one_not_done() {
        let w = Outcome::waiting(Progress::Mirroring, "41%", Duration::from_secs(5));
        let r = decide(
            &[
                (Stage::Resolve, done()),
                (Stage::Check, done()),
                (Stage::Mirror, w),
            ],
            1,
        );
        assert_eq!(r.conditions.len(), 6);
        assert_eq!(
            (r.conditions[2].status, r.conditions[2].reason.as_str()),
            (Status::Unknown, "Mirroring")
        );
        assert!(
            r.conditions[3..]
                .iter()
                .all(|c| c.reason == "WaitingForEarlierStage" && c.status == Status::Unknown)
        );
        assert_eq!(
            r.conditions.iter().map(|c| c.type_).collect::<Vec<_>>(),
            Stage::ALL.map(Stage::condition)
        );
        assert_eq!(r.stage, Some(Stage::Mirror));
        assert_eq!(r.requeue, Some(Duration::from_secs(5)));
    }

    fn failed(recovery: Recovery) -> Outcome {
        Outcome::Failed {
            reason: "RepoNotFound".into(),
            message: "no such repo".into(),
            recovery,
        }
    }

    #[test]
    fn a_permanent_failure_is_false_and_waits_for_a_spec_change() {
        let r = decide(&[(Stage::Resolve, failed(Recovery::SpecChange))], 1);
        assert_eq!(r.conditions[0].status, Status::False);
        assert_eq!(r.stage, Some(Stage::Resolve));
        assert_eq!((r.requeue, r.transient), (None, None));
    }

    #[test]
    fn a_transient_failure_is_left_to_the_backoff_and_one_that_heals_is_looked_at_later() {
        let r = decide(&[(Stage::Resolve, failed(Recovery::TRANSIENT))], 1);
        assert_eq!((r.requeue, r.transient), (None, Some(Duration::ZERO)));
        let r = decide(
            &[(
                Stage::Resolve,
                failed(Recovery::Heals(Duration::from_secs(30))),
            )],
            1,
        );
        assert_eq!(
            (r.requeue, r.transient),
            (Some(Duration::from_secs(30)), None)
        );
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

    #[tokio::test]
    async fn a_stage_that_panics_fails_as_internal_error_with_the_panic_message() {
        let o = guarded(Stage::Check, Duration::from_secs(5), async {
            let name = "xéé";
            // A byte index inside a character, as the selection once did.
            let cut = name
                .get(..2)
                .map(str::len)
                .unwrap_or_else(|| panic!("byte index 2 is not a char boundary"));
            Outcome::done(Progress::Checked, format!("{cut}"))
        })
        .await;
        assert_eq!(o.reason(), "InternalError");
        assert!(o.message().contains("char boundary"), "{}", o.message());
        assert!(o.message().contains("the Check stage"), "{}", o.message());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_never_ends_is_stopped_at_the_limit() {
        let o = guarded(
            Stage::Resolve,
            Duration::from_secs(300),
            std::future::pending(),
        )
        .await;
        assert_eq!(o.reason(), "StageTimeout");
        assert!(o.message().contains("300s"), "{}", o.message());
    }
}
