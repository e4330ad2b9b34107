//! Stage 5, Place: wait for a ready replica of the serving Deployment. Stop early, with the
//! reason, when the scheduler cannot place it (its own message, after a grace period) or when it
//! keeps failing (a crash loop, OOMKilled); give up after a timeout. None of these is permanent:
//! a node may be added or a pod may recover without any spec change, so each is looked at again.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerStateTerminated, ContainerStatus, Pod, PodCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use super::Outcome;
use super::catalog::{MODEL_LABEL, PORT};
use crate::api::{ModelServe, ModelServeStatus, PlacementStatus};
use crate::controller::Context;

/// How often a replica on its way is looked at.
const POLL: Duration = Duration::from_secs(4);
/// When an unschedulable replica is looked at again (the scheduler retries on its own).
const RETRY_UNSCHEDULABLE: Duration = Duration::from_secs(30);
/// When a failing or late replica is looked at again.
const RETRY_FAILING: Duration = Duration::from_secs(60);
/// Name of the server's container port.
const PORT_NAME: &str = "http";
/// Shown per pod in a progress message; more pods are counted, not described.
const DESCRIBED_PODS: usize = 3;

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

/// What the stage reads from the cluster for one ModelServe.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The Deployment named after the ModelServe.
    pub deployment: Option<Deployment>,
    /// ReplicaSets carrying the model label.
    pub replica_sets: Vec<ReplicaSet>,
    /// Pods carrying the model label.
    pub pods: Vec<Pod>,
}

/// Reads the Deployment `name` and the ReplicaSets and pods labelled for the model `name`.
pub async fn observe(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Observed, kube::Error> {
    let lp = ListParams::default().labels(&format!("{MODEL_LABEL}={name}"));
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?;
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items;
    Ok(Observed {
        deployment,
        replica_sets,
        pods,
    })
}

/// The pods that count and the time the clock of the timeout starts: the pods of the
/// Deployment's newest ReplicaSet (an older one's pods are on their way out during a rollout and
/// do not run the spec asked for), and the latest creation of that ReplicaSet or its pods.
pub fn current_pods(observed: &Observed) -> (Vec<Pod>, Option<Timestamp>) {
    let Some(deployment) = &observed.deployment else {
        return (Vec::new(), None);
    };
    let newest = observed
        .replica_sets
        .iter()
        .filter(|rs| controlled_by(&rs.metadata, deployment.metadata.uid.as_deref()))
        .max_by_key(|rs| (revision(rs), created(&rs.metadata), rs.name_any()));
    let Some(rs) = newest else {
        return (Vec::new(), created(&deployment.metadata));
    };
    let pods: Vec<Pod> = observed
        .pods
        .iter()
        .filter(|p| controlled_by(&p.metadata, rs.metadata.uid.as_deref()))
        .cloned()
        .collect();
    let since = pods
        .iter()
        .filter_map(|p| created(&p.metadata))
        .chain(created(&rs.metadata))
        .max();
    (pods, since)
}

fn controlled_by(meta: &ObjectMeta, owner_uid: Option<&str>) -> bool {
    owner_uid.is_some_and(|uid| {
        meta.owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == uid)
    })
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get("deployment.kubernetes.io/revision")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn created(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.creation_timestamp.as_ref().map(|t| t.0)
}

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
    let progress = progress(&pods, limits);
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

fn node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

/// The scheduler's message, and since when it has been refusing, for an unschedulable pod.
fn unschedulable(pod: &Pod) -> Option<(String, Timestamp)> {
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

/// Init containers first, as the kubelet runs them, then the others.
fn statuses(pod: &Pod) -> impl Iterator<Item = (&'static str, &ContainerStatus)> {
    let s = pod.status.as_ref();
    let init = s
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ("init container", c));
    let main = s
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ("container", c));
    init.chain(main)
}

fn spec_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == name)
}

