//! Two operators on one Lease against the test bed: one leads and writes, the other stands by and
//! writes nothing; SIGKILL the leader while a model is mirroring and the standby finishes its
//! pipeline; a leader whose Lease is taken stops at once.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use modelserve::api::ModelServe;
use support::fake_hub::FakeHub;
use support::pod_runner::PodRunner;
use support::{Operator, Testbed, condition, eventually, start_mirror, start_mirror_with};

const LEASE_SECS: u64 = 6;

fn operator(tb: &Testbed, ns: &str, hub: &str, mirror: &str) -> Operator {
    Operator::start_with(
        tb,
        ns,
        hub,
        &[
            "--mirror-url",
            mirror,
            "--lease-duration",
            &format!("{LEASE_SECS}s"),
            "--place-grace",
            "20s",
        ],
    )
}

/// Waits until the operator's /readyz body contains `role`.
async fn until_role(op: &Operator, role: &str) {
    let got = eventually(Duration::from_secs(60), async || {
        let (code, body) = op.get("/readyz").await?;
        (code == 200 && body.starts_with(role)).then_some(())
    })
    .await;
    assert!(
        got.is_some(),
        "/readyz never said {role:?}: {:?}",
        op.get("/readyz").await
    );
}

/// Requests that change something (create, apply, patch, update, delete) the operator sent to
/// the API server, by resource, leaving out its own Lease.
async fn writes(op: &Operator) -> Vec<(String, u64)> {
    let (_, text) = op.get("/metrics").await.expect("metrics");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("modelserve_kube_requests_total{")?;
            let (labels, n) = rest.split_once("} ")?;
            let verb = labels.split("verb=\"").nth(1)?.split('"').next()?;
            let resource = labels.split("resource=\"").nth(1)?.split('"').next()?;
            let n: u64 = n.trim().parse().ok()?;
            (!matches!(verb, "get" | "list" | "watch") && !resource.starts_with("leases") && n > 0)
                .then(|| (format!("{verb} {resource}"), n))
        })
        .collect()
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get("modelserve-operator")
        .await
        .ok()?
        .spec?
        .holder_identity
}

#[tokio::test]
async fn the_standby_finishes_the_pipeline_when_the_leader_is_killed_mid_mirror() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("leader");
    let hub = FakeHub::with_tiny_llama().await;
    let size = hub.file_size("acme/TinyLlama-GGUF", "tinyllama-Q4_K_M.gguf");
    // About six seconds of mirroring, so the leader dies with the download under way.
    hub.throttle((size / 6).max(1));
    // The throttled CDN sends 64 KiB pieces seconds apart: a read timeout above that.
    let policy = modelserve::mirror::fetch::Policy {
        read_timeout: Duration::from_secs(10),
        ..support::test_policy()
    };
    let (mirror_url, _mirror) = start_mirror_with(&hub.url, policy).await;
    let _runner = PodRunner::start(&tb, &ns.name);
    let client = tb.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let api: Api<ModelServe> = Api::namespaced(client, &ns.name);

    let mut first = operator(&tb, &ns.name, &hub.url, &mirror_url);
    until_role(&first, "ok: leader").await;
    let second = operator(&tb, &ns.name, &hub.url, &mirror_url);
    until_role(&second, "ok: standby").await;
    let leader = holder(&leases).await.expect("a holder");
    assert!(
        leader.ends_with(&format!("-{}", first.pid())),
        "the first operator holds the Lease: {leader}"
    );

    let spec = serde_json::from_value(serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "replicas": 1,
        "contextSize": 2048,
        "contextLength": 1024,
        "smokeTest": {"prompt": "Say hello.", "maxTokens": 8},
    }))
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new("ha", spec))
        .await
        .unwrap();
    let mirroring = eventually(Duration::from_secs(60), async || {
        let s = api.get("ha").await.ok()?.status?;
        let m = s.mirror.as_ref()?;
        (m.bytes_done > 0 && m.bytes_done < m.bytes_total).then_some(m.percent)
    })
    .await;
    let Some(mirroring) = mirroring else {
        panic!(
            "the model never showed a download under way: {:#?}",
            api.get("ha").await.ok().and_then(|m| m.status)
        );
    };

    // While both are up only the leader has written anything.
    let standby_writes = writes(&second).await;
    assert!(
        standby_writes.is_empty(),
        "the standby wrote: {standby_writes:?}"
    );
    let leader_writes = writes(&first).await;
    assert!(
        leader_writes
            .iter()
            .any(|(w, _)| w.contains("modelserves/status")),
        "the leader wrote the status: {leader_writes:?}"
    );

    // SIGKILL: the Lease is not released and has to lapse.
    let killed = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &first.pid().to_string()])
        .status();
    let ended = eventually(Duration::from_secs(5), async || first.exited()).await;
    assert!(ended.is_some(), "the leader did not die");
    until_role(&second, "ok: leader").await;
    let took_over = killed.elapsed();
    let ready = eventually(Duration::from_secs(LEASE_SECS + 10 + 60), async || {
        let s = api.get("ha").await.ok()?.status?;
        (condition(&s, "Ready").0 == "True").then_some(s)
    })
    .await;
    let finished = killed.elapsed();
    let Some(s) = ready else {
        panic!(
            "never Ready: {:#?}",
            api.get("ha").await.ok().and_then(|m| m.status)
        );
    };
    eprintln!(
        "killed the leader at {mirroring}% mirrored; the standby led after {:.1}s and the model was Ready {:.1}s after the kill (lease {LEASE_SECS}s)",
        took_over.as_secs_f64(),
        finished.as_secs_f64()
    );
    assert!(
        finished <= Duration::from_secs(LEASE_SECS + 10),
        "Ready {:.1}s after the kill, over lease duration + 10s",
        finished.as_secs_f64()
    );
    assert_eq!(condition(&s, "SmokeTested").0, "True");
    let new_leader = holder(&leases).await.expect("a holder");
    assert!(
        new_leader.ends_with(&format!("-{}", second.pid())),
        "{new_leader}"
    );
    assert!(!writes(&second).await.is_empty(), "the new leader writes");
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_at_once() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("lease-lost");
    let hub = FakeHub::with_tiny_llama().await;
    let (mirror_url, _mirror) = start_mirror(&hub.url).await;
    let client = tb.client().await;
    let leases: Api<Lease> = Api::namespaced(client, &ns.name);
    let mut op = operator(&tb, &ns.name, &hub.url, &mirror_url);
    until_role(&op, "ok: leader").await;

    // Another holder, freshly renewed, as a replica that won a partition would leave it.
    // MicroTime: exactly six digits of fraction.
    let t = k8s_openapi::jiff::Timestamp::now();
    let now = format!(
        "{}.{:06}Z",
        t.strftime("%Y-%m-%dT%H:%M:%S"),
        t.subsec_microsecond()
    );
    let patch = serde_json::json!({"spec": {"holderIdentity": "intruder-1", "renewTime": now}});
    leases
        .patch(
            "modelserve-operator",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let taken = Instant::now();
    let exited = eventually(Duration::from_secs(LEASE_SECS * 2), async || op.exited()).await;
    let status = exited.expect("the operator kept running without its Lease");
    eprintln!(
        "the leader stopped {:.2}s after its Lease was taken (lease {LEASE_SECS}s), exit {status}",
        taken.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "{status}");
    assert!(
        taken.elapsed() < Duration::from_secs(LEASE_SECS),
        "stopped only after a whole lease duration"
    );
    assert_eq!(holder(&leases).await.as_deref(), Some("intruder-1"));
}
