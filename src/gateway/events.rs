//! Events the gateway writes on a ModelServe: one per activation (scale from 0 for a request)
//! and one per scale-down to 0 after idleAfter, so `kubectl describe` tells when and why the
//! model was loaded or unloaded; and the writes that cause them: the conditional scale, under
//! the gateway's field manager.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client, Resource};

use crate::api::ModelServe;

/// The reportingController of the gateway's Events and the field manager of its writes.
pub const GATEWAY: &str = "modelserve-gateway";
/// The Event reasons.
pub const ACTIVATED: &str = "Activated";
pub const SCALED_TO_ZERO: &str = "ScaledToZero";

/// Writes the gateway's Events.
#[derive(Clone)]
pub struct Publisher {
    client: Client,
    instance: String,
}

impl Publisher {
    pub fn new(client: Client) -> Publisher {
        Publisher {
            client,
            instance: std::env::var("POD_NAME")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| GATEWAY.into()),
        }
    }

    /// Publishes `reason` with `note` about `ms`; a failure is logged, never the request's.
    pub async fn publish(&self, ms: &ModelServe, reason: &str, note: String) {
        let object = ms.object_ref(&());
        let ns = object.namespace.clone().unwrap_or_else(|| "default".into());
        let e = event(&object, reason, &note, &self.instance, Timestamp::now());
        if let Err(err) = Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &e)
            .await
        {
            tracing::warn!(error = %err, %reason, "could not publish an Event");
        }
    }
}

/// The Event `reason` of `object` at `now`.
pub fn event(
    object: &ObjectReference,
    reason: &str,
    note: &str,
    instance: &str,
    now: Timestamp,
) -> Event {
    Event {
        action: Some("Scale".into()),
        reason: Some(reason.into()),
        note: Some(crate::conditions::truncate(note, 1000)),
        event_time: Some(MicroTime(now)),
        regarding: Some(object.clone()),
        metadata: crate::controller::events::metadata(object, now),
        reporting_controller: Some(GATEWAY.into()),
        reporting_instance: Some(instance.into()),
        type_: Some("Normal".into()),
        ..Default::default()
    }
}

/// The parameters of the gateway's patches: its field manager.
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(GATEWAY.into()),
        ..Default::default()
    }
}

/// Sets the model's `spec.replicas` through the scale subresource, only if it is still at
/// `resource_version` (a 409 otherwise): of two writers that read the same version, one wins.
pub async fn scale(
    api: &kube::Api<crate::api::ModelServe>,
    name: &str,
    resource_version: Option<String>,
    replicas: i32,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "spec": {"replicas": replicas},
    });
    api.patch_scale(name, &patch_params(), &kube::api::Patch::Merge(&patch))
        .await
        .map(|_| ())
}
