//! The tests' fake Hugging Face Hub as a process of its own, for the demo and for trying
//! `modelserve plan` without the internet: every listing of tests/fixtures/hf-listings.json,
//! plus meta-llama/Llama-3.2-1B-Instruct-GGUF as a gated copy of the bartowski listing.
//!   cargo run --example fake-hub -- 127.0.0.1:18090 127.0.0.1:18091

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;
#[path = "../tests/support/models.rs"]
mod models;

use fake_hub::FakeHub;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let hub_addr = args.next().unwrap_or_else(|| "127.0.0.1:18090".into());
    let cdn_addr = args.next().unwrap_or_else(|| "127.0.0.1:18091".into());
    let hub = FakeHub::start_on(&hub_addr, &cdn_addr).await;
    for repo in FakeHub::listing_names() {
        hub.add_listing(&repo);
    }
    println!(
        "fake Hub on {} (CDN {}), serving {} repositories",
        hub.url,
        hub.cdn_url,
        FakeHub::listing_names().len()
    );
    let _ = tokio::signal::ctrl_c().await;
}
