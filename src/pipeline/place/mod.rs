//! Stage 5, Place: wait for a ready replica of the serving Deployment. Stop early, with the
//! reason, when the scheduler cannot place it (its own message, after a grace period) or when it
//! keeps failing (a crash loop, OOMKilled); give up after a timeout. None of these is permanent:
//! a node may be added or a pod may recover without any spec change, so each is looked at again.
//!
//! Everything it reads comes from the cache ([`observe`]), judged by [`verdict`] and said by
//! [`describe`].

pub mod describe;
pub mod failing;
mod gpu;
pub mod holders;
pub mod observe;
#[cfg(test)]
mod testing;
pub mod verdict;

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::env::Env;
use super::outcome::{Failure, Outcome, Progress, Recovery};
use crate::api::{CheckStatus, ModelServe, ModelServeStatus, PlacementStatus};
use crate::names::{endpoint, selector};
pub use observe::{Observed, current_pods, observe};
pub use verdict::{Verdict, verdict};

/// How often a replica on its way is looked at.
const POLL: Duration = Duration::from_secs(4);
/// When an unschedulable replica is looked at again (the scheduler retries on its own).
const RETRY_UNSCHEDULABLE: Duration = Duration::from_secs(30);
/// When a failing or late replica is looked at again.
const RETRY_FAILING: Duration = Duration::from_secs(60);

/// How long a replica may take, and how often it may fail, before the stage says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a pod may stay unschedulable before that is a failure.
    pub grace: Duration,
    /// How long after the newest ReplicaSet or pod was created a ready replica may take.
    pub timeout: Duration,
    /// Restarts a container may have before it counts as crash-looping.
    pub restarts: i32,
}

/// Why no replica is ready. Each can heal without a spec change (a node added, a pod that
/// recovers), so each is looked at again.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum PlaceFailure {
    #[error("{0}")]
    Unschedulable(String),
    /// Unschedulable for want of GPUs: the scheduler says `Insufficient nvidia.com/gpu`.
    #[error("{0}")]
    #[strum(serialize = "InsufficientGPU")]
    InsufficientGpu(String),
    #[error("{0}")]
    CrashLoop(String),
    /// A crash loop whose last exit says the node's GPU driver is older than the image's CUDA.
    #[error("{0}")]
    DriverTooOld(String),
    /// A crash loop whose last exit says a GPU had less free memory than the engine allocates.
    #[error("{0}")]
    #[strum(serialize = "GPUOutOfMemory")]
    GpuOutOfMemory(String),
    #[error("{0}")]
    #[strum(serialize = "OOMKilled")]
    OomKilled(String),
    #[error("{0}")]
    ImagePullFailed(String),
    /// The API server refused the replica's pod (admission: a quota, a LimitRange, Pod Security,
    /// a webhook), so the ReplicaSet has no pod to wait for.
    #[error("{0}")]
    FailedCreate(String),
    #[error("{0}")]
    Timeout(String),
}

impl Failure for PlaceFailure {
    fn reason(&self) -> &'static str {
        self.into()
    }

    fn recovery(&self) -> Recovery {
        match self {
            PlaceFailure::Unschedulable(_) | PlaceFailure::InsufficientGpu(_) => {
                Recovery::Heals(RETRY_UNSCHEDULABLE)
            }
            _ => Recovery::Heals(RETRY_FAILING),
        }
    }
}

/// What the stage decided and the status it writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    pub placement: Option<PlacementStatus>,
    pub replicas: i32,
    pub ready_replicas: i32,
}

