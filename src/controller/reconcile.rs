//! One reconcile: run the pipeline, decide the next status, write it once when it changed, and
//! publish an Event per condition transition. Transient failures of any stage share one backoff
//! (capped exponential with jitter); every other requeue carries jitter too, so objects that
//! failed or settled together do not come back together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::{Instrument, warn};

use super::Context;
use crate::Error;
use crate::api::{ModelServe, ModelServeStatus};
use crate::conditions::{self, Clock, Status, Transition};
use crate::names::FIELD_MANAGER;
use crate::pipeline::{self, Report};
use crate::retry::{Backoff, jittered};
use crate::telemetry::{ReasonLabel, ResultLabel, RetryLabel, StageLabel};
use crate::units::human_duration;

/// Jitter on requeues the stages ask for, and on the idle resync.
const REQUEUE_JITTER: f64 = 0.1;
const RESYNC_JITTER: f64 = 0.2;

pub async fn reconcile(ms: Arc<ModelServe>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!("reconcile", namespace = %ms.namespace().unwrap_or_default(), name = %ms.name_any());
    let _running = ctx.watchdog.start();
    let started = Instant::now();
    // Decide from the whole picture: the first reconciles wait for the caches to list once.
    ctx.env.cache.wait_until_synced().await;
    let result = reconcile_inner(&ms, &ctx).instrument(span).await;
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().as_secs_f64());
    let label = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabel {
            result: label.into(),
        })
        .inc();
    result
}

async fn reconcile_inner(ms: &ModelServe, ctx: &Context) -> Result<Action, Error> {
    let old = ms.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let mut report = pipeline::run(&ctx.env, ms, &mut status).await;
    let retry = retry_after(ctx, ms, &mut report);
    let (status, transitions) = next_status(status, &report, ms, ctx.env.clock.as_ref());
    if status != old && !ctx.written.already_sent(ms, &status) {
        write_status(ctx, ms, &status).await?;
        ctx.written.sent(ms, &status);
    }
    for t in &transitions {
        if t.to == Status::True {
            if let Some(secs) = stage_seconds(ms, &status, t.type_, ctx.env.clock.as_ref()) {
                ctx.metrics
                    .stage_seconds
                    .get_or_create(&StageLabel {
                        stage: t.type_.into(),
                    })
                    .observe(secs);
            }
            if t.type_ == pipeline::Stage::SmokeTest.condition() {
                ctx.metrics.smoke_tokens_per_second(
                    status.smoke.as_ref().and_then(|s| s.tokens_per_second),
                );
            }
        }
    }
    // The Events of one reconcile are written at once; a microsecond apart, they still sort in
    // pipeline order.
    let now = k8s_openapi::jiff::Timestamp::now();
    futures::future::join_all(transitions.iter().enumerate().map(|(i, t)| {
        let at = now
            .checked_add(k8s_openapi::jiff::SignedDuration::from_micros(i as i64))
            .unwrap_or(now);
        publish(ctx, ms, t, at)
    }))
    .await;
    // Only a reconcile that went through without a transient failure ends the backoff; one
    // whose status write failed keeps climbing it (error_policy).
    if report.transient.is_none() {
        ctx.reset(&ObjectRef::from(ms));
    }
    Ok(Action::requeue(
        retry.unwrap_or_else(|| jittered(ctx.resync, RESYNC_JITTER)),
    ))
}

/// When to look again. A transient failure takes the next step of the object's backoff, and
/// its condition says when; anything else takes what the stage asked for, jittered. None:
/// nothing to do but the idle resync.
fn retry_after(ctx: &Context, ms: &ModelServe, report: &mut Report) -> Option<Duration> {
    let Some(at_least) = report.transient else {
        return report.requeue.map(|d| jittered(d, REQUEUE_JITTER));
    };
    let n = ctx.bump(ObjectRef::from(ms));
    let wait = Backoff::RECONCILE.delay(n).max(at_least);
    if let Some(stage) = report.stage
        && let Some(c) = report
            .conditions
            .iter_mut()
            .find(|c| c.type_ == stage.condition())
    {
        ctx.metrics
            .retries
            .get_or_create(&RetryLabel {
                stage: stage.name().into(),
                reason: c.reason.clone(),
            })
            .inc();
        c.message = format!(
            "{}; trying again in {} (attempt {n})",
            c.message,
            human_duration(wait.max(Duration::from_secs(1)))
        );
    }
    Some(wait)
}

/// How long the stage owning condition `type_` took, as it turns True now: from the moment the
/// previous stage turned True (or the object was created, for the first stage).
fn stage_seconds(
    ms: &ModelServe,
    status: &ModelServeStatus,
    type_: &str,
    clock: &dyn Clock,
) -> Option<f64> {
    let i = pipeline::Stage::ALL
        .iter()
        .position(|s| s.condition() == type_)?;
    let start = match i {
        0 => ms.metadata.creation_timestamp.clone()?.0,
        _ => {
            let prev = pipeline::Stage::ALL[i - 1].condition();
            let c = status.conditions.iter().find(|c| c.type_ == prev)?;
            (c.status == "True").then_some(c.last_transition_time.0)?
        }
    };
    let secs = clock.now().duration_since(start).as_secs_f64();
    (secs >= 0.0).then_some(secs)
}

