//! The judgment of a model's pods: ready, on its way, or failing (and how), with the words a
//! person needs to act on it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::Limits;
pub use super::failing::describe_exit;
use super::failing::{crash_loop, image_pull, oom_killed};
use super::observe::created;
use crate::api::PlacementStatus;
use crate::names::{PORT, PORT_NAME};
use crate::units::human_duration;

/// Where the replicas stand.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// A replica is ready; `ready` of the pods are.
    Ready {
        placement: PlacementStatus,
        ready: usize,
    },
    /// On its way (or not started); the message says where.
    Progress(String),
    /// The scheduler has found no node for longer than the grace period.
    Unschedulable(String),
    /// A container keeps exiting.
    CrashLoop(String),
    /// A container was killed at its memory limit.
    OomKilled(String),
    /// A container's image cannot be pulled.
    ImagePull(String),
    /// Nothing became ready within the timeout.
    Timeout(String),
}

/// Judges the pods of the current ReplicaSet. `since` starts the timeout; `keep` is the UID of
/// the replica placed before, kept while it stays ready so the smoke test does not move around.
pub fn verdict(
    pods: &[Pod],
    since: Option<Timestamp>,
    now: Timestamp,
    limits: &Limits,
    keep: Option<&str>,
) -> Verdict {
    let mut pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| (created(&p.metadata), p.name_any()));

    let ready: Vec<PlacementStatus> = pods.iter().filter_map(|p| placement(p)).collect();
    let chosen = ready
        .iter()
        .find(|r| keep.is_some() && r.uid.as_deref() == keep)
        .or(ready.first());
    if let Some(p) = chosen {
        return Verdict::Ready {
            placement: p.clone(),
            ready: ready.len(),
        };
    }
    // A container that was OOMKilled usually also crash-loops; the kill is the useful news.
    if let Some(m) = pods.iter().find_map(|p| oom_killed(p)) {
        return Verdict::OomKilled(m);
    }
    if let Some(m) = pods.iter().find_map(|p| crash_loop(p, limits.restarts)) {
        return Verdict::CrashLoop(m);
    }
    if let Some(m) = pods.iter().find_map(|p| image_pull(p)) {
        return Verdict::ImagePull(m);
    }
    // While some replica is on a node there is progress to wait for; only when none is does the
    // scheduler's refusal stop the stage.
    let scheduled = pods.iter().any(|p| node(p).is_some());
    if !scheduled
        && let Some(m) = pods.iter().find_map(|p| {
            let (message, since) = unschedulable(p)?;
            (elapsed(since, now) >= limits.grace).then_some(message)
        })
    {
        return Verdict::Unschedulable(m);
    }
    let progress = super::describe::progress(&pods, limits);
    if let Some(since) = since
        && elapsed(since, now) >= limits.timeout
    {
        return Verdict::Timeout(format!(
            "no replica became ready within {} of the current ReplicaSet or its newest pod being created; {progress}",
            human_duration(limits.timeout)
        ));
    }
    Verdict::Progress(progress)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::from_secs(now.as_second().saturating_sub(since.as_second()).max(0) as u64)
}

/// The placement of `pod` when it is ready to answer: Ready and with an IP.
fn placement(pod: &Pod) -> Option<PlacementStatus> {
    let status = pod.status.as_ref()?;
    let ready = condition(pod, "Ready").is_some_and(|c| c.status == "True");
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    if !ready || status.phase.as_deref() != Some("Running") {
        return None;
    }
    Some(PlacementStatus {
        pod: pod.name_any(),
        node: node(pod).map(str::to_string),
        address: format!("{ip}:{}", server_port(pod)),
        uid: pod.metadata.uid.clone(),
    })
}

/// The container port named `http` (the contract's), else the catalog's port.
fn server_port(pod: &Pod) -> i32 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(PORT_NAME))
        .map_or(PORT, |p| p.container_port)
}

pub(super) fn node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub(super) fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

/// The scheduler's message, and since when it has been refusing, for an unschedulable pod.
pub(super) fn unschedulable(pod: &Pod) -> Option<(String, Timestamp)> {
    let c = condition(pod, "PodScheduled")?;
    if c.status != "False" || c.reason.as_deref() != Some("Unschedulable") {
        return None;
    }
    // The later of the two: the condition's time comes from the scheduler's clock and the
    // creation time from the API server's, and the condition keeps its first time while the
    // scheduler retries. A skewed scheduler clock or a missing time could otherwise start the
    // grace before the pod existed and cut short the time preemption or a cluster autoscaler
    // gets to make room.
    let since = [
        c.last_transition_time.as_ref().map(|t| t.0),
        created(&pod.metadata),
    ]
    .into_iter()
    .flatten()
    .max()?;
    let message = format!(
        "{} cannot be scheduled: {}{}",
        pod.name_any(),
        c.message
            .as_deref()
            .unwrap_or("the scheduler gave no reason")
            .trim(),
        requested_memory(pod)
            .map(|m| format!(" (a replica requests {m} of memory)"))
            .unwrap_or_default()
    );
    Some((message, since))
}

