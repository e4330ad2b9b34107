//! `modelserve estimate --gpu MEMORY ...`: where llama.cpp puts the model on these GPUs, as
//! `gguf::offload` decides it (llama.cpp's `--fit`), or for a `-ngl` and tensor split given.
//! The flags' parsers, their checks against each other, the text table and the JSON.

use crate::gguf::header::Header;
use crate::gguf::memory::Flags;
use crate::gguf::offload::{self, Decision, Device, DeviceShare, MAX_DEVICES, Placement};

const MIB: u64 = 1 << 20;
/// The largest `--fit-target`: 1 TiB in MiB, more than any GPU has.
const MAX_FIT_TARGET_MIB: u64 = 1 << 20;
/// The longest GPU name kept.
const MAX_NAME_CHARS: usize = 64;

/// One `--gpu`: the GPU's name, when given, and its free memory in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub name: Option<String>,
    pub free: u64,
}

/// `--gpu-layers`: a number of layers, every layer, or as `--fit` decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layers {
    Count(u32),
    All,
    Auto,
}

/// `--tensor-split`: one share per GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Split(pub Vec<f64>);

/// `[NAME=]MEMORY`: `24GiB`, `A10=22.5GiB`.
pub fn parse_gpu(s: &str) -> Result<Gpu, String> {
    let (name, memory) = match s.split_once('=') {
        Some((name, memory)) => {
            let name = name.trim();
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(format!(
                    "{s:?} has no name before '='; write NAME=MEMORY (A10=24GiB) or MEMORY alone"
                ));
            }
            if name.chars().count() > MAX_NAME_CHARS {
                return Err(format!(
                    "the GPU name is longer than {MAX_NAME_CHARS} characters"
                ));
            }
            (Some(name.to_string()), memory)
        }
        None => (None, s),
    };
    let free = parse_size(memory)?;
    if free == 0 {
        return Err(format!(
            "{memory:?} is no memory; give the GPU's free memory, such as 24GiB"
        ));
    }
    Ok(Gpu { name, free })
}

/// A memory size with its unit: `24GiB`, `23028MiB`, `22.5Gi`, `24GB`, `512M`, `1073741824B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = |why: &str| {
        format!(
            "{s:?} {why}; write a size with its unit, such as 24GiB, 23028MiB or 80GB \
             (B, KiB, MiB, GiB, TiB or KB, MB, GB, TB; Ki, Mi, Gi, Ti as Kubernetes writes them)"
        )
    };
    let t = s.trim();
    let at = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(at);
    if number.is_empty() {
        return Err(bad("is not a size"));
    }
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => return Err(bad("has no unit")),
        "b" => 1.0,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => 1024f64.powi(2),
        "gib" | "gi" => 1024f64.powi(3),
        "tib" | "ti" => 1024f64.powi(4),
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        _ => return Err(bad("has a unit this does not know")),
    };
    let n: f64 = number.parse().map_err(|_| bad("is not a number"))?;
    let bytes = (n * factor).round();
    if !(bytes.is_finite() && bytes < u64::MAX as f64) {
        return Err(bad("is too large"));
    }
    Ok(bytes as u64)
}

/// `N`, `all` or `auto`.
pub fn parse_layers(s: &str) -> Result<Layers, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "all" => Ok(Layers::All),
        "auto" => Ok(Layers::Auto),
        n => n.parse().map(Layers::Count).map_err(|_| {
            format!(
                "{s:?} is not a number of layers; give 0 or more (as llama-server's -ngl), \
                 all, or auto (as --fit decides)"
            )
        }),
    }
}

/// `3,1`: shares, each a finite number 0 or more, split by ',' (or '/', as llama-server takes).
pub fn parse_split(s: &str) -> Result<Split, String> {
    let shares = s
        .split([',', '/'])
        .enumerate()
        .map(|(i, part)| match part.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 && (v as f32).is_finite() => Ok(v),
            _ => Err(format!(
                "share #{} {:?} is not a finite number 0 or more; give one share per GPU, \
                 such as 3,1",
                i + 1,
                part.trim()
            )),
        })
        .collect::<Result<Vec<f64>, String>>()?;
    if shares.len() > MAX_DEVICES {
        return Err(format!(
            "{} shares are more than the {MAX_DEVICES} GPUs llama-server can use",
            shares.len()
        ));
    }
    if shares.iter().all(|s| *s == 0.0) {
        return Err("no share is above 0: at least one GPU must take layers".into());
    }
    Ok(Split(shares))
}

