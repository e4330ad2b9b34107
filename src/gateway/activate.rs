//! Loading a model for a request. A request that finds no ready replica of an on-demand model
//! at 0 replicas scales it to 1 through the scale subresource; every request for it is then held
//! until a replica is ready, the model fails (its condition turns False), or
//! `--activation-timeout` runs out. Requests arriving together share one scale-up: they take a
//! per-model lock in turn, and the first one's write is seen by the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use super::balance::InFlight;
use super::events::ACTIVATED;
use super::metrics::{ModelLabel, ResultLabel};
use super::openai::ApiError;
use super::routes::{Model, Replica};
use super::{Gateway, idle};
use crate::api::ModelServe;
use crate::units::human_duration;

/// How often a held request looks for a ready replica.
const POLL: Duration = Duration::from_millis(100);
/// Retry-After of a 503 for a model that is loading or failing.
const RETRY_AFTER: u64 = 10;
/// Conditional scale writes tried before giving up (each conflict is another writer's change).
const SCALE_TRIES: u32 = 8;

/// One lock per model: when this gateway last scaled it up.
#[derive(Default)]
pub struct Activations {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Scaled>>>>>,
}

/// This gateway's last scale-up of a model: when, and the model's resourceVersion before it.
#[derive(Clone, Debug)]
struct Scaled {
    when: Instant,
    at: Timestamp,
    before: Option<String>,
}

impl Activations {
    fn lock_of(&self, key: &str) -> Arc<tokio::sync::Mutex<Option<Scaled>>> {
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() > 4096 {
            m.retain(|_, l| Arc::strong_count(l) > 1);
        }
        m.entry(key.to_string()).or_default().clone()
    }
}

/// A ready replica for `model`, loading the model first when it is on demand and at 0.
pub async fn replica(
    gw: &Gateway,
    model: &Model,
    started: Instant,
) -> Result<(Replica, InFlight), ApiError> {
    if let Some(r) = pick(gw, model) {
        return Ok(r);
    }
    let mut since = None;
    let current = latest(gw, model);
    if current.spec.replicas == 0 {
        if current.spec.on_demand.is_none() {
            return Err(ApiError::unavailable(
                "model_not_loaded",
                format!(
                    "{} ({}) is at 0 replicas and not on demand: set spec.onDemand to let the gateway load it on a request, or scale it with `kubectl scale modelserve/{} -n {} --replicas=1`",
                    model.served(),
                    model.key(),
                    model.name,
                    model.namespace
                ),
                RETRY_AFTER,
            ));
        }
        let deadline = tokio::time::Instant::from_std(started + gw.config.activation_timeout);
        since = Some(
            tokio::time::timeout_at(deadline, activate(gw, model))
                .await
                .map_err(|_| {
                    ApiError::unavailable(
                        "activation_failed",
                        format!(
                            "cannot scale {} ({}) up from 0 replicas within {}: the API server did not answer",
                            model.served(),
                            model.key(),
                            human_duration(gw.config.activation_timeout)
                        ),
                        RETRY_AFTER,
                    )
                })??,
        );
    }
    hold(gw, model, started, since).await
}

/// An activation as one request saw it: when its hold began, and whether this request's write
/// scaled the model up (the others share it).
#[derive(Clone, Copy, Debug)]
pub struct Activation {
    pub at: Timestamp,
    pub scaled: bool,
}

fn pick(gw: &Gateway, model: &Model) -> Option<(Replica, InFlight)> {
    gw.balancer
        .pick(gw.views.replicas.get().of(model.key()), &[])
}

/// The model as the gateway sees it now.
fn latest(gw: &Gateway, model: &Model) -> Arc<ModelServe> {
    gw.views
        .models
        .get()
        .get(model.key())
        .map_or_else(|| model.object.clone(), |m| m.object.clone())
}

/// Scales the model from 0 to 1 unless it is not at 0 any more.
async fn activate(gw: &Gateway, model: &Model) -> Result<Activation, ApiError> {
    let lock = gw.activations.lock_of(model.key());
    let mut last = lock.lock().await;
    if let Some(l) = last.as_ref()
        && l.when.elapsed() < gw.config.activation_timeout
    {
        // This gateway scaled it up a moment ago: that scale-up is this request's too, unless
        // the model has been scaled back to 0 since (the watch shows a newer object at 0).
        let seen = latest(gw, model);
        if seen.spec.replicas > 0 || seen.metadata.resource_version == l.before {
            return Ok(Activation {
                at: l.at,
                scaled: false,
            });
        }
    }
    let now = Timestamp::now();
    let shared = Ok(Activation {
        at: now,
        scaled: false,
    });
    let api: Api<ModelServe> = Api::namespaced(gw.client.clone(), &model.namespace);
    let failed = |e: kube::Error| {
        ApiError::unavailable(
            "activation_failed",
            format!(
                "cannot scale {} ({}) up from 0 replicas: {e}",
                model.served(),
                model.key()
            ),
            RETRY_AFTER,
        )
    };
    // The resourceVersion makes the write conditional: of two gateways scaling at once, one
    // wins and the other reads the model again and finds it scaled. A 409 may also be the
    // controller's status write in between, so it is read again rather than assumed scaled.
    let mut tries = 0;
    let mut before;
    loop {
        tries += 1;
        let scale = api.get_scale(&model.name).await.map_err(failed)?;
        if scale.spec.and_then(|s| s.replicas).unwrap_or(0) > 0 {
            return shared;
        }
        before = scale.metadata.resource_version.clone();
        match super::events::scale(&api, &model.name, scale.metadata.resource_version, 1).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && tries < SCALE_TRIES => continue,
            Err(e) => return Err(failed(e)),
        }
    }
    *last = Some(Scaled {
        when: Instant::now(),
        at: now,
        before,
    });
    tracing::info!(model = %model.key(), "activated: scaled from 0 to 1 replica for a request");
    let note = format!(
        "A request for {} found it at 0 replicas; the gateway scaled it to 1",
        model.served()
    );
    let (events, ms) = (gw.events.clone(), model.object.clone());
    tokio::spawn(async move { events.publish(&ms, ACTIVATED, note).await });
    idle::record(gw, model, idle::Mark::Activated(Time(now)));
    Ok(Activation {
        at: now,
        scaled: true,
    })
}

