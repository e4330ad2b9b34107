//! The tests' fake Hugging Face Hub as a process of its own, for the demo and for trying
//! `modelserve plan` without the internet: every listing of tests/fixtures/hf-listings.json and
//! tests/fixtures/synthetic-listings.json (non-ASCII names, a broken proxy). Repositories
//! named `faults/<fault>` misbehave on purpose (`faults/never-answers`, `faults/malformed-json`,
//! ...: see `RepoFault`), so a client's bounds can be watched by hand.
//! With a directory as third argument, every `NAME.gguf` in it becomes the repository
//! `modelserve-demo/NAME-GGUF` with real, downloadable bytes (see testbed/gen_gguf.py).
//!   cargo run --example fake-hub -- 127.0.0.1:18090 127.0.0.1:18091 [DIR]
//! FAKE_HUB_THROTTLE=BYTES caps every CDN connection at BYTES per second.

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;
#[path = "../tests/support/models.rs"]
mod models;

use fake_hub::{FakeHub, RepoFault};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let hub_addr = args.next().unwrap_or_else(|| "127.0.0.1:18090".into());
    let cdn_addr = args.next().unwrap_or_else(|| "127.0.0.1:18091".into());
    let hub = FakeHub::start_on(&hub_addr, &cdn_addr).await;
    for repo in FakeHub::listing_names() {
        hub.add_listing(&repo);
    }
    if let Some(dir) = args.next() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .expect("read the model directory")
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let stem = name.trim_end_matches(".gguf");
            let bytes = std::fs::read(&path).expect("read a model");
            hub.add_repo(
                &format!("modelserve-demo/{stem}-GGUF"),
                vec![fake_hub::HubFile::with_bytes(&name, bytes)],
            );
            println!("serving {} as modelserve-demo/{stem}-GGUF", path.display());
        }
    }
    // A slow registry on purpose, to watch progress: bytes per second per CDN connection.
    if let Some(rate) = std::env::var("FAKE_HUB_THROTTLE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        hub.throttle(rate);
        println!("every CDN connection capped at {rate} bytes/s");
    }
    println!(
        "fake Hub on {} (CDN {}), serving {} repositories",
        hub.url,
        hub.cdn_url,
        FakeHub::listing_names().len()
    );
    let faults: Vec<String> = RepoFault::ALL
        .iter()
        .map(|f| format!("faults/{}", f.name()))
        .collect();
    println!("repositories that misbehave: {}", faults.join(", "));
    let _ = tokio::signal::ctrl_c().await;
}
