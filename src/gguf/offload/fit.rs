//! How many layers to offload, and how to split them among the GPUs: the choice llama.cpp's
//! `--fit` makes (`common/fit.cpp`, `common_params_fit_impl`), on the estimate instead of a
//! trial load.
//!
//! 1. The engine's defaults first: every layer offloaded, split by each GPU's free memory
//!    (what `llama_model::load_tensors` does without `--tensor-split`). When every GPU keeps
//!    its margin free, nothing changes ("no changes needed").
//! 2. Else `--fit` fills the GPUs back to front: the last GPU takes as many of the last layers
//!    (the output layer first) as it holds with its margin, then the one before it takes as
//!    many of those left, and so on; the layers no GPU takes stay on the host. It then passes
//!    the layer counts as the tensor split, which places exactly those layers.
//!
//! The split returned is always the layer counts, so the operator can pass it as
//! `--tensor-split` and get the same placement whatever the GPUs' free memory at load.
//! The context size is not reduced (the operator sets it) and MoE experts are not moved to
//! the host (`--fit`'s step 4).

use super::{
    Backend, Decision, Device, MAX_DEVICES, Model, Need, OffloadError, Placement, cumulative,
};
use crate::gguf::header::Header;
use crate::gguf::memory::Flags;

/// The offload for these GPUs (`free` memory each) keeping `margin` bytes free on each: every
/// layer when they hold it, else the most layers they hold, else none.
pub fn decide(
    h: &Header,
    f: &Flags,
    devices: &[Device],
    margin: u64,
) -> Result<Decision, OffloadError> {
    decide_on(h, f, devices, &[margin], Backend::CUDA)
}

/// [`decide`] on GPUs of `backend` with a margin per GPU (`--fit-target MiB0,MiB1,...`); as
/// there, one margin is for every GPU, and a GPU past the list keeps the last one given (none:
/// `DEFAULT_MARGIN`).
pub fn decide_on(
    h: &Header,
    f: &Flags,
    devices: &[Device],
    margins: &[u64],
    backend: Backend,
) -> Result<Decision, OffloadError> {
    if devices.len() > MAX_DEVICES {
        return Err(OffloadError::TooManyDevices {
            count: devices.len(),
        });
    }
    let margin_of = |id: usize| {
        margins
            .get(id)
            .or(margins.last())
            .copied()
            .unwrap_or(super::DEFAULT_MARGIN)
    };
    let m = Model::new(h, f, backend);
    let all = m.n_layer + 1;
    let fits = |total: u64, id: usize| {
        u128::from(total) + u128::from(margin_of(id)) <= u128::from(devices[id].free)
    };
    let fit_all = |shares: &[super::DeviceShare]| {
        !shares.is_empty() && (0..shares.len()).all(|id| fits(shares[id].total, id))
    };

    let gpus = devices.len();
    // 1. Every layer, split by free memory (evenly when no GPU has any, for the needs below).
    let by_free: Vec<f64> = devices.iter().map(|d| d.free as f64).collect();
    let free_points = match cumulative(&by_free) {
        p if p.is_empty() => cumulative(&vec![1.0; gpus]),
        p => p,
    };
    let (full_shares, _, _) = m.shares(all, gpus, &free_points);
    if fit_all(&full_shares) {
        let counts = full_shares.iter().map(layer_count).collect();
        return Ok(Decision::Full(finish(&m, h, counts)));
    }

    // 2. Back to front, each GPU the most layers it holds.
    let mut counts = vec![0u32; devices.len()];
    for id in (0..devices.len()).rev() {
        let assigned: u32 = counts.iter().sum();
        let fits_with = |n: u32, counts: &mut Vec<u32>| {
            counts[id] = n;
            let (shares, _, _) = m.shares_as(assigned + n, gpus, &points(counts), false);
            fits(shares[id].total, id)
        };
        let (mut lo, mut hi) = (0u32, all - assigned);
        if fits_with(hi, &mut counts) {
            continue;
        }
        // Memory grows with the layers a GPU holds: bisect for the most that fit (`--fit` uses
        // false position to the same end), at most 13 tries for 4097 layers.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits_with(mid, &mut counts) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        counts[id] = lo;
    }

    // Offloading every layer turns on pipeline parallelism and its copies, and the first GPU
    // runs the host's prompt work: take layers back until every GPU fits, from the first one
    // that does not; one that holds none cannot be helped. A placement that would make the
    // engine turn flash attention off (`Model::flash_attention_off`) gives the first GPU's
    // first layer back too: the host then ends with that recurrent layer and flash attention
    // stays on. So the GPUs' needs above are with it on: without, a hybrid's need jumps at
    // those layer counts (by a score matrix per device) and would stop the search short.
    loop {
        let ngl: u32 = counts.iter().sum();
        if ngl == 0 {
            break;
        }
        let (shares, host, _) = m.shares_as(ngl, gpus, &points(&counts), false);
        let over = (0..gpus)
            .find(|id| !fits(shares[*id].total, *id))
            .or_else(|| {
                m.flash_attention_off(&host)
                    .then(|| (0..gpus).find(|id| counts[*id] > 0))
                    .flatten()
            });
        match over {
            None => {
                let p = finish(&m, h, counts);
                return Ok(if p.full() {
                    Decision::Full(p)
                } else {
                    Decision::Partial(p)
                });
            }
            Some(id) if counts[id] > 0 => counts[id] -= 1,
            Some(_) => break,
        }
    }

    let needs = full_shares
        .iter()
        .zip(devices)
        .enumerate()
        .map(|(id, (s, d))| Need {
            needed: s.total.saturating_add(margin_of(id)),
            free: d.free,
        })
        .collect();
    Ok(Decision::NoFit {
        placement: m.placement(0, &[], &[], h),
        needs,
    })
}

/// Blocks and the output layer a GPU holds.
fn layer_count(s: &super::DeviceShare) -> u32 {
    s.layers.len() as u32 + u32::from(s.output)
}

/// The engine's split points for a split of layer counts.
fn points(counts: &[u32]) -> Vec<f32> {
    let split: Vec<f64> = counts.iter().map(|c| f64::from(*c)).collect();
    cumulative(&split)
}

/// The placement of these layer counts, the counts as its split.
fn finish(m: &Model, h: &Header, counts: Vec<u32>) -> Placement {
    let ngl = counts.iter().sum();
    let split: Vec<f64> = counts.iter().map(|c| f64::from(*c)).collect();
    m.placement(ngl, &split, &cumulative(&split), h)
}
