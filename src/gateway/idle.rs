//! When a model was last asked for, shared by every gateway replica through the ModelServe's
//! `status.demand`, and the scale-down of on-demand models idle for `idleAfter`.
//!
//! A replica writes `lastRequestAt` when a request arrives and, while requests are in flight,
//! again at least every quarter of `idleAfter` (at most four times a second, and once a minute for a
//! model that is not on demand, for `kubectl get`). A model is idle when no gateway has written
//! for `idleAfter`, this one has nothing in flight, and it has been up that long; then its
//! replicas go to 0 through the scale subresource, conditional on the resourceVersion the
//! decision read, so a request time written meanwhile by another replica wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::Patch;

use super::Gateway;
use super::events::SCALED_TO_ZERO;
use super::metrics::ModelLabel;
use super::routes::Model;
use crate::api::ModelServe;
use crate::units::human_duration;

/// What the gateway records in `status.demand`.
pub enum Mark {
    Request(Time),
    Activated(Time),
    ScaledToZero(Time),
}

/// When this replica last wrote a model's request time.
#[derive(Default)]
pub struct Heartbeats {
    written: Mutex<HashMap<String, Instant>>,
}

/// How often the request time of `ms` is written while it is asked for.
pub fn heartbeat(ms: &ModelServe) -> Duration {
    match ms.spec.on_demand.as_ref().map(|o| o.idle_after()) {
        Some(Ok(idle)) => (idle / 4).clamp(Duration::from_millis(250), Duration::from_secs(60)),
        _ => Duration::from_secs(60),
    }
}

/// Records that `model` is asked for now, unless this replica did within a heartbeat.
pub fn touch(gw: &Gateway, model: &Model) {
    let every = heartbeat(&model.object);
    {
        let mut w = gw.idle.written.lock().unwrap_or_else(|e| e.into_inner());
        if w.get(model.key()).is_some_and(|t| t.elapsed() < every) {
            return;
        }
        if w.len() > 4096 {
            w.retain(|_, t| t.elapsed() < Duration::from_secs(600));
        }
        w.insert(model.key().to_string(), Instant::now());
    }
    record(gw, model, Mark::Request(Time(Timestamp::now())));
}

