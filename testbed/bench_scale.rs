//! The operator at scale on the test bed: N ModelServes with replicas 0 (all of one tiny model on
//! the fake Hub), one operator watching their namespace, and per N:
//!
//! - how long until every one has status.stage OnDemand (from the first create);
//! - the operator's RSS, peak (VmHWM) and settled (VmRSS after the idle window);
//! - API requests per minute over an idle window after settling, reads and writes apart: the
//!   operator's own `modelserve_kube_requests_total`, and the API server's
//!   `apiserver_request_total` as a cross-check (every client's, so the test bed's own lease
//!   renewals count there; the modelserve.dev group alone is printed beside it);
//! - change -> observedGeneration latency, p50 and p99: spec.description of K models patched one
//!   by one, each timed until the watch shows its status.observedGeneration at the new generation.
//!
//! Goals (issue 12): 10,000 all OnDemand < 10 min; RSS < 250 MiB; 0 reads and 0 writes per
//! minute idle; p99 < 1 s.
//!
//! It needs the running test bed (`scripts/testbed up`), builds the operator and the fake Hub
//! (`--no-build` skips that), starts the fake Hub, the mirror and one operator per N itself,
//! each N in a namespace of its own, and deletes the namespaces and stops its processes at the
//! end, on failure and on Ctrl-C too.
//!
//!   cargo run --release --example scale-bench -- --models 1000,10000 [--sample 200]
//!       [--idle-secs 60] [--settle-secs 15] [--concurrency 8] [--timeout-mins 20] [--no-build]
//!       [--operator-arg=--concurrency=64 ...]

#[path = "../tests/support/models.rs"]
mod models;
#[path = "bench_scale/procs.rs"]
mod procs;
#[path = "bench_scale/prom.rs"]
mod prom;
#[path = "bench_scale/report.rs"]
mod report;
#[path = "bench_scale/track.rs"]
mod track;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use modelserve::api::ModelServe;
use modelserve::retry::Backoff;

use procs::{Proc, Testbed, free_port};
use prom::Requests;
use report::{OnDemand, Row, minutes};
use track::Tracker;

/// The repository every model serves: the fake Hub names `DIR/scale-Q4_K_M.gguf` so.
const REPO: &str = "modelserve-demo/scale-Q4_K_M-GGUF";
const FIELD_MANAGER: &str = "scale-bench";
/// The operator's request counter (the counting layer on its client).
const OPERATOR_COUNTER: &str = "modelserve_kube_requests_total";
const APISERVER_COUNTER: &str = "apiserver_request_total";

#[derive(Parser, Debug)]
#[command(
    about = "ModelServes at scale on the test bed: time to OnDemand, RSS, idle requests, change latency"
)]
struct Args {
    /// Numbers of ModelServes, one table row each: 100 or 1000,10000.
    #[arg(long, value_delimiter = ',', default_value = "1000",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    models: Vec<u32>,
    /// Models whose spec is changed one by one to time observedGeneration.
    #[arg(long, default_value_t = 200)]
    sample: u32,
    /// Seconds of the idle window whose requests are counted.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    idle_secs: u64,
    /// Seconds to wait after all are OnDemand before the idle window.
    #[arg(long, default_value_t = 15)]
    settle_secs: u64,
    /// Concurrent creates.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    concurrency: u32,
    /// Minutes to wait for all to be OnDemand before moving on without them.
    #[arg(long, default_value_t = 20)]
    timeout_mins: u64,
    /// Use the operator and fake Hub binaries as built, without running cargo build.
    #[arg(long)]
    no_build: bool,
    /// A flag for the operator (repeatable), e.g. --operator-arg=--concurrency=64.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
}

/// Everything started, so it can be stopped whatever happens.
struct Bed {
    testbed: Testbed,
    client: Client,
    logs: PathBuf,
    modelserve: PathBuf,
    hub_url: String,
    mirror_url: String,
    hub: Option<Proc>,
    mirror: Option<Proc>,
    operator: Option<Proc>,
    namespaces: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut rows = Vec::new();
    let result = match setup(&args).await {
        Ok(mut bed) => {
            let outcome = tokio::select! {
                r = run(&args, &mut bed, &mut rows) => r,
                s = interrupted() => Err(format!("stopped by {s}")),
            };
            cleanup(&mut bed).await;
            if outcome.is_ok() {
                let _ = std::fs::remove_dir_all(&bed.logs);
            } else {
                eprintln!("logs kept in {}", bed.logs.display());
            }
            outcome
        }
        Err(e) => Err(e),
    };
    if !rows.is_empty() {
        print!("{}", report::table(&rows));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn interrupted() -> &'static str {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        Some(()) = async { term.as_mut()?.recv().await } => "SIGTERM",
    }
}