fn waiting_reason(s: &ContainerStatus) -> Option<&str> {
    s.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// The termination to report: the current one if the container is down, else the last.
fn termination(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .or_else(|| s.last_state.as_ref()?.terminated.as_ref())
}

fn describe_exit(t: &ContainerStateTerminated) -> String {
    let mut s = format!("exit code {}", t.exit_code);
    if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
        s += &format!(" ({r})");
    }
    if let Some(m) = t
        .message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        s += &format!(": {m}");
    }
    s
}

fn oom_killed(pod: &Pod) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let now = s.state.as_ref().and_then(|st| st.terminated.as_ref());
        let last = s.last_state.as_ref().and_then(|st| st.terminated.as_ref());
        let t = [now, last]
            .into_iter()
            .flatten()
            .find(|t| t.reason.as_deref() == Some("OOMKilled"))?;
        let limit = spec_of(pod, &s.name)
            .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get("memory"))
            .map(|q| q.0.clone());
        let at = match limit {
            Some(l) => format!("at its memory limit of {l}"),
            None => "with no memory limit set (the node ran out of memory)".to_string(),
        };
        Some(format!(
            "{kind} {} of {} was OOMKilled (exit code {}) {at}: the model needs more memory than the replica has; raise engine.resources memory or lower contextSize",
            s.name,
            pod.name_any(),
            t.exit_code
        ))
    })
}

fn crash_loop(pod: &Pod, budget: i32) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let backing_off = waiting_reason(s) == Some("CrashLoopBackOff");
        if !backing_off && s.restart_count <= budget {
            return None;
        }
        let times = if s.restart_count == 1 {
            "time"
        } else {
            "times"
        };
        let mut m = format!(
            "{kind} {} of {} keeps crashing: restarted {} {times}",
            s.name,
            pod.name_any(),
            s.restart_count
        );
        if backing_off {
            m += ", now in CrashLoopBackOff";
        }
        if let Some(t) = termination(s) {
            m += &format!("; last {}", describe_exit(t));
        }
        Some(m)
    })
}

fn image_pull(pod: &Pod) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let w = s.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.as_deref()?;
        // ErrImagePull alone is a first failure the kubelet retries; the back-off is not.
        if !matches!(
            reason,
            "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull"
        ) {
            return None;
        }
        let mut m = format!(
            "{kind} {} of {} cannot pull its image {}: {reason}",
            s.name,
            pod.name_any(),
            s.image
        );
        if let Some(msg) = w.message.as_deref().filter(|m| !m.is_empty()) {
            m += &format!(": {msg}");
        }
        Some(m)
    })
}

/// Where each pod is on its way, for people.
fn progress(pods: &[&Pod], limits: &Limits) -> String {
    if pods.is_empty() {
        return "waiting for the Deployment to create a pod".to_string();
    }
    let mut parts: Vec<String> = pods
        .iter()
        .take(DESCRIBED_PODS)
        .map(|p| describe(p, limits))
        .collect();
    if pods.len() > DESCRIBED_PODS {
        parts.push(format!("{} more pods", pods.len() - DESCRIBED_PODS));
    }
    parts.join("; ")
}