/// The status after this reconcile, and the condition transitions it makes.
pub fn next_status(
    mut status: ModelServeStatus,
    report: &Report,
    ms: &ModelServe,
    clock: &dyn Clock,
) -> (ModelServeStatus, Vec<Transition>) {
    let generation = ms.metadata.generation;
    let mut transitions = Vec::new();
    let ready = conditions::ready_summary(&report.conditions, report.on_demand.as_deref());
    for desired in report.conditions.iter().chain(std::iter::once(&ready)) {
        let t = conditions::set(&mut status.conditions, desired, generation, clock);
        // A stage that first appears still waiting is no news; its first True or False is.
        transitions.extend(t.filter(|t| t.from.is_some() || t.to != Status::Unknown));
    }
    status.observed_generation = generation;
    status.stage = Some(
        report
            .stage
            .map_or(
                if report.on_demand.is_some() {
                    "OnDemand"
                } else {
                    "Ready"
                },
                |s| s.name(),
            )
            .to_string(),
    );
    status.ready = Some(format!("{}/{}", status.ready_replicas, ms.spec.replicas));
    (status, transitions)
}

async fn write_status(
    ctx: &Context,
    ms: &ModelServe,
    status: &ModelServeStatus,
) -> Result<(), Error> {
    let api: Api<ModelServe> =
        Api::namespaced(ctx.env.client.clone(), &ms.namespace().unwrap_or_default());
    // status.demand is the gateway's: left out of the apply, it stays the gateway's field, and a
    // stale copy read here never overwrites a newer request time.
    let status = ModelServeStatus {
        demand: None,
        ..status.clone()
    };
    let patch = serde_json::json!({
        "apiVersion": ModelServe::api_version(&()),
        "kind": ModelServe::kind(&()),
        "status": status,
    });
    api.patch_status(
        &ms.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn publish(ctx: &Context, ms: &ModelServe, t: &Transition, at: k8s_openapi::jiff::Timestamp) {
    ctx.metrics
        .transitions
        .get_or_create(&StageLabel {
            stage: t.type_.into(),
        })
        .inc();
    // An Event that cannot be written must not fail the reconcile that already wrote status.
    if let Err(e) = ctx.events.publish(&ms.object_ref(&()), t, at).await {
        warn!(error = %e, "could not publish Event");
    }
}

/// A reconcile that could not write its status (the API server refused or failed): the same
/// backoff as a stage's transient failure.
pub fn error_policy(ms: Arc<ModelServe>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&ReasonLabel {
            reason: error.reason().into(),
        })
        .inc();
    let n = ctx.bump(ObjectRef::from(ms.as_ref()));
    let wait = Backoff::RECONCILE.delay(n);
    warn!(name = %ms.name_any(), reason = error.reason(), error = %error, attempt = n, "reconcile failed; retrying in {}", human_duration(wait));
    Action::requeue(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelServeSpec;
    use crate::conditions::FixedClock;
    use crate::pipeline::{Outcome, Progress, Stage};
    use k8s_openapi::jiff::Timestamp;

    fn model(generation: i64) -> ModelServe {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap();
        let mut ms = ModelServe::new("m", spec);
        ms.metadata.generation = Some(generation);
        ms
    }

    fn at(s: i64) -> FixedClock {
        FixedClock(Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn resolving() -> Report {
        pipeline::decide(
            &[(
                Stage::Resolve,
                Outcome::waiting(
                    Progress::WaitingForResolve,
                    "asking",
                    Duration::from_secs(5),
                ),
            )],
            1,
        )
    }

    #[test]
    fn first_reconcile_sets_six_stages_plus_ready_and_observed_generation() {
        let (s, transitions) = next_status(Default::default(), &resolving(), &model(3), &at(0));
        assert_eq!(s.conditions.len(), 7);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.stage.as_deref(), Some("Resolve"));
        assert_eq!(
            conditions::get(&s.conditions, "Ready").unwrap().status,
            "False"
        );
        assert_eq!(
            transitions.iter().map(|t| t.type_).collect::<Vec<_>>(),
            ["Ready"],
            "a stage that first appears waiting is no Event; Ready's first False is"
        );
    }

    /// The Events a first reconcile publishes after Resolve ended with `outcome`: (type, warning).
    fn events_after(outcome: Outcome) -> Vec<(&'static str, bool)> {
        let report = pipeline::decide(&[(Stage::Resolve, outcome)], 1);
        let (_, transitions) = next_status(Default::default(), &report, &model(1), &at(0));
        transitions.iter().map(|t| (t.type_, t.warning)).collect()
    }

    #[test]
    fn a_rollout_in_progress_warns_of_nothing_and_a_failed_stage_warns() {
        let waiting = events_after(Outcome::waiting(
            Progress::WaitingForResolve,
            "asking the Hub",
            Duration::from_secs(5),
        ));
        assert!(waiting.iter().all(|(_, w)| !w), "{waiting:?}");

        let failed = events_after(Outcome::Failed {
            reason: "GatedRepo".into(),
            message: "accept the license".into(),
            recovery: pipeline::Recovery::SpecChange,
        });
        assert!(failed.contains(&("Resolved", true)), "{failed:?}");
        assert!(failed.contains(&("Ready", true)), "{failed:?}");
    }

    #[test]
    fn nothing_to_write_when_only_time_moved() {
        let (first, _) = next_status(Default::default(), &resolving(), &model(1), &at(0));
        let (second, transitions) = next_status(first.clone(), &resolving(), &model(1), &at(3600));
        assert_eq!(
            first, second,
            "a later clock alone must not change status, or the write wakes the controller forever"
        );
        assert!(transitions.is_empty());
    }

    #[test]
    fn a_new_generation_is_written() {
        let (first, _) = next_status(Default::default(), &resolving(), &model(1), &at(0));
        let (second, _) = next_status(first.clone(), &resolving(), &model(2), &at(10));
        assert_ne!(first, second);
        assert!(
            second
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(2))
        );
    }
}
