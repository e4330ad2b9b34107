//! The ModelServe controller: reconcile() runs the pipeline and writes status once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::Mutex;
use tracing::{Instrument, info, warn};

use crate::Error;
use crate::api::{ModelServe, ModelServeStatus};
use crate::conditions::{self, Clock, Status, SystemClock, Transition};
use crate::pipeline::{self, Report};
use crate::telemetry::{self, Health, Metrics, ReasonLabel, ResultLabel, StageLabel};

/// The one field manager every status write uses.
pub const FIELD_MANAGER: &str = "modelserve-controller";

/// Settings of `modelserve controller`.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "MODELSERVE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "MODELSERVE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Model registry speaking the Hugging Face Hub API (like HF_ENDPOINT); point it at an internal mirror if the cluster has no internet.
    #[arg(long, env = "MODELSERVE_REGISTRY_ENDPOINT", default_value = crate::hub::DEFAULT_ENDPOINT)]
    pub registry_endpoint: String,
    /// Secret (NAMESPACE/NAME, key "token") with the registry token used when a ModelServe names none.
    #[arg(long, env = "MODELSERVE_DEFAULT_TOKEN_SECRET")]
    pub default_token_secret: Option<String>,
    /// llama.cpp server image of the replicas, pinned by build (its tag names the build).
    #[arg(long, env = "MODELSERVE_ENGINE_IMAGE", default_value = DEFAULT_ENGINE_IMAGE)]
    pub engine_image: String,
    /// The cluster's model mirror (`modelserve mirror`), e.g. http://modelserve-mirror:8090.
    #[arg(long, env = "MODELSERVE_MIRROR_URL")]
    pub mirror_url: Option<String>,
    /// The llama.cpp build the nodes run, when the image tag does not say (for example `latest`).
    #[arg(long, env = "MODELSERVE_ENGINE_BUILD", value_parser = parse_build)]
    pub engine_build: Option<u32>,
    /// Image of the replicas' init container that copies the model from the mirror (`modelserve pull`).
    #[arg(long, env = "MODELSERVE_PULL_IMAGE", default_value = DEFAULT_PULL_IMAGE)]
    pub pull_image: String,
    /// How long a replica may stay unschedulable before the Place stage reports it (the scheduler keeps retrying; a cluster autoscaler may add a node), e.g. 60s, 5m.
    #[arg(long, env = "MODELSERVE_PLACE_GRACE", default_value = "60s", value_parser = parse_duration)]
    pub place_grace: Duration,
    /// How long a new replica may take to become ready, copying the model included, before the Place stage gives up, e.g. 30m, 2h.
    #[arg(long, env = "MODELSERVE_PLACE_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    pub place_timeout: Duration,
    /// Restarts a replica's container may have before the Place stage reports a crash loop.
    #[arg(long, env = "MODELSERVE_CRASH_RESTARTS", default_value_t = 3, value_parser = clap::value_parser!(i32).range(0..))]
    pub crash_restarts: i32,
}

/// The default image of `modelserve pull`: this very version of modelserve.
pub const DEFAULT_PULL_IMAGE: &str =
    concat!("ghcr.io/modelserve/modelserve:", env!("CARGO_PKG_VERSION"));

/// The default llama.cpp server image.
pub const DEFAULT_ENGINE_IMAGE: &str = "ghcr.io/ggml-org/llama.cpp:server-b10587";

/// A duration as `90s`, `5m`, `1h30m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as 90s, 5m or 1h30m");
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let (mut total, mut digits) = (0u64, String::new());
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        digits.clear();
    }
    if !digits.is_empty() || s.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

fn parse_build(s: &str) -> Result<u32, String> {
    s.trim_start_matches('b')
        .parse()
        .map_err(|_| format!("{s:?} is not a llama.cpp build number such as b6500"))
}

/// Per-object attempt counters of transient failures, reset on success.
#[derive(Default)]
pub struct Retries(Mutex<HashMap<String, u32>>);

