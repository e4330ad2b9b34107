//! Where a device runs mamba2 layers: which of its layers scan, two in a row, the masks that
//! lie under them between two attention layers, and the pipeline's copies of the rows that
//! cross from one device to the next (`Model::compute` uses them).

use std::ops::Range;

use super::{Model, PIPELINE_COPIES, each_block_weight};
use crate::gguf::header::Header;
use crate::gguf::offload::{DeviceShare, HostShare};

/// Each block's weights the first GPU copies in around a host layer's mamba2 layer under op
/// offload: its in-projection (`ssm_in`), and the last its block multiplies by (the FFN's down
/// projection, else the layer's out-projection, else the attention's output), whose copy the
/// next block finds freed below its rows.
pub(super) fn scan_weights(h: &Header, n_layer: usize) -> Vec<(u64, u64)> {
    let mut w = vec![(0u64, 0u64); n_layer];
    let mut ranks = vec![0u8; n_layer];
    each_block_weight(h, n_layer, |il, kind, _, b| {
        let last = match kind {
            "ssm_in" => {
                w[il].0 = w[il].0.max(b);
                return;
            }
            n if n.starts_with("ffn_down") => 3,
            "ssm_out" => 2,
            "attn_output" => 1,
            _ => return,
        };
        if last > ranks[il] {
            (ranks[il], w[il].1) = (last, b);
        } else if last == ranks[il] {
            w[il].1 = w[il].1.max(b);
        }
    });
    w
}

impl Model {
    /// Whether the host's only block is a mamba2 layer, the whole block, that hands its gate to
    /// the next device's recurrent layer (`memory::Scan::gate`).
    pub(super) fn hands_over_gate(&self, host: &HostShare) -> bool {
        let (scan, end) = (&self.parts.scan, host.layers.end);
        let alone = host.layers.len() == 1 && !host.output && scan.alone && scan.gate > 0;
        alone && self.runs_scan(&host.layers) && end < self.n_layer && self.recurrent(end)
    }

    /// Whether `layers` hold a recurrent layer with a mamba2 chain.
    pub(super) fn runs_scan(&self, layers: &Range<u32>) -> bool {
        self.parts.scan.chain > 0 && layers.clone().any(|il| self.recurrent(il))
    }

    /// Whether `layers` hold two recurrent layers in a row (`memory::Scan::follow`).
    pub(super) fn runs_scans_in_a_row(&self, layers: &Range<u32>) -> bool {
        self.parts.scan.follow > 0
            && layers
                .clone()
                .any(|il| il > layers.start && self.recurrent(il - 1) && self.recurrent(il))
    }

    /// Whether two of `layers`' recurrent layers in a row come between two of their attention
    /// layers: the second scan then runs above the holes the attention before and the first
    /// scan leave, over the masks the attention after reads, graph inputs allocated before any
    /// layer runs (granitehybrid, attention in layers 3 and 7 of 8, every layer on one device:
    /// layer 5's chain over the full mask and 1.53 MiB of holes, 13.08 MiB; alloc trace). Before
    /// the first attention the rows fill the holes the embeddings leave (granitehybrid-tiny,
    /// attention in layer 2 of 4: layer 1's in-projection right above the mask).
    /// One pass over the layers: the fit calls this for every layer count it tries.
    pub(super) fn masks_under_scans(&self, layers: &Range<u32>) -> bool {
        let attends = |il: &u32| !self.recurrent(*il);
        let first = layers.clone().find(attends);
        let last = layers.clone().rev().find(attends);
        let (Some(first), Some(last)) = (first, last) else {
            return false;
        };
        (first + 2..last).any(|il| self.recurrent(il - 1) && self.recurrent(il))
    }

