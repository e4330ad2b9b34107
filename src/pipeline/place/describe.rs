//! Where each pod of a model is on its way, said for people.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::Limits;
use super::verdict::{describe_exit, node, unschedulable};
use crate::units::human_duration;

/// Shown per pod in a progress message; more pods are counted, not described.
const DESCRIBED_PODS: usize = 3;

/// Where each pod is on its way, for people.
pub fn progress(pods: &[&Pod], limits: &Limits) -> String {
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use serde_json::json;

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
}
