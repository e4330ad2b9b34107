//! The gateway's overhead, measured against the replica it forwards to, in one run: wrk sends the
//! same chat completion to a warm model directly at its pod IP (what a client of the
//! model's Service reaches; on the test bed Services have no endpoints, as kwok pod IPs are
//! loopback addresses) and through `modelserve gateway`, alternating the two so the machine's
//! drift falls on both. Printed as ratios:
//!
//! - p50 latency at 1 connection (the gateway's own added time) and at 32 (under load);
//! - requests per second at 32 concurrent streams, gateway over direct;
//! - the gateway's RSS, and its CPU time per 1,000 requests (from /proc).
//!
//! Goals (issue 16): p50 overhead <= 1 ms; throughput >= 0.95x direct at 32 streams.
//!
//! As in a cluster, where the gateway's pod does not run on the model's CPUs, the engine is
//! pinned to CPUs of its own and wrk and the gateway to the others (bench_gateway/cpus.rs);
//! `--share` runs all three on every CPU, which measures how much CPU the gateway takes from an
//! engine on the same cores.
//!
//! It needs the running test bed (`scripts/testbed up`) and wrk (`apt-get install wrk`). It
//! builds what it runs, starts the fake Hub, the mirror, an operator, pod-runner (which runs a
//! real llama-server with 32 slots at the pod IP) and a gateway in a namespace of its own, and
//! removes all of it at the end, on failure and on Ctrl-C too.
//!
//!   cargo run --release --example gateway-bench -- [--secs 15] [--rounds 2] [--max-tokens 16] [--share]

#[path = "bench_gateway/cpus.rs"]
mod cpus;
#[path = "../tests/support/models.rs"]
mod models;
#[path = "bench_scale/procs.rs"]
#[allow(dead_code)]
mod procs;
#[path = "bench_gateway/wrk.rs"]
mod wrk;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use procs::{Proc, Testbed, free_port};

const KEY: &str = "sk-gateway-bench-0123456789abcdef";
const SLOTS: u32 = 32;

#[derive(Parser, Debug)]
#[command(about = "The gateway's latency, throughput, RSS and CPU against direct requests")]
struct Args {
    /// Seconds of each wrk run.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=600))]
    secs: u64,
    /// Rounds of (direct, gateway) per concurrency.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// Tokens each completion generates.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_tokens: u32,
    /// Use the binaries as built, without running cargo build.
    #[arg(long)]
    no_build: bool,
    /// Run the engine, wrk and the gateway on every CPU instead of the engine on CPUs of its own.
    #[arg(long)]
    share: bool,
}

/// Everything started, so it can be stopped whatever happens.
struct Bed {
    testbed: Testbed,
    dir: PathBuf,
    namespace: String,
    procs: Vec<Proc>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut bed = None;
    let result = tokio::select! {
        r = run(&args, &mut bed) => r,
        _ = tokio::signal::ctrl_c() => Err("stopped by Ctrl-C".into()),
    };
    if let Some(b) = bed {
        cleanup(b, result.is_ok()).await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn cleanup(bed: Bed, ok: bool) {
    let _ = bed
        .testbed
        .kubectl(&["delete", "namespace", &bed.namespace, "--wait=false"])
        .await;
    for p in bed.procs.into_iter().rev() {
        p.stop().await;
    }
    if ok {
        let _ = std::fs::remove_dir_all(&bed.dir);
    } else {
        eprintln!("logs kept in {}", bed.dir.display());
    }
}

fn build() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("building modelserve, the fake Hub and pod-runner (cargo build --release) ...");
    let status = std::process::Command::new(&cargo)
        .args(["build", "--release", "--bin", "modelserve"])
        .args(["--example", "fake-hub", "--example", "pod-runner"])
        .arg("--manifest-path")
        .arg(procs::repo_root().join("Cargo.toml"))
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("cargo build --release failed ({status})"))
}

/// The test bed's llama-server, built and cached by testbed/build-llama-server.sh.
fn llama_server() -> Result<PathBuf, String> {
    let out = std::process::Command::new("bash")
        .arg(procs::repo_root().join("testbed/build-llama-server.sh"))
        .output()
        .map_err(|e| format!("cannot run build-llama-server.sh: {e}"))?;
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    (out.status.success() && !path.is_empty())
        .then(|| PathBuf::from(path))
        .ok_or_else(|| "build-llama-server.sh failed".into())
}