/// The test bed, the binaries, a client, and the fake Hub and the mirror running.
async fn setup(args: &Args) -> Result<Bed, String> {
    let testbed = Testbed::find()?;
    if !args.no_build {
        procs::build()?;
    }
    let (modelserve, hub_bin) = procs::binaries()?;
    let kc = kube::config::Kubeconfig::read_from(&testbed.kubeconfig)
        .map_err(|e| format!("cannot read {}: {e}", testbed.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| format!("the test bed's kubeconfig: {e}"))?;
    let client = Client::try_from(config).map_err(|e| format!("no client: {e}"))?;
    if testbed
        .kubectl(&["get", "crd", "modelserves.modelserve.dev"])
        .await
        .is_err()
    {
        let crd = procs::repo_root().join("crds/modelserve.yaml");
        let crd = crd.to_string_lossy();
        testbed
            .kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crd])
            .await?;
        eprintln!("installed the ModelServe CRD (the tests install it too)");
    }
    testbed
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/modelserves.modelserve.dev",
            "--timeout=30s",
        ])
        .await?;

    let logs = std::env::temp_dir().join(format!("scale-bench-{}", std::process::id()));
    let models_dir = logs.join("models");
    std::fs::create_dir_all(&models_dir)
        .map_err(|e| format!("cannot create {}: {e}", models_dir.display()))?;
    std::fs::write(
        models_dir.join("scale-Q4_K_M.gguf"),
        models::Dense::tiny("llama").gguf(),
    )
    .map_err(|e| format!("cannot write the model: {e}"))?;
    let (hub_port, cdn_port, mirror_port) = (free_port()?, free_port()?, free_port()?);
    let hub_addr = format!("127.0.0.1:{hub_port}");
    let mirror_addr = format!("127.0.0.1:{mirror_port}");
    let mut bed = Bed {
        testbed,
        client,
        modelserve,
        hub_url: format!("http://{hub_addr}"),
        mirror_url: format!("http://{mirror_addr}"),
        hub: None,
        mirror: None,
        operator: None,
        namespaces: Vec::new(),
        logs,
    };
    let hub_args = [
        hub_addr.clone(),
        format!("127.0.0.1:{cdn_port}"),
        models_dir.to_string_lossy().into(),
    ];
    let mut hub = Proc::start("fake Hub", &hub_bin, &hub_args, &[], &bed.logs)?;
    let ready = procs::wait_for_port(&mut hub, &hub_addr, Duration::from_secs(30)).await;
    bed.hub = Some(hub);
    if let Err(e) = ready {
        cleanup(&mut bed).await;
        return Err(e);
    }
    let mirror_args = [
        "mirror".to_string(),
        "--dir".into(),
        bed.logs.join("mirror").to_string_lossy().into(),
        "--addr".into(),
        mirror_addr.clone(),
        "--registry-endpoint".into(),
        bed.hub_url.clone(),
        // The benchmark counts the operator's requests; its mirror is on loopback only.
        "--auth".into(),
        "none".into(),
    ];
    let mut mirror = Proc::start("mirror", &bed.modelserve, &mirror_args, &[], &bed.logs)?;
    let ready = procs::wait_for_port(&mut mirror, &mirror_addr, Duration::from_secs(30)).await;
    bed.mirror = Some(mirror);
    if let Err(e) = ready {
        cleanup(&mut bed).await;
        return Err(e);
    }
    Ok(bed)
}

/// Stops the operator, deletes the namespaces (waiting a while for them to go), stops the rest.
async fn cleanup(bed: &mut Bed) {
    if let Some(op) = bed.operator.take() {
        op.stop().await;
    }
    for ns in std::mem::take(&mut bed.namespaces) {
        delete_namespace(&bed.client, &ns).await;
    }
    for p in [bed.mirror.take(), bed.hub.take()].into_iter().flatten() {
        p.stop().await;
    }
}

