//! The memory estimate against the real llama-server (built from the vendored llama.cpp by
//! testbed/build-llama-server.sh): for eight generated model families and two context/slot
//! settings, the KV cache and recurrent state must equal the engine's own figures exactly and
//! the compute buffer must be within 5%; and every model is within the header bounds.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use modelserve::gguf::memory::{Flags, estimate_checked};
use modelserve::gguf::{FileSource, read_header};
use support::testbed_script;

/// MiB figures llama-server printed for one pattern, summed over its lines.
fn logged(log: &str, marker: &str) -> f64 {
    log.lines()
        .filter_map(|l| l.split_once(marker))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

fn run_server(server: &Path, model: &Path, ctx: u64, parallel: u64) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log_path = std::env::temp_dir().join(format!("engine-memory-{port}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(server)
        .args([
            "-m",
            model.to_str().unwrap(),
            "--ctx-size",
            &ctx.to_string(),
            "--parallel",
            &parallel.to_string(),
        ])
        .args([
            "--cache-ram",
            "0",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "-lv",
            "4",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start llama-server");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("compute buffer size") && text.contains("listening") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "llama-server exited ({status}) on {}: {text}",
                model.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "llama-server did not start on {}",
            model.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(&log_path).unwrap()
}

#[tokio::test]
async fn kv_and_state_equal_the_engines_figures_and_compute_is_within_five_percent() {
    let server = testbed_script("build-llama-server.sh");
    let dir = tempfile::tempdir().unwrap();
    let generated = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/gen_gguf.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        generated.status.success(),
        "gen_gguf.py failed: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let mut models: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    models.sort();
    assert!(models.len() >= 8, "eight families expected, got {models:?}");
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    for model in &models {
        let header = read_header(
            &mut FileSource {
                path: model.clone(),
            },
            "m",
        )
        .await
        .unwrap()
        .header;
        for (ctx, parallel) in [(4096, 1), (16384, 4)] {
            let name = model.file_name().unwrap().to_string_lossy();
            // A real model is within every bound.
            let e = estimate_checked(
                &header,
                &Flags {
                    ctx_size: ctx,
                    parallel,
                    ubatch: 512,
                    build: 10587,
                    cpu: "avx2".parse().unwrap(),
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let log = run_server(&server, model, ctx, parallel);
            // The engine prints MiB with two decimals.
            assert_eq!(
                format!("{:.2}", mib(e.kv)),
                format!("{:.2}", logged(&log, "llama_kv_cache: size =")),
                "{name} ctx {ctx} np {parallel}: KV"
            );
            assert_eq!(
                format!("{:.2}", mib(e.recurrent)),
                format!("{:.2}", logged(&log, "llama_memory_recurrent: size =")),
                "{name} ctx {ctx} np {parallel}: recurrent state"
            );
            let compute = logged(&log, "compute buffer size =");
            let ratio = mib(e.compute) / compute;
            assert!(
                (0.95..=1.05).contains(&ratio),
                "{name} ctx {ctx} np {parallel}: compute {:.2} MiB estimated, {compute:.2} MiB real",
                mib(e.compute)
            );
        }
    }
}