impl Retries {
    /// Counts one more attempt and returns the count.
    pub async fn bump(&self, key: &str) -> u32 {
        let mut m = self.0.lock().await;
        let n = m.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub async fn reset(&self, key: &str) {
        self.0.lock().await.remove(key);
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub config: Config,
    pub retries: Retries,
    /// HTTP client for the mirror.
    pub http: reqwest::Client,
    failures: Mutex<HashMap<ObjectRef<ModelServe>, u32>>,
}

/// Runs the controller until SIGTERM or Ctrl-C.
pub async fn run(config: Config) -> Result<(), Error> {
    crate::hub::Hub::new(&config.registry_endpoint, None).map_err(|e| Error::BadFlag {
        flag: "--registry-endpoint",
        message: e.to_string(),
    })?;
    let (client, url) = connect().await?;
    ensure_crd_installed(&client, &url, config.watch_namespace.as_deref()).await?;

    let metrics = Arc::new(Metrics::default());
    let health = Health {
        ready: Default::default(),
        metrics: metrics.clone(),
    };
    let server = tokio::spawn(telemetry::serve(config.metrics_addr, health.clone()));

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let api: Api<ModelServe> = match &config.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    // A Deployment's change (scaled by hand, a replica ready or gone) reconciles its ModelServe.
    let deployments: Api<Deployment> = match &config.watch_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        metrics,
        clock: Arc::new(SystemClock),
        config,
        retries: Retries::default(),
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| Error::Config(e.to_string()))?,
        failures: Mutex::default(),
    });
    health.ready.store(true, Ordering::Relaxed);
    info!("controller started");
    // Only a new generation (a spec change, or a new object) triggers a reconcile from the
    // ModelServe watch: our own status writes do not, so progress is written at the pace the
    // stages ask for (every few seconds while mirroring), not once per byte batch.
    let (reader, writer) = reflector::store();
    let models = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let controller = Controller::for_stream(models, reader)
        .owns(
            deployments,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=modelserve"),
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        _ = controller => Ok(()),
        r = server => match r {
            Ok(Err(e)) => Err(e),
            _ => Ok(()),
        },
    }
}

/// A client from the kubeconfig or the in-cluster configuration, and the server's URL.
pub async fn connect() -> Result<(Client, String), Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    Ok((client, url))
}

/// Fails with a clear message when the CRD is missing or the API server cannot be reached.
/// Lists in the watched namespace only, so a namespace-scoped install (a Role) passes.
pub async fn ensure_crd_installed(
    client: &Client,
    url: &str,
    namespace: Option<&str>,
) -> Result<(), Error> {
    let api: Api<ModelServe> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Error::CrdMissing),
        Err(e) => Err(Error::Unreachable {
            url: url.to_string(),
            source: e,
        }),
    }
}

async fn reconcile(ms: Arc<ModelServe>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!("reconcile", namespace = %ms.namespace().unwrap_or_default(), name = %ms.name_any());
    let started = Instant::now();
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
    if result.is_ok() {
        ctx.failures
            .lock()
            .await
            .remove(&ObjectRef::from(ms.as_ref()));
    }
    result
}