/// The pure decision for the ModelServe `name` in `namespace` from what was observed.
pub fn decide(
    name: &str,
    namespace: &str,
    observed: &Observed,
    now: Timestamp,
    limits: &Limits,
    previous: Option<&PlacementStatus>,
    check: Option<&CheckStatus>,
) -> Decision {
    let ds = observed.deployment.as_ref().and_then(|d| d.status.as_ref());
    let replicas = ds.and_then(|s| s.replicas).unwrap_or(0);
    let ready_replicas = ds.and_then(|s| s.ready_replicas).unwrap_or(0);
    let wanted = observed
        .deployment
        .as_ref()
        .and_then(|d| d.spec.as_ref()?.replicas)
        .unwrap_or(1);
    let waiting = |message: String| Outcome::waiting(Progress::Placing, message, POLL);
    if observed.deployment.is_none() {
        return Decision {
            outcome: waiting(format!(
                "the Deployment {name} does not exist yet; the Catalog stage creates it"
            )),
            placement: None,
            replicas,
            ready_replicas,
        };
    }
    // Until the Deployment controller has seen the latest spec, its newest ReplicaSet may still
    // be the previous one, whose ready pods would pass for the new spec's; unless that one
    // already runs the new template (a scale), so serving replicas stay placed.
    if let Some(d) = &observed.deployment
        && d.metadata.generation > ds.and_then(|s| s.observed_generation)
        && !observe::template_current(observed)
    {
        return Decision {
            outcome: waiting(format!(
                "the Deployment {name} is rolling out its new spec (generation {})",
                d.metadata.generation.unwrap_or_default()
            )),
            placement: None,
            replicas,
            ready_replicas,
        };
    }
    let (pods, since) = current_pods(observed);
    let keep = previous.and_then(|p| p.uid.as_deref());
    let (outcome, placement) = match verdict(&pods, since, now, limits, keep) {
        // The count is the Deployment's own, so the message (and status) changes when the
        // Deployment's status does, not at every event of every pod.
        Verdict::Ready { placement, .. } => {
            let outcome = Outcome::done(
                Progress::Placed,
                format!(
                    "{} is ready on {} at {} ({ready_replicas}/{wanted} replicas ready); clients use {}",
                    placement.pod,
                    placement.node.as_deref().unwrap_or("an unnamed node"),
                    placement.address,
                    endpoint(name, namespace)
                ),
            );
            (outcome, Some(placement))
        }
        // No pod at all, and the Deployment says why: the API server refused to create it.
        Verdict::Progress(_) | Verdict::Timeout(_) if let Some(m) = refused(observed, &pods) => {
            (Outcome::failed(&PlaceFailure::FailedCreate(m)), None)
        }
        Verdict::Progress(m) => (waiting(m), None),
        Verdict::Unschedulable(m) if gpu::short_of_gpus(&m) => {
            (Outcome::failed(&PlaceFailure::InsufficientGpu(m)), None)
        }
        Verdict::Unschedulable(m) => (Outcome::failed(&PlaceFailure::Unschedulable(m)), None),
        Verdict::CrashLoop(m) if gpu::out_of_memory(&m) => (
            Outcome::failed(&PlaceFailure::GpuOutOfMemory(gpu::out_of_memory_message(
                &m, check,
            ))),
            None,
        ),
        Verdict::CrashLoop(m) if gpu::driver_too_old(&m) => (
            Outcome::failed(&PlaceFailure::DriverTooOld(format!(
                "{m}; the node's GPU driver is older than the CUDA runtime of the engine image: use an image built for the nodes' CUDA (server-cuda is CUDA 12, server-cuda13 CUDA 13) or update the driver"
            ))),
            None,
        ),
        Verdict::CrashLoop(m) => (Outcome::failed(&PlaceFailure::CrashLoop(m)), None),
        Verdict::OomKilled(m) => (Outcome::failed(&PlaceFailure::OomKilled(m)), None),
        Verdict::ImagePull(m) => (Outcome::failed(&PlaceFailure::ImagePullFailed(m)), None),
        Verdict::Timeout(m) => (Outcome::failed(&PlaceFailure::Timeout(m)), None),
    };
    Decision {
        outcome,
        placement,
        replicas,
        ready_replicas,
    }
}

/// The API server's words when the Deployment's ReplicaSet could not create a pod and none of
/// the current ReplicaSet exists: the Deployment controller copies the ReplicaSet's
/// `ReplicaFailure` condition (reason `FailedCreate`, message the API server's error) into the
/// Deployment's status.
fn refused(observed: &Observed, pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    if pods.iter().any(|p| p.metadata.deletion_timestamp.is_none()) {
        return None;
    }
    let deployment = observed.deployment.as_ref()?;
    let c = deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")?;
    let said = c.message.as_deref().unwrap_or("no message");
    Some(format!(
        "the API server refused the replica's pod ({}): {}; the ReplicaSet creates it again once that is fixed",
        c.reason.as_deref().unwrap_or("ReplicaFailure"),
        crate::conditions::truncate(said, MESSAGE_LIMIT)
    ))
}

