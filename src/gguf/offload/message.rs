//! The offload decision as a sentence a person reads in a condition or an event.

use super::{Decision, Device, Placement};
use crate::units::human_bytes;

/// "31 of 33 layers on 2× NVIDIA-A10 (21.9 and 20.4 of 22.5 GiB), 2 layers in 6.1 GiB of RAM".
pub(super) fn describe(d: &Decision, devices: &[Device]) -> String {
    let p = d.placement();
    let all = p.n_layer + 1;
    let mut s = match d {
        Decision::Full(p) => format!(
            "all {all} layers on {} ({}), the token embeddings and buffers in {} of RAM",
            gpus(devices),
            figures(p.devices.iter().map(|s| s.total), devices),
            human_bytes(p.host.total)
        ),
        Decision::Partial(p) => format!(
            "{} of {all} layers on {} ({}), {} in {} of RAM",
            p.ngl,
            gpus(devices),
            figures(p.devices.iter().map(|s| s.total), devices),
            host_layers(p),
            human_bytes(p.host.total)
        ),
        Decision::NoFit { needs, .. } if needs.is_empty() => {
            format!(
                "no GPU: all {all} layers in {} of RAM",
                human_bytes(p.host.total)
            )
        }
        Decision::NoFit { needs, .. } => format!(
            "not one of {all} layers fits on {}: all of them need {} with the headroom; all in {} of RAM",
            gpus(devices),
            figures(needs.iter().map(|n| n.needed), devices),
            human_bytes(p.host.total)
        ),
    };
    if p.fallback {
        s += " (rough: the header lacks the model's shapes)";
    }
    if p.flash_attention_off {
        s += &format!(
            "; llama.cpp turns flash attention off here, as the host's last block ({}) attends and the GPUs' first is recurrent, which the compute figures count (gpuLayers {} keeps it on)",
            p.host.layers.end.saturating_sub(1),
            p.ngl.saturating_sub(1)
        );
    }
    s
}

/// "2× NVIDIA-A10", "NVIDIA-A10", or "NVIDIA-A10 and NVIDIA-L4".
fn gpus(devices: &[Device]) -> String {
    match devices {
        [] => "no GPU".into(),
        [one] => one.name.clone(),
        [first, rest @ ..] if rest.iter().all(|d| d.name == first.name) => {
            format!("{}× {}", devices.len(), first.name)
        }
        _ => list(devices.iter().map(|d| d.name.clone()).collect()),
    }
}

/// "21.9 and 20.4 of 22.5 GiB" when the GPUs have the same free memory, else "21.9 of 22.5 and
/// 20.4 of 24.0 GiB".
fn figures(used: impl Iterator<Item = u64>, devices: &[Device]) -> String {
    let used: Vec<String> = used.map(gib).collect();
    let free: Vec<String> = devices.iter().map(|d| gib(d.free)).collect();
    match free.first() {
        Some(f) if free.iter().all(|x| x == f) => format!("{} of {f} GiB", list(used)),
        _ => {
            let pairs = used.iter().zip(&free).map(|(u, f)| format!("{u} of {f}"));
            format!("{} GiB", list(pairs.collect()))
        }
    }
}

/// "1 layer", "2 layers and the output", "the output".
fn host_layers(p: &Placement) -> String {
    let n = p.host.layers.len();
    let layers = if n == 1 {
        "1 layer".to_string()
    } else {
        format!("{n} layers")
    };
    match (n, p.host.output) {
        (0, _) => "the output".into(),
        (_, true) => format!("{layers} and the output"),
        _ => layers,
    }
}

/// "a", "a and b", "a, b and c".
fn list(mut items: Vec<String>) -> String {
    match items.pop() {
        None => String::new(),
        Some(last) if items.is_empty() => last,
        Some(last) => format!("{} and {last}", items.join(", ")),
    }
}

/// Bytes in GiB with one decimal, the unit said once for the list.
fn gib(b: u64) -> String {
    format!("{:.1}", b as f64 / f64::from(1u32 << 30))
}