/// MiB kept free on each GPU: a whole number, at most 1 TiB.
pub fn parse_fit_target(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n <= MAX_FIT_TARGET_MIB => Ok(n),
        _ => Err(format!(
            "{s:?} is not a whole number of MiB from 0 to {MAX_FIT_TARGET_MIB}; \
             llama.cpp keeps 1024 free by default"
        )),
    }
}

/// The GPU flags, checked against each other.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub devices: Vec<Device>,
    /// A forced `-ngl`; None: as `--fit` decides.
    pub layers: Option<u32>,
    /// A forced tensor split; None: by free memory, or as `--fit` decides.
    pub split: Option<Vec<f64>>,
    /// Bytes kept free on each GPU.
    pub margin: u64,
}

impl Request {
    /// The request, or an error naming the flag that cannot go with the others. GPUs without a
    /// name are called GPU0, GPU1, ... in the order given.
    pub fn new(
        gpus: &[Gpu],
        layers: Option<Layers>,
        split: Option<&Split>,
        fit_target_mib: Option<u64>,
    ) -> Result<Request, String> {
        let needs_gpu = |flag: &str| {
            format!(
                "{flag} needs at least one --gpu (each GPU's free memory, such as --gpu 24GiB); \
                 without a GPU every layer runs on the CPU"
            )
        };
        if gpus.is_empty() {
            if layers.is_some_and(|l| l != Layers::Auto) {
                return Err(needs_gpu("--gpu-layers"));
            }
            if split.is_some() {
                return Err(needs_gpu("--tensor-split"));
            }
            if fit_target_mib.is_some() {
                return Err(needs_gpu("--fit-target"));
            }
        }
        if gpus.len() > MAX_DEVICES {
            return Err(format!(
                "{} --gpu flags are more than the {MAX_DEVICES} GPUs llama-server can use \
                 (its scheduler takes 16 backends, the CPU's among them)",
                gpus.len()
            ));
        }
        if let Some(Split(shares)) = split
            && shares.len() != gpus.len()
        {
            return Err(format!(
                "--tensor-split has {} shares for {} GPUs; give one share per --gpu",
                shares.len(),
                gpus.len()
            ));
        }
        let devices = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| Device {
                name: g.name.clone().unwrap_or_else(|| format!("GPU{i}")),
                free: g.free,
            })
            .collect();
        Ok(Request {
            devices,
            layers: match layers {
                Some(Layers::Count(n)) => Some(n),
                Some(Layers::All) => Some(u32::MAX),
                Some(Layers::Auto) | None => None,
            },
            split: split.map(|s| s.0.clone()),
            margin: fit_target_mib.unwrap_or(offload::DEFAULT_MARGIN / MIB) * MIB,
        })
    }
}

/// How the layer count was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// As `--fit` would: every layer.
    Full,
    /// As `--fit` would: the most layers the GPUs hold.
    Partial,
    /// Not one layer fits, or no GPU.
    NoFit,
    /// `--gpu-layers` given, or the most layers the split given lets fit.
    Forced,
}

/// The offload worked out: the placement and what it is measured against.
#[derive(Clone, Debug, PartialEq)]
pub struct Offload {
    kind: Kind,
    placement: Placement,
    devices: Vec<Device>,
    margin: u64,
    /// Each GPU's share of a full offload plus the margin, when not one layer fits.
    needs: Vec<u64>,
    /// Whether llama-server needs the split as `--tensor-split` to place the layers so (not
    /// when it splits by free memory itself).
    pass_split: bool,
    message: String,
}