fn describe(pod: &Pod, limits: &Limits) -> String {
    let name = pod.name_any();
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if matches!(phase, "Failed" | "Succeeded") {
        let why = [
            status.and_then(|s| s.reason.as_deref()),
            status.and_then(|s| s.message.as_deref()),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(": ");
        return if why.is_empty() {
            format!("{name} has {phase}; the Deployment replaces it")
        } else {
            format!("{name} has {phase} ({why}); the Deployment replaces it")
        };
    }
    let Some(node) = node(pod) else {
        return match unschedulable(pod) {
            Some((message, _)) => format!(
                "{message}; the scheduler keeps trying (reported as a failure after {})",
                human_duration(limits.grace)
            ),
            None => format!("{name} is Pending: waiting for the scheduler"),
        };
    };
    let at = format!("{name} on {node}");
    let init = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten();
    for s in init {
        let state = s.state.as_ref();
        if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
            if t.exit_code == 0 {
                continue;
            }
            return format!(
                "{at}: init container {} ended with {}; it is restarted",
                s.name,
                describe_exit(t)
            );
        }
        if state.and_then(|st| st.running.as_ref()).is_some() {
            if s.started == Some(true) && s.ready {
                continue; // a sidecar, running next to the server
            }
            return format!("{at}: init container {} is running", s.name);
        }
        if let Some(w) = state.and_then(|st| st.waiting.as_ref()) {
            return format!("{at}: init container {} is {}", s.name, waiting(w));
        }
    }
    let main = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten();
    for s in main.filter(|s| !s.ready) {
        let state = s.state.as_ref();
        if let Some(w) = state.and_then(|st| st.waiting.as_ref()) {
            return format!("{at} is {}", waiting(w));
        }
        if state.and_then(|st| st.running.as_ref()).is_some() {
            return format!(
                "{at}: {} is running and not ready yet (its readiness probe has not passed; a model takes a while to load)",
                s.name
            );
        }
        if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
            return format!("{at}: {} ended with {}", s.name, describe_exit(t));
        }
    }
    if status.and_then(|s| s.pod_ip.as_deref()).is_none() && phase == "Running" {
        return format!("{at} is Running and has no pod IP yet");
    }
    format!("{at} is {phase}")
}

fn waiting(w: &k8s_openapi::api::core::v1::ContainerStateWaiting) -> String {
    let reason = w.reason.as_deref().unwrap_or("waiting");
    match w.message.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    }
}

/// 90 s as "1m30s", 30 min as "30m".
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s % 3600 / 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if m > 0 {
        out += &format!("{m}m");
    }
    if s > 0 || out.is_empty() {
        out += &format!("{s}s");
    }
    out
}

/// The in-cluster URL of the model's Service.
pub fn endpoint(name: &str, namespace: &str) -> String {
    format!("http://{name}.{namespace}.svc:{PORT}/v1")
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
) -> Decision {
    let ds = observed.deployment.as_ref().and_then(|d| d.status.as_ref());
    let replicas = ds.and_then(|s| s.replicas).unwrap_or(0);
    let ready_replicas = ds.and_then(|s| s.ready_replicas).unwrap_or(0);
    let wanted = observed
        .deployment
        .as_ref()
        .and_then(|d| d.spec.as_ref()?.replicas)
        .unwrap_or(1);
    let waiting = |message: String| Outcome::Waiting {
        reason: "Placing".into(),
        message,
        after: POLL,
    };
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
    // be the previous one, whose ready pods would pass for the new spec's.
    if let Some(d) = &observed.deployment
        && d.metadata.generation > ds.and_then(|s| s.observed_generation)
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
    let failed = |reason: &str, message: String, retry: Duration| Outcome::Failed {
        reason: reason.into(),
        message,
        retry: Some(retry),
    };
    let (outcome, placement) = match verdict(&pods, since, now, limits, keep) {
        Verdict::Ready { placement, ready } => {
            let outcome = Outcome::Done {
                reason: "Placed".into(),
                message: format!(
                    "{} is ready on {} at {} ({ready}/{wanted} replicas ready); clients use {}",
                    placement.pod,
                    placement.node.as_deref().unwrap_or("an unnamed node"),
                    placement.address,
                    endpoint(name, namespace)
                ),
            };
            (outcome, Some(placement))
        }
        Verdict::Progress(m) => (waiting(m), None),
        Verdict::Unschedulable(m) => (failed("Unschedulable", m, RETRY_UNSCHEDULABLE), None),
        Verdict::CrashLoop(m) => (failed("CrashLoop", m, RETRY_FAILING), None),
        Verdict::OomKilled(m) => (failed("OOMKilled", m, RETRY_FAILING), None),
        Verdict::ImagePull(m) => (failed("ImagePullFailed", m, RETRY_FAILING), None),
        Verdict::Timeout(m) => (failed("Timeout", m, RETRY_FAILING), None),
    };
    Decision {
        outcome,
        placement,
        replicas,
        ready_replicas,
    }
}