/// Deletes `ns` and waits up to 10 minutes until it is gone.
async fn delete_namespace(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = api.delete(ns, &DeleteParams::background()).await {
        eprintln!(
            "cannot delete namespace {ns}: {e}; delete it with `kubectl delete namespace {ns}`"
        );
        return;
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        match api.get_opt(ns).await {
            Ok(None) => return,
            Ok(Some(_)) | Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
    eprintln!("namespace {ns} is still terminating after 10 minutes; it goes on by itself");
}

async fn run(args: &Args, bed: &mut Bed, rows: &mut Vec<Row>) -> Result<(), String> {
    for &n in &args.models {
        let row = measure(args, bed, n).await?;
        rows.push(row);
    }
    Ok(())
}

/// One row: a namespace, an operator, `n` models, and every measurement.
async fn measure(args: &Args, bed: &mut Bed, n: u32) -> Result<Row, String> {
    let ns = format!("scale-bench-{}-{n}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(bed.client.clone());
    let object: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
        .map_err(|e| e.to_string())?;
    namespaces
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("cannot create namespace {ns}: {e}"))?;
    bed.namespaces.push(ns.clone());

    let metrics_port = free_port()?;
    let metrics = format!("http://127.0.0.1:{metrics_port}");
    let op_args = [
        "controller".to_string(),
        "--metrics-addr".into(),
        format!("127.0.0.1:{metrics_port}"),
        "--watch-namespace".into(),
        ns.clone(),
        "--registry-endpoint".into(),
        bed.hub_url.clone(),
        "--mirror-url".into(),
        bed.mirror_url.clone(),
    ]
    .into_iter()
    .chain(args.operator_args.iter().cloned())
    .collect::<Vec<_>>();
    let env = [("KUBECONFIG", bed.testbed.kubeconfig.as_path())];
    let mut op = Proc::start("operator", &bed.modelserve, &op_args, &env, &bed.logs)?;
    let ready = procs::wait_for_ok(
        &mut op,
        &format!("{metrics}/readyz"),
        Duration::from_secs(60),
    )
    .await;
    let pid = op.pid().ok_or("the operator has no PID")?;
    bed.operator = Some(op);
    ready?;

    let api: Api<ModelServe> = Api::namespaced(bed.client.clone(), &ns);
    let mut row = Row {
        models: n,
        ..Row::default()
    };
    eprintln!("{n} models in namespace {ns}:");
    let mut tracker = Tracker::start(api.clone());
    tracker.synced(Duration::from_secs(60)).await?;
    row.on_demand = create_all(args, bed, &api, &tracker, n).await?;
    tracker.stop();

    eprintln!(
        "  settling for {}s, then an idle window of {}s",
        args.settle_secs, args.idle_secs
    );
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    let before = counters(bed, &metrics).await;
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let after = counters(bed, &metrics).await;
    let secs = window.elapsed().as_secs_f64();
    let rate = |a: &Option<Requests>, b: &Option<Requests>| {
        Some(a.as_ref()?.per_minute(b.as_ref()?, secs))
    };
    row.operator_idle = rate(&before.0, &after.0);
    row.apiserver_idle = rate(&before.1, &after.1);
    row.apiserver_ours_idle = rate(&before.2, &after.2);
    row.rss_settled = procs::rss(pid).map(|(_, now)| now);

    let mut tracker = Tracker::start(api.clone());
    tracker.synced(Duration::from_secs(120)).await?;
    let k = args.sample.min(n);
    eprintln!("  changing the spec of {k} models one by one");
    for j in 0..k {
        let i = u64::from(j) * u64::from(n) / u64::from(k.max(1));
        let name = model_name(i);
        let patch = serde_json::json!({"spec": {"description": format!("scale-bench change {j}")}});
        let t0 = Instant::now();
        let changed = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("cannot change {ns}/{name}: {e}"))?;
        let generation = changed.metadata.generation.unwrap_or(0);
        match tracker
            .observed(&name, generation, Duration::from_secs(30))
            .await
        {
            Some(at) => row.latencies.push(at.saturating_duration_since(t0)),
            None => row.missed += 1,
        }
    }
    tracker.stop();
    row.rss_peak = procs::rss(pid).map(|(peak, _)| peak);

    if let Some(op) = bed.operator.take() {
        op.stop().await;
    }
    eprintln!("  deleting namespace {ns}");
    bed.namespaces.retain(|x| *x != ns);
    delete_namespace(&bed.client, &ns).await;
    Ok(row)
}

/// `m-00042`
fn model_name(i: u64) -> String {
    format!("m-{i:05}")
}

/// Creates `n` models with a few concurrent clients and waits until all are OnDemand, printing
/// where it stands every 5 seconds.
async fn create_all(
    args: &Args,
    bed: &mut Bed,
    api: &Api<ModelServe>,
    tracker: &Tracker,
    n: u32,
) -> Result<OnDemand, String> {
    let created = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let creating = {
        let (api, created) = (api.clone(), created.clone());
        let concurrency = usize::try_from(args.concurrency).unwrap_or(8);
        tokio::spawn(async move {
            let mut applies = futures::stream::iter(0..u64::from(n))
                .map(|i| {
                    let api = api.clone();
                    async move { apply_model(&api, i).await }
                })
                .buffer_unordered(concurrency);
            while let Some(r) = applies.next().await {
                r?;
                created.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        })
    };
    let _abort = AbortOnDrop(creating.abort_handle());
    let limit = Duration::from_secs(args.timeout_mins.saturating_mul(60));
    let want = usize::try_from(n).unwrap_or(usize::MAX);
    let mut next_report = Instant::now();
    let mut creating = Some(creating);
    loop {
        let (on_demand, failed) = tracker.counts();
        if failed > 0 && on_demand + failed >= want {
            return Err(format!(
                "{failed} of {n} models failed a stage instead of becoming OnDemand, for example {}",
                tracker.a_failure().unwrap_or_default()
            ));
        }
        if on_demand >= want {
            let took = started.elapsed();
            eprintln!("  all {n} OnDemand after {}", minutes(took));
            return Ok(OnDemand::After(took));
        }
        if let Some(op) = bed.operator.as_mut() {
            op.check_alive()?;
        }
        if creating.as_ref().is_some_and(|t| t.is_finished())
            && let Some(task) = creating.take()
        {
            task.await
                .map_err(|e| format!("the creating task failed: {e}"))??;
            eprintln!("  created {n} in {}", minutes(started.elapsed()));
        }
        if started.elapsed() > limit {
            eprintln!(
                "  only {on_demand} of {n} OnDemand after {}; going on",
                minutes(limit)
            );
            return Ok(OnDemand::Partly {
                done: on_demand,
                by: limit,
            });
        }
        if Instant::now() >= next_report {
            eprintln!(
                "  {}: created {}, OnDemand {on_demand}, failed {failed}",
                minutes(started.elapsed()),
                created.load(Ordering::Relaxed)
            );
            next_report += Duration::from_secs(5);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Aborts a spawned task when dropped (the benchmark stopped in the middle).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Server-side applies model `i`, retrying what the API server may refuse for a moment.
async fn apply_model(api: &Api<ModelServe>, i: u64) -> Result<(), String> {
    let name = model_name(i);
    let manifest = serde_json::json!({
        "apiVersion": "modelserve.dev/v1alpha1",
        "kind": "ModelServe",
        "metadata": {"name": name},
        "spec": {"repo": REPO, "replicas": 0, "contextSize": 4096, "contextLength": 4096},
    });
    let backoff = Backoff {
        first: Duration::from_millis(200),
        cap: Duration::from_secs(10),
    };
    let mut failures = 0u32;
    loop {
        match api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&manifest),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => {
                let transient = match &e {
                    kube::Error::Api(s) => s.code == 429 || s.code >= 500,
                    _ => true,
                };
                failures += 1;
                if !transient || failures >= 8 {
                    return Err(format!("cannot create {name}: {e}"));
                }
                tokio::time::sleep(backoff.delay(failures)).await;
            }
        }
    }
}

/// (operator, API server all, API server modelserve.dev) request counters now.
async fn counters(
    bed: &Bed,
    operator_metrics: &str,
) -> (Option<Requests>, Option<Requests>, Option<Requests>) {
    let operator = match reqwest::get(format!("{operator_metrics}/metrics")).await {
        Ok(r) => r.text().await.ok(),
        Err(_) => None,
    };
    let operator =
        operator.and_then(|t| prom::requests(&prom::samples(&t), OPERATOR_COUNTER, |_| true));
    let server = bed
        .testbed
        .kubectl(&["get", "--raw", "/metrics"])
        .await
        .ok();
    let server = server.map(|t| prom::samples(&t)).unwrap_or_default();
    let all = prom::requests(&server, APISERVER_COUNTER, |_| true);
    let ours = prom::requests(&server, APISERVER_COUNTER, |s| {
        s.label("group") == Some("modelserve.dev")
    });
    (operator, all, ours)
}