/// The placement for the request: forced when it forces `-ngl` or a split, else decided.
pub fn offload(h: &Header, f: &Flags, r: &Request) -> Result<Offload, String> {
    let refused = |e: offload::OffloadError| format!("{e} ({})", e.reason());
    if r.layers.is_none() && r.split.is_none() {
        let d = offload::decide(h, f, &r.devices, r.margin).map_err(refused)?;
        let message = d.message(&r.devices);
        let (kind, needs) = match &d {
            Decision::Full(_) => (Kind::Full, Vec::new()),
            Decision::Partial(_) => (Kind::Partial, Vec::new()),
            Decision::NoFit { needs, .. } => {
                (Kind::NoFit, needs.iter().map(|n| n.needed).collect())
            }
        };
        return Ok(Offload {
            kind,
            placement: d.placement().clone(),
            devices: r.devices.clone(),
            margin: r.margin,
            needs,
            pass_split: true,
            message,
        });
    }
    // Without --tensor-split the engine splits by each GPU's free memory at load.
    let split = r
        .split
        .clone()
        .unwrap_or_else(|| r.devices.iter().map(|d| d.free as f64).collect());
    let place = |ngl: u32| offload::place(h, f, ngl, &split).map_err(refused);
    let (placement, how) = match r.layers {
        Some(ngl) => {
            let p = place(ngl)?;
            let how = if ngl == u32::MAX {
                "every layer as given (--gpu-layers all)".to_string()
            } else {
                format!("-ngl {ngl} as given")
            };
            (p, how)
        }
        None => {
            let all = place(u32::MAX)?.n_layer + 1;
            let p = most_that_fit(all, &r.devices, r.margin, place)?;
            (
                p,
                "the most layers that fit with the --tensor-split given".into(),
            )
        }
    };
    let decision = if placement.full() {
        Decision::Full(placement)
    } else {
        Decision::Partial(placement)
    };
    let mut message = format!("{}; {how}", decision.message(&r.devices));
    let over = over(decision.placement(), &r.devices, r.margin);
    if !over.is_empty() {
        message += &format!("; it does not fit: {over}");
    }
    Ok(Offload {
        kind: Kind::Forced,
        placement: decision.placement().clone(),
        devices: r.devices.clone(),
        margin: r.margin,
        needs: Vec::new(),
        pass_split: r.split.is_some(),
        message,
    })
}

/// The placement with the most of `all` layers whose every GPU keeps its margin free (memory
/// grows with the layers, so bisect), or none offloaded when not even that fits.
fn most_that_fit(
    all: u32,
    devices: &[Device],
    margin: u64,
    place: impl Fn(u32) -> Result<Placement, String>,
) -> Result<Placement, String> {
    let top = place(all)?;
    if fits(&top, devices, margin) {
        return Ok(top);
    }
    let (mut lo, mut hi) = (0u32, all);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(&place(mid)?, devices, margin) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    place(lo)
}

fn fits(p: &Placement, devices: &[Device], margin: u64) -> bool {
    p.devices
        .iter()
        .zip(devices)
        .all(|(s, d)| u128::from(s.total) + u128::from(margin) <= u128::from(d.free))
}

/// "GPU1 needs 25.3 GiB with the 1.0 GiB margin, has 24.0 GiB free": the GPUs that do not fit.
fn over(p: &Placement, devices: &[Device], margin: u64) -> String {
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30));
    let parts: Vec<String> = p
        .devices
        .iter()
        .zip(devices)
        .filter(|(s, d)| u128::from(s.total) + u128::from(margin) > u128::from(d.free))
        .map(|(s, d)| {
            format!(
                "{} needs {} with the {} margin, has {} free",
                d.name,
                gib(s.total.saturating_add(margin)),
                gib(margin),
                gib(d.free)
            )
        })
        .collect();
    parts.join("; ")
}

/// "0-31+out", "5", "out", "-": a share's blocks and whether it has the output layer.
fn layer_range(layers: &std::ops::Range<u32>, output: bool) -> String {
    let blocks = match layers.len() {
        0 => String::new(),
        1 => layers.start.to_string(),
        _ => format!("{}-{}", layers.start, layers.end - 1),
    };
    match (blocks.is_empty(), output) {
        (true, true) => "out".into(),
        (true, false) => "-".into(),
        (false, true) => format!("{blocks}+out"),
        (false, false) => blocks,
    }
}

fn range_json(layers: &std::ops::Range<u32>, output: bool) -> serde_json::Value {
    serde_json::json!({
        "start": layers.start,
        "end": layers.end,
        "count": layers.len() as u32 + u32::from(output),
        "output": output,
    })
}

impl Offload {
    /// What to pass as `--tensor-split`, when llama-server needs it.
    fn tensor_split(&self) -> Option<String> {
        let p = &self.placement;
        (self.pass_split && p.ngl > 0 && !p.split.is_empty()).then(|| p.tensor_split_arg())
    }

    /// The GPUs' shares, one per `--gpu` (zeros where the placement gives a GPU nothing).
    fn shares(&self) -> impl Iterator<Item = (&Device, DeviceShare)> {
        self.devices.iter().enumerate().map(|(i, d)| {
            let s = self.placement.devices.get(i).cloned().unwrap_or_default();
            (d, s)
        })
    }