/// Runs the stage.
pub async fn run(ctx: &Context, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    let name = ms.name_any();
    let namespace = ms.namespace().unwrap_or_else(|| "default".into());
    status.endpoint = Some(endpoint(&name, &namespace));
    status.selector = Some(super::catalog::selector(ms));
    let observed = match observe(&ctx.client, &namespace, &name).await {
        Ok(o) => o,
        Err(e) => {
            return Outcome::Waiting {
                reason: "KubernetesApiError".into(),
                message: format!("cannot read the replicas of Deployment {name}: {e}"),
                after: Duration::from_secs(10),
            };
        }
    };
    let limits = Limits {
        grace: ctx.config.place_grace,
        timeout: ctx.config.place_timeout,
        restarts: ctx.config.crash_restarts,
    };
    let d = decide(
        &name,
        &namespace,
        &observed,
        ctx.clock.now(),
        &limits,
        status.placement.as_ref(),
    );
    status.replicas = d.replicas;
    status.ready_replicas = d.ready_replicas;
    status.placement = d.placement;
    d.outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Pods as the test bed's scheduler and kwok stages (testbed/kwok/pod-faults.yaml) left them.
    const READY: &str = include_str!("../../tests/fixtures/pods/ready.json");
    const UNSCHEDULABLE: &str = include_str!("../../tests/fixtures/pods/unschedulable.json");
    const CRASHLOOP: &str = include_str!("../../tests/fixtures/pods/crashloop.json");
    const OOMKILLED: &str = include_str!("../../tests/fixtures/pods/oomkilled.json");
    const INIT_CRASHLOOP: &str = include_str!("../../tests/fixtures/pods/init-crashloop.json");

    const LIMITS: Limits = Limits {
        grace: Duration::from_secs(60),
        timeout: Duration::from_secs(1800),
        restarts: 3,
    };

    fn fixture(s: &str) -> Pod {
        serde_json::from_str(s).unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn plus(t: Timestamp, secs: i64) -> Timestamp {
        Timestamp::from_second(t.as_second() + secs).unwrap()
    }

    fn created_at(p: &Pod) -> Timestamp {
        p.metadata.creation_timestamp.as_ref().unwrap().0
    }

    /// Judges `pods` `secs` after the first one was created, with the default limits.
    fn judge(pods: &[Pod], secs: i64) -> Verdict {
        let since = pods.iter().map(created_at).max();
        verdict(pods, since, plus(created_at(&pods[0]), secs), &LIMITS, None)
    }

    /// A pod of ReplicaSet `rs` built in code: `node` None means not scheduled yet.
    fn pod(name: &str, rs: &str, node: Option<&str>, status: serde_json::Value) -> Pod {
        let mut spec = json!({
            "initContainers": [{"name": "pull", "image": "pull:1"}],
            "containers": [{
                "name": "llama-server", "image": "srv:1",
                "ports": [{"name": "http", "containerPort": 8080}],
                "resources": {"limits": {"memory": "8Gi"}, "requests": {"memory": "8Gi"}}
            }]
        });
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-11-29T20:00:00Z",
                "labels": {"modelserve.dev/model": "m"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                     "uid": format!("uid-{rs}"), "controller": true}]
            },
            "spec": spec,
            "status": status
        }))
        .unwrap()
    }

    fn main_status(state: serde_json::Value, restarts: i32) -> serde_json::Value {
        json!({
            "phase": "Running", "podIP": "127.1.0.9",
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": "pull", "image": "pull:1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [{"name": "llama-server", "image": "srv:1", "imageID": "", "ready": false,
                "restartCount": restarts, "state": state}]
        })
    }

    fn message(v: &Verdict) -> &str {
        match v {
            Verdict::Ready { .. } => panic!("expected a message, got {v:?}"),
            Verdict::Progress(m)
            | Verdict::Unschedulable(m)
            | Verdict::CrashLoop(m)
            | Verdict::OomKilled(m)
            | Verdict::ImagePull(m)
            | Verdict::Timeout(m) => m,
        }
    }

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
    fn crash_loop_back_off_fails_with_the_last_exit() {
        let v = judge(&[fixture(CRASHLOOP)], 20);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("container llama-server of m-6f4bd78f57-7j8qg keeps crashing: restarted 8 times, now in CrashLoopBackOff; last exit code 1 (Error): error loading model"),
            "{m}"
        );
    }

    #[test]
    fn restarts_past_the_budget_are_a_crash_loop_even_while_running() {
        let running = json!({"running": {"startedAt": "2026-11-29T20:01:00Z"}});
        let at_budget = pod("m-a", "rs", Some("n"), main_status(running.clone(), 3));
        assert!(matches!(judge(&[at_budget], 60), Verdict::Progress(_)));
        let mut past = main_status(running, 4);
        past["containerStatuses"][0]["lastState"] =
            json!({"terminated": {"exitCode": 139, "reason": "Error"}});
        let v = judge(&[pod("m-a", "rs", Some("n"), past)], 60);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(
            m,
            "container llama-server of m-a keeps crashing: restarted 4 times; last exit code 139 (Error)"
        );
    }

    #[test]
    fn oom_killed_in_the_last_state_names_the_container_and_its_limit() {
        let v = judge(&[fixture(OOMKILLED)], 20);
        let Verdict::OomKilled(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("container llama-server of m-6f4bd78f57-57ftm was OOMKilled (exit code 137) at its memory limit of 1Gi"),
            "{m}"
        );
    }

    #[test]
    fn oom_killed_right_now_is_reported_before_any_restart() {
        let state = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
        let v = judge(&[pod("m-a", "rs", Some("n"), main_status(state, 0))], 10);
        let Verdict::OomKilled(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.contains("llama-server of m-a") && m.contains("limit of 8Gi"),
            "{m}"
        );
    }

    #[test]
    fn a_failing_init_container_is_a_crash_loop_naming_it() {
        let v = judge(&[fixture(INIT_CRASHLOOP)], 20);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("init container pull of m-6f4bd78f57-v76ff keeps crashing: restarted 5 times, now in CrashLoopBackOff; last exit code 1 (Error): pull failed"),
            "{m}"
        );
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

    fn replica_set(name: &str, revision: &str) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-11-29T19:00:00Z",
                "annotations": {"deployment.kubernetes.io/revision": revision},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "m",
                                     "uid": "uid-deploy", "controller": true}]}
        }))
        .unwrap()
    }

    fn deployment() -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "m", "namespace": "ns", "uid": "uid-deploy",
                "creationTimestamp": "2026-11-29T18:00:00Z"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"modelserve.dev/model": "m"}},
                     "template": {}},
            "status": {"replicas": 2, "readyReplicas": 1}
        }))
        .unwrap()
    }

    #[test]
    fn pods_of_an_older_replica_set_are_ignored_while_a_newer_one_exists() {
        let mut old = fixture(READY);
        old.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-rs1".into();
        let new = pod("m-new", "rs10", None, json!({"phase": "Pending"}));
        let observed = Observed {
            deployment: Some(deployment()),
            // Revision 10 is newer than 9: compared as numbers, not as text.
            replica_sets: vec![replica_set("rs1", "9"), replica_set("rs10", "10")],
            pods: vec![old, new],
        };
        let (pods, since) = current_pods(&observed);
        assert_eq!(
            pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["m-new"]
        );
        assert_eq!(since, Some(ts("2026-11-29T20:00:00Z")));
        let d = decide(
            "m",
            "ns",
            &observed,
            ts("2026-11-29T20:00:05Z"),
            &LIMITS,
            None,
        );
        assert_eq!(
            d.outcome,
            Outcome::Waiting {
                reason: "Placing".into(),
                message: "m-new is Pending: waiting for the scheduler".into(),
                after: POLL
            }
        );
        assert_eq!(
            (d.replicas, d.ready_replicas),
            (2, 1),
            "from the Deployment"
        );
        assert_eq!(d.placement, None);
    }

    #[test]
    fn a_replica_set_of_another_owner_does_not_count() {
        let mut foreign = replica_set("rs9", "99");
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-other".into();
        let observed = Observed {
            deployment: Some(deployment()),
            replica_sets: vec![replica_set("rs1", "1"), foreign],
            pods: vec![
                pod("m-a", "rs1", None, json!({})),
                pod("m-b", "rs9", None, json!({})),
            ],
        };
        let (pods, _) = current_pods(&observed);
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].name_any(), "m-a");
    }

    #[test]
    fn progress_says_where_each_pod_is() {
        let pending = pod("m-a", "rs", None, json!({"phase": "Pending"}));
        assert_eq!(
            message(&judge(&[pending], 1)),
            "m-a is Pending: waiting for the scheduler"
        );
        let pulling = pod(
            "m-b",
            "rs",
            Some("kwok-small"),
            json!({"phase": "Pending", "podIP": "127.1.0.3",
                "initContainerStatuses": [{"name": "pull", "image": "pull:1", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"running": {"startedAt": "2026-11-29T20:00:01Z"}}}],
                "containerStatuses": [{"name": "llama-server", "image": "srv:1", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}),
        );
        assert_eq!(
            message(&judge(&[pulling], 1)),
            "m-b on kwok-small: init container pull is running"
        );
        let loading = pod(
            "m-c",
            "rs",
            Some("kwok-large"),
            main_status(json!({"running": {"startedAt": "2026-11-29T20:00:01Z"}}), 0),
        );
        assert_eq!(
            message(&judge(&[loading], 1)),
            "m-c on kwok-large: llama-server is running and not ready yet (its readiness probe has not passed; a model takes a while to load)"
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

    #[test]
    fn an_image_that_cannot_be_pulled_fails_with_the_kubelets_words() {
        let state = json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"srv:1\""}});
        let v = judge(&[pod("m-a", "rs", Some("n"), main_status(state, 0))], 10);
        assert_eq!(
            v,
            Verdict::ImagePull(
                "container llama-server of m-a cannot pull its image srv:1: ImagePullBackOff: Back-off pulling image \"srv:1\"".into()
            )
        );
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
        );
        assert!(
            matches!(&none.outcome, Outcome::Waiting { reason, message, .. } if reason == "Placing" && message.contains("Deployment m does not exist yet")),
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
        );
        assert_eq!(
            d.outcome,
            Outcome::Done {
                reason: "Placed".into(),
                message: "m-6f4bd78f57-w9n7h is ready on kwok-large at 127.1.0.4:8080 (1/1 replicas ready); clients use http://m.ns.svc:8080/v1".into()
            }
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
        let d = decide("m", "ns", &observed, now, &LIMITS, None);
        assert_eq!(
            d.outcome,
            Outcome::Waiting {
                reason: "Placing".into(),
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
        let d = decide("m", "ns", &observed, now, &LIMITS, None);
        assert!(matches!(d.outcome, Outcome::Done { .. }), "{:?}", d.outcome);
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
        );
        assert!(
            matches!(&d.outcome, Outcome::Failed { reason, retry: Some(_), .. } if reason == "CrashLoop"),
            "{:?}",
            d.outcome
        );
    }

    #[test]
    fn durations_read_like_flags() {
        assert_eq!(human_duration(Duration::from_secs(60)), "1m");
        assert_eq!(human_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(human_duration(Duration::from_secs(1800)), "30m");
        assert_eq!(human_duration(Duration::from_secs(3661)), "1h1m1s");
        assert_eq!(human_duration(Duration::ZERO), "0s");
    }
}