/// Holds the request until a replica of `model` is ready, or says why none came.
async fn hold(
    gw: &Gateway,
    model: &Model,
    started: Instant,
    activated: Option<Activation>,
) -> Result<(Replica, InFlight), ApiError> {
    let scaled = activated.is_some_and(|a| a.scaled);
    let deadline = started + gw.config.activation_timeout;
    let label = || ResultLabel {
        namespace: model.namespace.clone(),
        model: model.name.clone(),
        result: String::new(),
    };
    let count = |result: &str| {
        if scaled {
            gw.metrics
                .activations
                .get_or_create(&ResultLabel {
                    result: result.into(),
                    ..label()
                })
                .inc();
        }
    };
    loop {
        if let Some(r) = pick(gw, model) {
            if scaled {
                count("ready");
                gw.metrics
                    .activation_seconds
                    .get_or_create(&ModelLabel {
                        namespace: model.namespace.clone(),
                        model: model.name.clone(),
                    })
                    .observe(started.elapsed().as_secs_f64());
            }
            return Ok(r);
        }
        let current = latest(gw, model);
        let why = not_ready(&current, activated.map(|a| a.at));
        if why.failed {
            count("failed");
            return Err(ApiError::unavailable(
                "model_failed",
                format!(
                    "{} ({}) has no ready replica: {}",
                    model.served(),
                    model.key(),
                    why.message
                ),
                RETRY_AFTER,
            ));
        }
        if Instant::now() >= deadline {
            count("timeout");
            return Err(ApiError::unavailable(
                "model_not_ready",
                format!(
                    "{} ({}) had no ready replica within {}: {}",
                    model.served(),
                    model.key(),
                    human_duration(gw.config.activation_timeout),
                    why.message
                ),
                RETRY_AFTER,
            ));
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// Why a model has no ready replica, from its conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    /// A condition is False: waiting longer will not help.
    pub failed: bool,
    pub message: String,
}

/// The first False condition (when it turned False after `since`, the activation: an older
/// one is what the last load found), else the condition of the stage now running.
pub fn not_ready(ms: &ModelServe, since: Option<Timestamp>) -> NotReady {
    let Some(status) = ms.status.as_ref() else {
        return NotReady {
            failed: false,
            message: "the controller has not looked at it yet".into(),
        };
    };
    let fresh = |t: &Time| since.is_none_or(|s| t.0.as_second() + 1 >= s.as_second());
    let order = crate::pipeline::Stage::ALL.map(|s| s.condition());
    let in_order = order
        .iter()
        .filter_map(|t| status.conditions.iter().find(|c| c.type_ == *t));
    let say = |c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
        format!("{} is {} ({}): {}", c.type_, c.status, c.reason, c.message)
    };
    if let Some(c) = in_order
        .clone()
        .find(|c| c.status == "False" && fresh(&c.last_transition_time))
    {
        return NotReady {
            failed: true,
            message: say(c),
        };
    }
    let running = status
        .stage
        .as_deref()
        .and_then(|s| {
            crate::pipeline::Stage::ALL
                .into_iter()
                .find(|x| x.name() == s)
        })
        .and_then(|s| status.conditions.iter().find(|c| c.type_ == s.condition()))
        .or_else(|| in_order.clone().find(|c| c.status != "True"));
    NotReady {
        failed: false,
        message: match running {
            Some(c) => say(c),
            None => "its replica is starting".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_conditions(stage: &str, conds: &[(&str, &str, &str, &str, i64)]) -> ModelServe {
        let conditions: Vec<serde_json::Value> = conds
            .iter()
            .map(|(t, s, r, m, at)| {
                serde_json::json!({"type": t, "status": s, "reason": r, "message": m,
                    "lastTransitionTime": Timestamp::from_second(*at).unwrap().to_string()})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "modelserve.dev/v1alpha1", "kind": "ModelServe",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"repo": "o/r"},
            "status": {"stage": stage, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_placement_failure_after_the_activation_fails_the_hold_in_the_schedulers_words() {
        let ms = with_conditions(
            "Place",
            &[
                ("Cataloged", "True", "Cataloged", "ok", 100),
                (
                    "Placed",
                    "False",
                    "Unschedulable",
                    "0/3 nodes are available: 3 Insufficient memory.",
                    200,
                ),
            ],
        );
        let w = not_ready(&ms, Some(Timestamp::from_second(150).unwrap()));
        assert!(w.failed);
        assert!(w.message.contains("Insufficient memory"), "{w:?}");
        // The same failure from before this activation is what the last load found.
        let old = not_ready(&ms, Some(Timestamp::from_second(300).unwrap()));
        assert!(!old.failed);
    }

    #[test]
    fn a_model_still_loading_names_the_stage_that_runs() {
        let ms = with_conditions(
            "Place",
            &[
                ("Cataloged", "True", "Cataloged", "ok", 100),
                (
                    "Placed",
                    "Unknown",
                    "WaitingForReplica",
                    "m-a is Pending: waiting for the scheduler",
                    200,
                ),
            ],
        );
        let w = not_ready(&ms, None);
        assert!(!w.failed);
        assert!(
            w.message
                .starts_with("Placed is Unknown (WaitingForReplica)"),
            "{w:?}"
        );
    }
}