fn requested_memory(pod: &Pod) -> Option<String> {
    let c = pod.spec.as_ref()?.containers.first()?;
    let r = c.resources.as_ref()?.requests.as_ref()?.get("memory")?;
    Some(r.0.clone())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_ready_pod_is_placed_with_its_node_address_and_uid() {
        let v = judge(&[fixture(READY)], 5);
        let Verdict::Ready { placement, ready } = v else {
            panic!("{v:?}")
        };
        assert_eq!(ready, 1);
        assert_eq!(
            placement,
            PlacementStatus {
                pod: "m-6f4bd78f57-w9n7h".into(),
                node: Some("kwok-large".into()),
                address: "127.1.0.4:8080".into(),
                uid: Some("bf8fbeaf-7611-4741-91f4-55a555b3ae10".into()),
            }
        );
    }

    #[test]
    fn the_address_uses_the_port_named_http() {
        let mut p = fixture(READY);
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.ports.as_mut().unwrap()[0].container_port = 9090;
        let Verdict::Ready { placement, .. } = judge(&[p], 5) else {
            panic!()
        };
        assert_eq!(placement.address, "127.1.0.4:9090");
    }

    #[test]
    fn unschedulable_within_the_grace_is_progress_and_after_it_a_failure_with_the_schedulers_words()
    {
        let p = fixture(UNSCHEDULABLE);
        let within = judge(std::slice::from_ref(&p), 59);
        assert!(matches!(within, Verdict::Progress(_)), "{within:?}");
        assert!(
            message(&within).contains("0/2 nodes are available: 2 Insufficient memory")
                && message(&within).contains("reported as a failure after 1m"),
            "{within:?}"
        );
        let after = judge(&[p], 60);
        let Verdict::Unschedulable(m) = &after else {
            panic!("{after:?}")
        };
        assert!(
            m.starts_with("m-9f6cc4b9c-6hg4w cannot be scheduled: 0/2 nodes are available: 2 Insufficient memory."),
            "{m}"
        );
        assert!(m.ends_with("(a replica requests 100Gi of memory)"), "{m}");
    }

    #[test]
    fn the_grace_counts_from_the_later_of_the_condition_time_and_the_creation() {
        // The scheduler's clock runs 5 minutes behind the API server's.
        let p = pod(
            "m-a",
            "rs2",
            None,
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/2 nodes are available: 2 Insufficient memory.",
                "lastTransitionTime": "2026-11-29T19:55:00Z"}]}),
        );
        let created = ts("2026-11-29T20:00:00Z");
        let at = |s| {
            verdict(
                std::slice::from_ref(&p),
                None,
                plus(created, s),
                &LIMITS,
                None,
            )
        };
        assert!(matches!(at(30), Verdict::Progress(_)), "{:?}", at(30));
        assert!(matches!(at(60), Verdict::Unschedulable(_)));

        // And a condition stamped after creation starts the grace there.
        let mut late = p.clone();
        let c = &mut late.status.as_mut().unwrap().conditions.as_mut().unwrap()[0];
        c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(plus(
            created, 40,
        )));
        let v = verdict(&[late], None, plus(created, 90), &LIMITS, None);
        assert!(matches!(v, Verdict::Progress(_)), "{v:?}");
    }

    #[test]
    fn nothing_ready_within_the_timeout_fails_and_says_where_it_stands() {
        let creating = main_status(json!({"waiting": {"reason": "ContainerCreating"}}), 0);
        let p = pod("m-a", "rs", Some("kwok-small"), creating);
        let v = judge(std::slice::from_ref(&p), 1799);
        assert_eq!(
            v,
            Verdict::Progress("m-a on kwok-small is ContainerCreating".into())
        );
        let v = judge(&[p], 1800);
        assert_eq!(
            v,
            Verdict::Timeout(
                "no replica became ready within 30m of the current ReplicaSet or its newest pod being created; m-a on kwok-small is ContainerCreating".into()
            )
        );
    }

    #[test]
    fn terminating_pods_are_ignored() {
        let mut ready = fixture(READY);
        ready.metadata.deletion_timestamp = ready.metadata.creation_timestamp.clone();
        let mut crashing = fixture(CRASHLOOP);
        crashing.metadata.deletion_timestamp = crashing.metadata.creation_timestamp.clone();
        let v = judge(&[ready, crashing], 10);
        assert_eq!(
            v,
            Verdict::Progress("waiting for the Deployment to create a pod".into())
        );
    }

    #[test]
    fn one_unschedulable_replica_does_not_fail_while_another_is_on_a_node() {
        let placed = pod(
            "m-a",
            "rs",
            Some("kwok-large"),
            main_status(json!({"waiting": {"reason": "ContainerCreating"}}), 0),
        );
        let v = judge(&[placed, fixture(UNSCHEDULABLE)], 600);
        let Verdict::Progress(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("m-a on kwok-large is ContainerCreating; m-9f6cc4b9c-6hg4w cannot be scheduled: 0/2 nodes"),
            "{m}"
        );
    }

    #[test]
    fn the_replica_placed_before_stays_placed_while_it_is_ready() {
        let mut other = fixture(READY);
        other.metadata.name = Some("m-aaa".into());
        other.metadata.uid = Some("uid-aaa".into());
        other.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts("2026-11-29T20:00:00Z")),
        );
        let previous = fixture(READY);
        let pods = [other, previous];
        let keep = Some("bf8fbeaf-7611-4741-91f4-55a555b3ae10");
        let v = verdict(&pods, None, ts("2026-11-29T20:10:00Z"), &LIMITS, keep);
        let Verdict::Ready { placement, ready } = v else {
            panic!()
        };
        assert_eq!((placement.pod.as_str(), ready), ("m-6f4bd78f57-w9n7h", 2));
        let v = verdict(
            &pods,
            None,
            ts("2026-11-29T20:10:00Z"),
            &LIMITS,
            Some("gone"),
        );
        let Verdict::Ready { placement, .. } = v else {
            panic!()
        };
        assert_eq!(placement.pod, "m-aaa", "else the oldest");
    }
}