async fn run(args: &Args, slot: &mut Option<Bed>) -> Result<(), String> {
    wrk::check()?;
    let testbed = Testbed::find()?;
    if !args.no_build {
        build()?;
    }
    let (modelserve, hub_bin) = procs::binaries()?;
    // Pinned before anything starts, so every process started from here (and its threads)
    // runs on the CPUs that are not the engine's; the engine is moved to its own once up.
    let split = if args.share {
        None
    } else {
        let split = cpus::Split::of(&cpus::available()?);
        match &split {
            Some(s) => cpus::pin(std::process::id(), &s.rest)?,
            None => eprintln!("one CPU: the engine, wrk and the gateway share it"),
        }
        split
    };
    let pod_runner = hub_bin.with_file_name("pod-runner");
    let llama = llama_server()?;
    let crd = procs::repo_root().join("crds/modelserve.yaml");
    testbed
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd.to_string_lossy(),
        ])
        .await?;
    let namespace = format!("gateway-bench-{}", std::process::id());
    testbed
        .kubectl(&["create", "namespace", &namespace])
        .await?;
    let dir = std::env::temp_dir().join(&namespace);
    let models_dir = dir.join("models");
    std::fs::create_dir_all(&models_dir).map_err(|e| e.to_string())?;
    std::fs::write(
        models_dir.join("llama-tiny-f16.gguf"),
        models::tiny_llama_gguf(),
    )
    .map_err(|e| e.to_string())?;
    let bed = slot.insert(Bed {
        testbed,
        dir: dir.clone(),
        namespace: namespace.clone(),
        procs: Vec::new(),
    });
    let kc = bed.testbed.kubeconfig.clone();
    let env = [("KUBECONFIG", kc.as_path())];
    let (hub, cdn, mirror, op_metrics) = (free_port()?, free_port()?, free_port()?, free_port()?);
    let (gw, gw_metrics) = (free_port()?, free_port()?);
    let hub_url = format!("http://127.0.0.1:{hub}");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let starts: Vec<(&'static str, PathBuf, Vec<String>)> = vec![
        (
            "fake-hub",
            hub_bin.clone(),
            s(&[
                &format!("127.0.0.1:{hub}"),
                &format!("127.0.0.1:{cdn}"),
                &models_dir.to_string_lossy(),
            ]),
        ),
        (
            "mirror",
            modelserve.clone(),
            s(&[
                "mirror",
                "--addr",
                &format!("127.0.0.1:{mirror}"),
                "--dir",
                &dir.join("mirror").to_string_lossy(),
                "--registry-endpoint",
                &hub_url,
                "--auth",
                "none",
            ]),
        ),
        (
            "operator",
            modelserve.clone(),
            s(&[
                "controller",
                "--watch-namespace",
                &namespace,
                "--metrics-addr",
                &format!("127.0.0.1:{op_metrics}"),
                "--registry-endpoint",
                &hub_url,
                "--mirror-url",
                &format!("http://127.0.0.1:{mirror}"),
                "--engine-cpu",
                "avx2",
                "--leader-elect=false",
            ]),
        ),
        (
            "pod-runner",
            pod_runner,
            s(&[
                "--namespace",
                &namespace,
                "--workdir",
                &dir.join("pods").to_string_lossy(),
                "--modelserve-bin",
                &modelserve.to_string_lossy(),
                "--llama-server-bin",
                &llama.to_string_lossy(),
            ]),
        ),
        (
            "gateway",
            modelserve.clone(),
            s(&[
                "gateway",
                "--addr",
                &format!("127.0.0.1:{gw}"),
                "--metrics-addr",
                &format!("127.0.0.1:{gw_metrics}"),
                "--watch-namespace",
                &namespace,
                "--keys-namespace",
                &namespace,
            ]),
        ),
    ];
    for (name, program, argv) in starts {
        bed.procs
            .push(Proc::start(name, &program, &argv, &env, &dir)?);
    }
    let key = format!("--from-literal=key={KEY}");
    bed.testbed
        .kubectl(&[
            "create",
            "secret",
            "generic",
            "bench-key",
            "-n",
            &namespace,
            &key,
        ])
        .await?;
    bed.testbed
        .kubectl(&[
            "label",
            "secret",
            "bench-key",
            "-n",
            &namespace,
            "modelserve.dev/gateway-key=true",
        ])
        .await?;
    // 32 slots of 512 tokens: each of the 32 streams has a slot of its own. Pinned, the engine
    // runs one thread per CPU of its own, as with a CPU request of that many.
    let mut model = serde_json::json!({
        "apiVersion": "modelserve.dev/v1alpha1", "kind": "ModelServe",
        "metadata": {"name": "bench", "namespace": namespace},
        "spec": {"repo": "modelserve-demo/llama-tiny-f16-GGUF", "quant": "F16", "servedName": "bench",
                 "contextSize": 512 * SLOTS, "contextLength": 512},
    });
    if let Some(s) = &split {
        let n = s.engine.len().to_string();
        model["spec"]["engine"] =
            serde_json::json!({"extraArgs": ["--threads", n, "--threads-batch", n]});
    }
    let file = dir.join("model.json");
    std::fs::write(&file, model.to_string()).map_err(|e| e.to_string())?;
    bed.testbed
        .kubectl(&["apply", "-f", &file.to_string_lossy()])
        .await?;
    eprintln!("waiting for the model to be Ready ...");
    bed.testbed
        .kubectl(&[
            "wait",
            "-n",
            &namespace,
            "--for=condition=Ready",
            "modelserve/bench",
            "--timeout=300s",
        ])
        .await
        .map_err(|e| {
            format!(
                "the model did not become Ready: {e}; logs in {}",
                dir.display()
            )
        })?;
    let addr = bed
        .testbed
        .kubectl(&[
            "get",
            "-n",
            &namespace,
            "modelserve/bench",
            "-o",
            "jsonpath={.status.placement.address}",
        ])
        .await?;
    let engine_key = bed
        .testbed
        .kubectl(&[
            "get",
            "secret",
            "-n",
            &namespace,
            "bench-engine-key",
            "-o",
            "go-template={{.data.key | base64decode}}",
        ])
        .await?;
    let engine_key = engine_key.trim().to_string();
    let gw_pid = bed
        .procs
        .last()
        .and_then(Proc::pid)
        .ok_or("the gateway has no PID")?;
    let placement = match &split {
        Some(s) => {
            let runner = bed
                .procs
                .iter()
                .find(|p| p.name == "pod-runner")
                .and_then(Proc::pid)
                .ok_or("pod-runner has no PID")?;
            let engines = cpus::descendants_named(runner, "llama-server");
            let [engine] = engines.as_slice() else {
                return Err(format!(
                    "expected one llama-server under pod-runner, found {engines:?}"
                ));
            };
            cpus::pin(*engine, &s.engine)?;
            s.describe()
        }
        None => "the engine, wrk and the gateway on every CPU (--share)".to_string(),
    };
    eprintln!("{placement}");

    // Whole answers, not SSE: llama-server ends each stream in a way wrk takes for a broken
    // connection and reconnects, which would measure wrk. The gateway's path is the same for
    // both (an answer is always streamed through as it comes); tests/gateway.rs shows SSE.
    let body = serde_json::json!({
        "model": "bench", "stream": false, "max_tokens": args.max_tokens,
        "messages": [{"role": "user", "content": "Say hello."}],
    });
    let direct = wrk::Target::new(
        "direct",
        &format!("http://{}/v1/chat/completions", addr.trim()),
        &engine_key,
        &body,
        &dir,
    )?;
    let gateway = wrk::Target::new(
        "gateway",
        &format!("http://127.0.0.1:{gw}/v1/chat/completions"),
        KEY,
        &body,
        &dir,
    )?;
    // Warm both paths (connections, the engine's caches) before anything is counted.
    for t in [&direct, &gateway] {
        t.run(4, Duration::from_secs(2))?;
    }
    let mut rows = Vec::new();
    let cpu0 = wrk::cpu_seconds(gw_pid)?;
    let mut gateway_requests = 0;
    let started = Instant::now();
    for connections in [1, SLOTS] {
        let (mut d, mut g) = (Vec::new(), Vec::new());
        for round in 0..args.rounds {
            // Alternate which goes first, so neither always runs on a warmer machine.
            let order = if round % 2 == 0 {
                [&direct, &gateway]
            } else {
                [&gateway, &direct]
            };
            for t in order {
                let r = t.run(connections, Duration::from_secs(args.secs))?;
                eprintln!("  {} c={connections}: {r}", t.name);
                if t.name == "gateway" {
                    gateway_requests += r.requests;
                    g.push(r);
                } else {
                    d.push(r);
                }
            }
        }
        rows.push((connections, wrk::Run::median(&d), wrk::Run::median(&g)));
    }
    let cpu = wrk::cpu_seconds(gw_pid)? - cpu0;
    let (peak, now) = procs::rss(gw_pid).ok_or("cannot read the gateway's memory")?;
    print!(
        "{}",
        wrk::report(
            &rows,
            gateway_requests,
            cpu,
            (peak, now),
            started.elapsed(),
            &placement,
            args
        )
    );
    Ok(())
}