/// The most of the API server's message a condition repeats.
const MESSAGE_LIMIT: usize = 1024;

/// Runs the stage.
pub async fn run(env: &Env, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    let name = ms.name_any();
    let namespace = ms.namespace().unwrap_or_else(|| "default".into());
    status.endpoint = Some(endpoint(&name, &namespace));
    status.selector = Some(selector(ms));
    let observed = observe(&env.cache, &namespace, &name);
    let limits = Limits {
        grace: env.settings.place_grace,
        timeout: env.settings.place_timeout,
        restarts: env.settings.crash_restarts,
    };
    let d = decide(
        &name,
        &namespace,
        &observed,
        env.clock.now(),
        &limits,
        status.placement.as_ref(),
        status.check.as_ref(),
    );
    status.replicas = d.replicas;
    status.ready_replicas = d.ready_replicas;
    status.placement = d.placement;
    let mut outcome = d.outcome;
    // Short of GPUs: who holds those the replica may use, read from the API only then.
    if let Outcome::Failed {
        reason, message, ..
    } = &mut outcome
        && *reason == <&str>::from(&PlaceFailure::InsufficientGpu(String::new()))
    {
        let engine = ms.spec.engine.clone().unwrap_or_default();
        if let Some(held) = holders::tell(env, &engine, &namespace, status.check.as_ref()).await {
            message.push_str("; ");
            message.push_str(&held);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn gpu_failures_have_their_own_reasons() {
        for (f, reason) in [
            (
                PlaceFailure::InsufficientGpu(String::new()),
                "InsufficientGPU",
            ),
            (PlaceFailure::DriverTooOld(String::new()), "DriverTooOld"),
            (
                PlaceFailure::GpuOutOfMemory(String::new()),
                "GPUOutOfMemory",
            ),
        ] {
            assert_eq!(f.reason(), reason);
        }
    }

    #[test]
    fn decide_waits_for_the_deployment_and_reports_a_ready_replica_with_the_endpoint() {
        let none = decide(
            "m",
            "ns",
            &Observed::default(),
            ts("2026-11-29T20:00:00Z"),
            &LIMITS,
            None,
            None,
        );
        assert!(
            matches!(&none.outcome, Outcome::Waiting { reason: Progress::Placing, message, .. } if message.contains("Deployment m does not exist yet")),
            "{none:?}"
        );
        let mut ready = fixture(READY);
        ready.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let observed = Observed {
            deployment: Some(deployment()),
            replica_sets: vec![replica_set("rs1", "1")],
            pods: vec![ready],
        };
        let d = decide(
            "m",
            "ns",
            &observed,
            ts("2026-11-29T20:10:00Z"),
            &LIMITS,
            None,
            None,
        );
        assert_eq!(
            d.outcome,
            Outcome::done(
                Progress::Placed,
                "m-6f4bd78f57-w9n7h is ready on kwok-large at 127.1.0.4:8080 (1/1 replicas ready); clients use http://m.ns.svc:8080/v1"
            )
        );
        assert_eq!(d.placement.unwrap().address, "127.1.0.4:8080");
    }

    #[test]
    fn a_spec_the_deployment_controller_has_not_seen_yet_is_not_placed_by_the_old_pods() {
        let mut ready = fixture(READY);
        ready.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let mut d = deployment();
        d.metadata.generation = Some(3);
        d.status.as_mut().unwrap().observed_generation = Some(2);
        let mut observed = Observed {
            deployment: Some(d),
            replica_sets: vec![replica_set("rs1", "1")],
            pods: vec![ready],
        };
        let now = ts("2026-11-29T20:10:00Z");
        let d = decide("m", "ns", &observed, now, &LIMITS, None, None);
        assert_eq!(
            d.outcome,
            Outcome::Waiting {
                reason: Progress::Placing,
                message: "the Deployment m is rolling out its new spec (generation 3)".into(),
                after: POLL
            }
        );
        let status = observed
            .deployment
            .as_mut()
            .unwrap()
            .status
            .as_mut()
            .unwrap();
        status.observed_generation = Some(3);
        let d = decide("m", "ns", &observed, now, &LIMITS, None, None);
        assert!(matches!(d.outcome, Outcome::Done { .. }), "{:?}", d.outcome);
    }

    #[test]
    fn a_scale_the_deployment_controller_has_not_seen_yet_keeps_the_ready_replica_placed() {
        let mut ready = fixture(READY);
        ready.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let mut d = deployment();
        d.metadata.generation = Some(3);
        d.status.as_mut().unwrap().observed_generation = Some(2);
        let template = serde_json::json!({"metadata": {"labels": {"modelserve.dev/model": "m"}},
            "spec": {"containers": [{"name": "llama-server", "image": "i"}]}});
        d.spec.as_mut().unwrap().template = serde_json::from_value(template.clone()).unwrap();
        let mut rs = full_replica_set("rs1", "1");
        let mut rs_template = template;
        rs_template["metadata"]["labels"]["pod-template-hash"] = "6f4bd78f57".into();
        rs.spec = Some(
            serde_json::from_value(serde_json::json!({"selector": {}, "template": rs_template}))
                .unwrap(),
        );
        let observed = Observed {
            deployment: Some(d),
            replica_sets: vec![observe::slim_replica_set(rs)],
            pods: vec![ready],
        };
        let d = decide(
            "m",
            "ns",
            &observed,
            ts("2026-11-29T20:10:00Z"),
            &LIMITS,
            None,
            None,
        );
        assert!(matches!(d.outcome, Outcome::Done { .. }), "{:?}", d.outcome);
    }

    #[test]
    fn a_pod_the_api_server_refuses_fails_in_its_words_and_only_while_no_pod_exists() {
        // As the Deployment controller copies the ReplicaSet's condition after a refused create.
        let mut d = deployment();
        d.status = Some(
            serde_json::from_value(serde_json::json!({"replicas": 0, "conditions": [{
                "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                "message": "pods \"m-6f4bd78f57-abcde\" is forbidden: exceeded quota: mem, requested: limits.memory=293Mi, used: limits.memory=0, limited: limits.memory=100Mi"
            }]}))
            .unwrap(),
        );
        let mut observed = Observed {
            deployment: Some(d),
            replica_sets: vec![replica_set("rs1", "1")],
            pods: vec![],
        };
        let now = ts("2026-11-29T20:10:00Z");
        let got = decide("m", "ns", &observed, now, &LIMITS, None, None);
        assert!(
            matches!(&got.outcome, Outcome::Failed { reason, message, recovery: Recovery::Heals(_) }
                if reason == "FailedCreate"
                && message == "the API server refused the replica's pod (FailedCreate): pods \"m-6f4bd78f57-abcde\" is forbidden: exceeded quota: mem, requested: limits.memory=293Mi, used: limits.memory=0, limited: limits.memory=100Mi; the ReplicaSet creates it again once that is fixed"),
            "{:?}",
            got.outcome
        );
        // A pod of the current ReplicaSet on its way: the refusal was of another replica, and
        // there is progress to wait for.
        let mut placed = fixture(UNSCHEDULABLE);
        placed.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        observed.pods = vec![placed];
        let got = decide("m", "ns", &observed, now, &LIMITS, None, None);
        assert!(
            matches!(&got.outcome, Outcome::Waiting { .. }),
            "{:?}",
            got.outcome
        );
    }

    #[test]
    fn failures_map_to_reasons_and_are_retried() {
        let mut crashing = fixture(CRASHLOOP);
        crashing.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let observed = Observed {
            deployment: Some(deployment()),
            replica_sets: vec![replica_set("rs1", "1")],
            pods: vec![crashing],
        };
        let d = decide(
            "m",
            "ns",
            &observed,
            ts("2026-11-29T20:10:00Z"),
            &LIMITS,
            None,
            None,
        );
        assert!(
            matches!(&d.outcome, Outcome::Failed { reason, recovery: Recovery::Heals(_), .. } if reason == "CrashLoop"),
            "{:?}",
            d.outcome
        );
    }
}