    /// Whether a pipeline device's mamba2 chain lies above all four copies of its input, the
    /// first device's included: so in a model without attention (mamba2-bench, 1:3, blocks 0-2
    /// on the first device: four embeddings and four gates copied, 3.04 MiB of holes, block 0's
    /// output and block 1's chain, 40.63 MiB logged, one row more than three copies counted). A
    /// hybrid's first device keeps the unscaled embeddings above the copies, and its fitted
    /// rows hold one of them (granitehybrid-bench, 1:3: 27.13 logged, 27.09 counted with
    /// three; alloc traces).
    pub(super) fn scan_above_every_copy(&self, layers: &Range<u32>) -> bool {
        self.parts.masks == 0 && self.runs_scan(layers)
    }

    /// What lies beside a mamba2 chain in a pipeline, above the input copies `Model::compute`
    /// counts: three residual rows, the holes and the output the layer before leaves. In a
    /// model without attention, a device running one block has one row's hole instead (the
    /// first with block 0 alone: mamba2-tiny, 1:3, 2.83 MiB logged), and a later one the
    /// gate's copy on top where no hole holds it (`memory::Scan::gate_spills`; mamba2-bench at
    /// 3:1, block 7 alone: 51.79 logged, 54.78 counted with three rows; mamba2-tiny at 1:3,
    /// block 1 alone, its gate on top: 4.36; alloc traces).
    pub(super) fn beside_pipeline_scan(&self, layers: &Range<u32>, first: bool) -> u128 {
        let (p, residual) = (&self.parts, u128::from(self.parts.residual));
        if p.masks > 0 || layers.len() > 1 {
            3 * residual
        } else if !first && p.scan.gate_spills {
            residual + p.scan.gate
        } else {
            residual
        }
    }

    pub(super) fn recurrent(&self, il: u32) -> bool {
        self.parts
            .recurrent
            .get(il as usize)
            .is_some_and(|b| *b > 0)
    }

    /// Under op offload, the first GPU's peak while it runs the matrix multiplies and
    /// convolution of the host's mamba2 layers (`memory::Scan::offloaded`): above the layer's
    /// input and its norm, with the in-projection's weight copied in, and below them the block
    /// before's last weight's freed copy, or the first layer's conv state rows (alloc traces over
    /// an rpc-server device given CUDA's offload rule, `-ngl 1`, b11312: mamba2-bench 21.49 MiB,
    /// layer 2 above layer 1's 0.60 MiB out-projection, 20.93 in layer 0; granitehybrid-bench
    /// 21.81, above layer 1's 0.84 MiB down projection). Zero where the host runs none.
    pub(super) fn offloaded_scans(&self, host: &HostShare) -> u128 {
        let p = &self.parts;
        let rows = 2 * u128::from(p.residual) + p.scan.offloaded;
        let weight = |i: u32| self.scan_weights.get(i as usize).copied();
        host.layers
            .clone()
            .filter(|il| self.recurrent(*il))
            .map(|il| {
                let (input, _) = weight(il).unwrap_or_default();
                let last = il.checked_sub(1).and_then(weight).map_or(0, |(_, w)| w);
                u128::from(last).max(p.scan.state_rows) + u128::from(input) + rows
            })
            .max()
            .unwrap_or(0)
    }

    /// The pipeline's copies of mamba2 rows that cross from one device to the next, by device:
    /// where a device's last layer and the next device's first are both recurrent, the next
    /// device keeps `PIPELINE_COPIES` copies of the in-projection and this one as many of its
    /// gate (`memory::Scan`).
    pub(super) fn scan_boundaries(&self, devices: &[DeviceShare]) -> Vec<u128> {
        let mut extra = vec![0u128; devices.len()];
        let scan = &self.parts.scan;
        let running: Vec<usize> = (0..devices.len())
            .filter(|d| !devices[*d].layers.is_empty())
            .collect();
        for pair in running.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if self.recurrent(devices[a].layers.end - 1) && self.recurrent(devices[b].layers.start)
            {
                extra[a] += PIPELINE_COPIES * scan.gate;
                extra[b] += PIPELINE_COPIES * scan.input;
            }
        }
        extra
    }
}
