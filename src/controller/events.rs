//! One Event per condition transition, written straight to events.k8s.io/v1. A transition
//! happens once, so there is nothing to deduplicate: no cache of past Events is kept, and
//! publishing costs one request and no memory however many models there are.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::conditions::{self, Transition};
use crate::names::FIELD_MANAGER;

/// The most of a transition's message an Event carries (the API server allows 1 KiB).
const NOTE_BYTES: usize = 1000;

/// Writes Events about the operator's objects.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    /// This replica of the operator (the pod's name), for reportingInstance.
    instance: String,
}

impl Publisher {
    pub fn new(client: Client, instance: Option<String>) -> Publisher {
        Publisher {
            client,
            instance: instance.unwrap_or_else(|| FIELD_MANAGER.to_string()),
        }
    }

    /// Publishes `t` about `object`, as of `at`.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        t: &Transition,
        at: Timestamp,
    ) -> Result<(), kube::Error> {
        let ns = object.namespace.clone().unwrap_or_else(|| "default".into());
        Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(
                &PostParams::default(),
                &event(object, t, &self.instance, at),
            )
            .await
            .map(|_| ())
    }
}

/// The metadata of an Event about `object` at `now`: in its namespace, named uniquely per object
/// and instant, as kubectl and client-go name Events.
pub fn metadata(object: &ObjectReference, now: Timestamp) -> ObjectMeta {
    ObjectMeta {
        namespace: object.namespace.clone(),
        name: Some(format!(
            "{}.{:x}",
            object.name.as_deref().unwrap_or("modelserve"),
            now.as_nanosecond()
        )),
        ..Default::default()
    }
}

/// The Event of transition `t` of `object` at `now`.
pub fn event(object: &ObjectReference, t: &Transition, instance: &str, now: Timestamp) -> Event {
    let from = t.from.as_deref().unwrap_or("unset");
    let note = format!("{} {from} -> {}: {}", t.type_, t.to.as_str(), t.message);
    Event {
        action: Some(t.type_.to_string()),
        reason: Some(t.reason.clone()),
        note: Some(conditions::truncate(&note, NOTE_BYTES)),
        event_time: Some(MicroTime(now)),
        regarding: Some(object.clone()),
        metadata: metadata(object, now),
        reporting_controller: Some(FIELD_MANAGER.to_string()),
        reporting_instance: Some(instance.to_string()),
        type_: Some(if t.warning { "Warning" } else { "Normal" }.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::Status;

    #[test]
    fn an_event_says_which_condition_went_where_and_why() {
        let object = ObjectReference {
            kind: Some("ModelServe".into()),
            name: Some("m".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        let t = Transition {
            type_: "Resolved",
            from: Some("Unknown".into()),
            to: Status::False,
            reason: "NoMatchingQuant".into(),
            message: "é".repeat(2000),
            warning: true,
        };
        let e = event(
            &object,
            &t,
            "op-0",
            Timestamp::from_second(1_800_000_000).unwrap(),
        );
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("NoMatchingQuant"));
        assert!(
            e.note
                .as_ref()
                .unwrap()
                .starts_with("Resolved Unknown -> False: é")
        );
        assert!(e.note.unwrap().len() <= NOTE_BYTES + 3);
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert!(e.metadata.name.unwrap().starts_with("m."));
        assert_eq!(e.regarding.unwrap().kind.as_deref(), Some("ModelServe"));
    }
}
