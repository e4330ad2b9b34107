//! The memory estimate against the real llama-server (built from the vendored llama.cpp by
//! testbed/build-llama-server.sh): for eight generated model families and two context/slot
//! settings, the KV cache and recurrent state must equal the engine's own figures exactly and
//! the compute buffer must be within 5%; and every model is within the header bounds.

mod support;

use std::path::Path;

use modelserve::gguf::memory::{Flags, estimate_checked};
use modelserve::gguf::{FileSource, read_header};
use support::engine::{Server, logged};
use support::models::gen_gguf;
use support::testbed_script;

/// The log of llama-server once it has loaded `model` and logged its buffers.
async fn server_log(server: &Path, model: &Path, ctx: u64, parallel: u64) -> String {
    let args = [
        "--ctx-size".to_string(),
        ctx.to_string(),
        "--parallel".into(),
        parallel.to_string(),
        "--cache-ram".into(),
        "0".into(),
    ];
    let mut s = Server::start(server, model, &args);
    s.ready(&reqwest::Client::new()).await;
    s.log_text()
}

#[tokio::test]
async fn kv_and_state_equal_the_engines_figures_and_compute_is_within_five_percent() {
    let server = testbed_script("build-llama-server.sh");
    let dir = tempfile::tempdir().unwrap();
    let mut models = gen_gguf(dir.path(), &[]);
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
                    cpus: support::cpus(),
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let log = server_log(&server, model, ctx, parallel).await;
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