async fn reconcile_inner(ms: &ModelServe, ctx: &Context) -> Result<Action, Error> {
    let old = ms.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let report = pipeline::run(ctx, ms, &mut status).await?;
    let (status, transitions) = next_status(status, &report, ms, ctx.clock.as_ref());
    if status != old {
        write_status(ctx, ms, &status).await?;
    }
    for t in &transitions {
        if t.to == Status::True
            && let Some(secs) = stage_seconds(ms, &status, t.type_, ctx.clock.as_ref())
        {
            ctx.metrics
                .stage_seconds
                .get_or_create(&StageLabel {
                    stage: t.type_.into(),
                })
                .observe(secs);
        }
        publish(ctx, ms, t).await;
    }
    Ok(match report.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
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
        transitions.extend(conditions::set(
            &mut status.conditions,
            desired,
            generation,
            clock,
        ));
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
        Api::namespaced(ctx.client.clone(), &ms.namespace().unwrap_or_default());
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
    if let Some(stage) = &status.stage {
        ctx.metrics.model_stage(
            &format!("{}/{}", ms.namespace().unwrap_or_default(), ms.name_any()),
            stage,
        );
    }
    Ok(())
}

async fn publish(ctx: &Context, ms: &ModelServe, t: &Transition) {
    ctx.metrics
        .transitions
        .get_or_create(&StageLabel {
            stage: t.type_.into(),
        })
        .inc();
    let type_ = if t.warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let from = t.from.as_deref().unwrap_or("unset");
    let event = Event {
        type_,
        reason: t.reason.clone(),
        note: Some(truncate_note(&format!(
            "{} {} -> {}: {}",
            t.type_,
            from,
            t.to.as_str(),
            t.message
        ))),
        action: t.type_.into(),
        secondary: None,
    };
    // An Event that cannot be written must not fail the reconcile that already wrote status.
    if let Err(e) = ctx.recorder.publish(&event, &ms.object_ref(&())).await {
        warn!(error = %e, "could not publish Event");
    }
}

fn truncate_note(s: &str) -> String {
    let mut end = s.len().min(1000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn error_policy(ms: Arc<ModelServe>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .errors
        .get_or_create(&ReasonLabel {
            reason: error.reason().into(),
        })
        .inc();
    warn!(name = %ms.name_any(), reason = error.reason(), error = %error, "reconcile failed; retrying");
    let key = ObjectRef::from(ms.as_ref());
    // error_policy is sync; try_lock keeps it so, and a contended lock just uses the first step.
    let n = match ctx.failures.try_lock() {
        Ok(mut f) => {
            let n = f.entry(key).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    Action::requeue(backoff(n))
}

/// Capped exponential backoff: 1 s, 2 s, 4 s ... up to 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u64::MAX);
    Duration::from_secs(secs.min(300))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelServeSpec;
    use crate::conditions::FixedClock;
    use crate::pipeline::{Outcome, Stage};
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

    fn not_built() -> Report {
        pipeline::decide(&[(Stage::Resolve, Outcome::NotImplemented)], 1)
    }

    #[test]
    fn first_reconcile_sets_six_stages_plus_ready_and_observed_generation() {
        let (s, transitions) = next_status(Default::default(), &not_built(), &model(3), &at(0));
        assert_eq!(s.conditions.len(), 7);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.stage.as_deref(), Some("Resolve"));
        assert_eq!(
            conditions::get(&s.conditions, "Ready").unwrap().status,
            "False"
        );
        assert_eq!(transitions.len(), 7, "every new condition is an Event");
    }

    /// The Events a first reconcile publishes after Resolve ended with `outcome`: (type, warning).
    fn events_after(outcome: Outcome) -> Vec<(&'static str, bool)> {
        let report = pipeline::decide(&[(Stage::Resolve, outcome)], 1);
        let (_, transitions) = next_status(Default::default(), &report, &model(1), &at(0));
        transitions.iter().map(|t| (t.type_, t.warning)).collect()
    }

    #[test]
    fn a_rollout_in_progress_warns_of_nothing_and_a_failed_stage_warns() {
        let waiting = events_after(Outcome::Waiting {
            reason: "Resolving".into(),
            message: "asking the Hub".into(),
            after: Duration::from_secs(5),
        });
        assert!(waiting.iter().all(|(_, w)| !w), "{waiting:?}");

        let failed = events_after(Outcome::Failed {
            reason: "GatedRepo".into(),
            message: "accept the license".into(),
            retry: None,
        });
        assert!(failed.contains(&("Resolved", true)), "{failed:?}");
        assert!(failed.contains(&("Ready", true)), "{failed:?}");
    }

    #[test]
    fn nothing_to_write_when_only_time_moved() {
        let (first, _) = next_status(Default::default(), &not_built(), &model(1), &at(0));
        let (second, transitions) = next_status(first.clone(), &not_built(), &model(1), &at(3600));
        assert_eq!(
            first, second,
            "a later clock alone must not change status, or the write wakes the controller forever"
        );
        assert!(transitions.is_empty());
    }

    #[test]
    fn a_new_generation_is_written() {
        let (first, _) = next_status(Default::default(), &not_built(), &model(1), &at(0));
        let (second, _) = next_status(first.clone(), &not_built(), &model(2), &at(10));
        assert_ne!(first, second);
        assert!(
            second
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(2))
        );
    }

    #[test]
    fn durations_parse_as_flags_write_them() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        for bad in ["", "m", "5x", "1.5h", "-3s", "5m3"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(40), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
    }
}