/// Writes `mark` into the model's `status.demand`, in the background: a merge patch of the
/// gateway's own fields, which the controller never writes.
pub fn record(gw: &Gateway, model: &Model, mark: Mark) {
    let demand = match mark {
        Mark::Request(t) => serde_json::json!({"lastRequestAt": t}),
        Mark::Activated(t) => serde_json::json!({"lastRequestAt": t, "activatedAt": t}),
        Mark::ScaledToZero(t) => serde_json::json!({"scaledToZeroAt": t}),
    };
    let api: Api<ModelServe> = Api::namespaced(gw.client.clone(), &model.namespace);
    let name = model.name.clone();
    tokio::spawn(async move {
        let patch = serde_json::json!({"status": {"demand": demand}});
        if let Err(e) = api
            .patch_status(&name, &super::events::patch_params(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(model = %name, error = %e, "cannot record the request time");
        }
    });
}

fn seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// The latest moment the model was in use: a request time or activation any gateway recorded,
/// the last request this one saw, or when it came up.
pub fn last_use(ms: &ModelServe, seen_ago: Option<Duration>, up_since: f64, now: f64) -> f64 {
    let d = ms.status.as_ref().and_then(|s| s.demand.as_ref());
    [
        d.and_then(|d| d.last_request_at.as_ref()),
        d.and_then(|d| d.activated_at.as_ref()),
    ]
    .into_iter()
    .flatten()
    .map(|t| seconds(t.0))
    .chain(seen_ago.map(|a| now - a.as_secs_f64()))
    .fold(up_since, f64::max)
}

/// Checks every on-demand model each `--idle-check`, until the process ends.
pub async fn run(gw: Arc<Gateway>) {
    // When this replica first saw each model with replicas above 0.
    let mut up_since: HashMap<String, f64> = HashMap::new();
    let mut tick = tokio::time::interval(gw.config.idle_check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !gw.views.synced() {
            continue;
        }
        let idx = gw.views.models.get();
        let now = seconds(Timestamp::now());
        for m in idx.all() {
            let seen = gw.demand.seen(m.key());
            if seen.is_some_and(|s| s.in_flight > 0) {
                touch(&gw, m);
            }
            let Some(Ok(idle_after)) = m.object.spec.on_demand.as_ref().map(|o| o.idle_after())
            else {
                continue;
            };
            if m.object.spec.replicas == 0 {
                up_since.remove(m.key());
                continue;
            }
            let since = *up_since.entry(m.key().to_string()).or_insert(now);
            if seen.is_some_and(|s| s.in_flight > 0) {
                continue;
            }
            let last = last_use(&m.object, seen.map(|s| s.last.elapsed()), since, now);
            if now - last >= idle_after.as_secs_f64() {
                scale_down(&gw, m, idle_after, since).await;
            }
        }
        up_since.retain(|k, _| idx.get(k).is_some());
        gw.demand.retain(|k| idx.get(k).is_some());
    }
}

/// Scales an idle model to 0, reading it afresh: a request time another replica wrote since the
/// index was built keeps it up, and the write is conditional on what was read. `up_since` is
/// when this replica first saw it up: a model no gateway ever recorded a request for (scaled up
/// by a person) is idle from then.
async fn scale_down(gw: &Gateway, model: &Model, idle_after: Duration, up_since: f64) {
    let api: Api<ModelServe> = Api::namespaced(gw.client.clone(), &model.namespace);
    let ms = match api.get(&model.name).await {
        Ok(ms) => ms,
        Err(e) => {
            tracing::warn!(model = %model.key(), error = %e, "cannot read the model to scale it down");
            return;
        }
    };
    let now = seconds(Timestamp::now());
    let seen = gw.demand.seen(model.key());
    if ms.spec.replicas == 0 || seen.is_some_and(|s| s.in_flight > 0) {
        return;
    }
    let last = last_use(&ms, seen.map(|s| s.last.elapsed()), up_since, now);
    if now - last < idle_after.as_secs_f64() {
        return;
    }
    match super::events::scale(&api, &model.name, ms.metadata.resource_version.clone(), 0).await {
        Ok(_) => {}
        // Changed since it was read (a request time, a scale): decided again next time.
        Err(kube::Error::Api(e)) if e.code == 409 => return,
        Err(e) => {
            tracing::warn!(model = %model.key(), error = %e, "cannot scale an idle model down");
            return;
        }
    }
    let idle =
        human_duration(Duration::try_from_secs_f64((now - last).max(0.0)).unwrap_or(idle_after));
    tracing::info!(model = %model.key(), %idle, "scaled to 0 replicas: idle");
    gw.metrics
        .scale_downs
        .get_or_create(&ModelLabel {
            namespace: model.namespace.clone(),
            model: model.name.clone(),
        })
        .inc();
    let note = format!(
        "No request for {idle} (spec.onDemand.idleAfter {}); the gateway scaled {} to 0 replicas",
        human_duration(idle_after),
        model.served()
    );
    gw.events.publish(&ms, SCALED_TO_ZERO, note).await;
    record(gw, model, Mark::ScaledToZero(Time(Timestamp::now())));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(idle: Option<&str>, last_request: Option<i64>) -> ModelServe {
        let mut spec = serde_json::json!({"repo": "o/r", "replicas": 1});
        if let Some(i) = idle {
            spec["onDemand"] = serde_json::json!({"idleAfter": i});
        }
        let mut ms = ModelServe::new("m", serde_json::from_value(spec).unwrap());
        if let Some(at) = last_request {
            ms.status = Some(crate::api::ModelServeStatus {
                demand: Some(crate::api::DemandStatus {
                    last_request_at: Some(Time(Timestamp::from_second(at).unwrap())),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        ms
    }

    #[test]
    fn the_heartbeat_is_a_quarter_of_idle_after_within_a_quarter_second_and_a_minute() {
        assert_eq!(heartbeat(&model(Some("20s"), None)), Duration::from_secs(5));
        assert_eq!(
            heartbeat(&model(Some("2s"), None)),
            Duration::from_millis(500)
        );
        assert_eq!(
            heartbeat(&model(Some("1s"), None)),
            Duration::from_millis(250)
        );
        assert_eq!(heartbeat(&model(Some("1h"), None)), Duration::from_secs(60));
        assert_eq!(heartbeat(&model(None, None)), Duration::from_secs(60));
    }

    #[test]
    fn the_last_use_is_the_latest_of_what_any_gateway_recorded_and_this_one_saw() {
        let ms = model(Some("10s"), Some(1000));
        // Another gateway's request time is the latest.
        assert_eq!(last_use(&ms, None, 900.0, 1005.0), 1000.0);
        // This gateway's own request, 1s ago, is later.
        assert_eq!(
            last_use(&ms, Some(Duration::from_secs(1)), 900.0, 1005.0),
            1004.0
        );
        // A model that came up after its last request counts from when it came up.
        assert_eq!(last_use(&ms, None, 1003.0, 1005.0), 1003.0);
    }
}