    /// The `offload` object of `--output json`: bytes throughout.
    pub fn json(&self) -> serde_json::Value {
        let p = &self.placement;
        let devices: Vec<serde_json::Value> = self
            .shares()
            .enumerate()
            .map(|(i, (d, s))| {
                serde_json::json!({
                    "index": i,
                    "name": d.name,
                    "free": d.free,
                    "layers": range_json(&s.layers, s.output),
                    "weights": s.weights,
                    "kv": s.kv,
                    "recurrent": s.recurrent,
                    "compute": s.compute,
                    "total": s.total,
                    "fits": u128::from(s.total) + u128::from(self.margin) <= u128::from(d.free),
                    "fullOffloadNeeds": self.needs.get(i),
                })
            })
            .collect();
        let h = &p.host;
        let kind = match self.kind {
            Kind::Full => "full",
            Kind::Partial => "partial",
            Kind::NoFit => "noFit",
            Kind::Forced => "forced",
        };
        serde_json::json!({
            "decision": kind,
            "message": self.message,
            "fits": self.kind != Kind::NoFit && fits(p, &self.devices, self.margin),
            "ngl": p.ngl,
            "layers": p.n_layer + 1,
            "split": p.split,
            "tensorSplit": self.tensor_split(),
            "fitTarget": self.margin,
            "devices": devices,
            "host": {
                "layers": range_json(&h.layers, h.output),
                "weights": h.weights,
                "repack": h.repack,
                "kv": h.kv,
                "recurrent": h.recurrent,
                "checkpoints": h.checkpoints,
                "compute": h.compute,
                "outputBuffer": h.output_buffer,
                "overhead": h.overhead,
                "runtime": h.runtime,
                "total": h.total,
            },
            "outputCopy": p.output_copy,
            "flashAttentionOff": p.flash_attention_off,
            "fallback": p.fallback,
        })
    }

    /// The sentence, the llama-server flags, and a table of MiB per device and the host.
    pub fn text(&self) -> String {
        let p = &self.placement;
        let mib = |b: u64| format!("{:.1}", b as f64 / MIB as f64);
        let mut rows: Vec<[String; 8]> = vec![
            [
                "device",
                "layers",
                "weights",
                "KV",
                "recurrent",
                "compute",
                "total",
                "free",
            ]
            .map(String::from),
        ];
        let repeated = |name: &str| self.devices.iter().filter(|d| d.name == name).count() > 1;
        for (i, (d, s)) in self.shares().enumerate() {
            // GPUs of one name (2× A10) by their index too.
            let name = if repeated(&d.name) {
                format!("{}#{i}", d.name)
            } else {
                d.name.clone()
            };
            rows.push([
                name,
                layer_range(&s.layers, s.output),
                mib(s.weights),
                mib(s.kv),
                mib(s.recurrent),
                mib(s.compute),
                mib(s.total),
                mib(d.free),
            ]);
        }
        let h = &p.host;
        rows.push([
            "host".into(),
            layer_range(&h.layers, h.output),
            mib(h.weights),
            mib(h.kv),
            mib(h.recurrent),
            mib(h.compute),
            mib(h.total),
            "-".into(),
        ]);
        let widths: Vec<usize> = (0..8)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = format!("{}\n", self.message);
        if !self.devices.is_empty() {
            let mut flags = format!("llama-server flags: -ngl {}", p.ngl);
            if let Some(split) = self.tensor_split() {
                flags += &format!(" --tensor-split {split}");
            }
            out += &format!(
                "{flags} (kept free on each GPU: {} MiB)\n",
                self.margin / MIB
            );
        }
        out += "\nMiB on each device:\n";
        for r in &rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                let w = widths[c];
                // Names and layers read from the left, figures from the right.
                if c < 2 {
                    line += &format!("{cell:<w$}  ");
                } else {
                    line += &format!("{cell:>w$}  ");
                }
            }
            out += line.trim_end();
            out += "\n";
        }
        out += &format!(
            "\nthe host's total also holds: repack {} MiB, checkpoints {} MiB, output buffer {} MiB, \
             engine {} MiB, GPU runtime {} MiB (measured on an H200)\n",
            mib(h.repack),
            mib(h.checkpoints),
            mib(h.output_buffer),
            mib(h.overhead),
            mib(h.runtime)
        );
        out
    }
}

#[cfg(test)]
mod tests;
