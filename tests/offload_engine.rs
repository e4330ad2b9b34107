//! The offload placement and decision (`gguf::offload`) against the real engine, on CPU:
//! llama.cpp's RPC backend makes each rpc-server process a device for `llama-server --rpc`, so
//! the engine lays a model out over devices as it does over GPUs and logs each device's
//! buffers (all built by testbed/build-llama-tool.sh).
//!
//! For the eight generated families and the quantized models of the memory benchmark, in three
//! settings (every layer on one device; every layer on two devices split 1:3; part of the
//! layers on two devices, the first blocks on the host), each device's weights, KV cache and
//! recurrent state must equal the engine's figures, its compute buffer be within 5% of the
//! engine's, and the host part cover llama-server's peak RSS and be at most 1.10 times it (1.20
//! under 1 GiB, 1.55 for the tiny generated models). And for device sizes emulated with
//! per-device `--fit-target` margins, `decide_on` must offload the layers llama-fit-params
//! picks.
//!
//! A CUDA GPU also runs the prompt of the host's layers (op offload): with the RPC client's
//! opt-in rule (testbed/rpc-offload.py, CUDA's own), an rpc-server device does too, and logged
//! every compute buffer of testbed/gpu-check.sh's H200 runs to the hundredth of a MiB. In four
//! more settings (every block on the host, one device; about half on one device; the same half
//! on two, a third of it on the first; one block on the host, the rest on two, two thirds of it
//! on the first), CUDA's placement must then hold each device's weights,
//! KV cache and state exactly and its compute, and the host's, within 5% or a listed miss's
//! bound; that table also serves testbed/gen_gguf.py's two wide models (four blocks of real
//! widths), whose weights and rows outgrow the places the small ones leave.
//!
//! testbed/gpu-check.sh's hybrid model, every layer on one device, is served on its own: its
//! compute was 12% under the H200's before the placement counted the masks under its scans.
//!
//! `cargo test --test offload_engine -- --nocapture` prints the three tables.
//!
//! The host part over RPC: the devices' buffers live in the rpc-server processes, so
//! llama-server's resident set is what the placement keeps in host memory: the model file's
//! range mapped for the host's weights (with the devices' tensors that lie between them), the
//! repack, the KV cache and state of host layers, checkpoints, the host's compute and output
//! buffers, and the engine's own memory for this machine's CPU count. Its peak is measured from
//! the end of the load through every slot reading a prompt that fills its context (`load`):
//! while loading, the RPC client copies each device tensor into a message before sending it (a
//! transient that GPUs do not have: CUDA copies from the mapped file), and the file pages of
//! device tensors outside the host's mapped range are read once and unmapped. While serving it
//! copies the graph's inputs the same way, and the largest such copy is counted with the host
//! part (`rpc_message`), as is what it holds while one device hands a tensor to the next
//! (`rpc_handover`).

mod support;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use modelserve::gguf::header::{Header, Value};
use modelserve::gguf::memory::{CTX_CHECKPOINTS, Flags, OUTPUTS_PER_SLOT_FROM, estimate};
use modelserve::gguf::offload::{
    Backend, Decision, Device, DeviceShare, Placement, decide_on, place_on,
};
use modelserve::gguf::{FileSource, read_header};
use support::engine::{Server, fill_every_slot};
use support::models::{QUANTIZED, gen_gguf, gpu_check, quantized};
use support::rpc::{
    Buffers, Fitted, RpcServer, fit_params, host_memory, peak_rss, reset_peak_rss, rpc_arg,
};
use support::testbed_script_with;

const MIB: u64 = 1 << 20;
const UBATCH: u64 = 512;
const CTX: u64 = 8192;
const PARALLEL: u64 = 2;
/// The llama.cpp the sdist vendors (testbed/versions.env).
const BUILD: u32 = 11312;
/// Compute buffers within this share of the engine's.
const COMPUTE: f64 = 0.05;
/// The host part at most this many times the peak RSS, for models of 1 GiB and more (the goal
/// of tests/quantized_memory.rs).
const OVER_LARGE: f64 = 1.10;
/// The same for the smaller models: with their layers on the devices, what is left in host
/// memory is mostly the engine's own (binary, threads, vocabulary tables, samplers, requests),
/// and without the layers' buffers that tests/quantized_memory.rs holds to 1.10x.
const OVER: f64 = 1.20;
/// The same for the tiny generated models (a host part of 20-45 MiB): the engine's own memory
/// is most of it, and the estimate counts it at its most, 27 MiB (`memory::engine::BASE`): 18-24
/// MiB beside the other parts on a quiet machine, 3 MiB more on a busy one. mamba2's, the
/// least, is the farthest from it.
const OVER_TINY: f64 = 1.55;

/// Compute buffers the placement does not get within 5% (b11312, measured 2026-12-03; the op
/// offload settings 2026-12-04, on two devices and with one host block 2026-12-05), and the
/// most each may be off (estimate / engine - 1, either way), so that a change for the worse
/// fails: (model file prefix, setting, where, most, what is not modelled). Under-estimates are
/// the ones that would matter (a device's share is then short by that much of its headroom, a
/// pod's memory by that much of the host part): none are left.
const COMPUTE_MISSES: [(&str, &str, &str, f64, &str); 11] = [
    (
        "llama-tiny-f16",
        "op offload, all host",
        "dev0",
        0.12,
        VALUE_OVER,
    ),
    (
        "phi3-tiny-f16",
        "op offload, all host",
        "dev0",
        0.15,
        FUSED_VALUE_OVER,
    ),
    (
        "granitehybrid-bench-llama-bpe-Q4_0",
        "op offload, all host",
        "dev0",
        0.33,
        HYBRID_ATTENTION,
    ),
    (
        "gemma3-tiny-f16",
        "op offload, 2 dev 1:2",
        "dev0",
        0.16,
        COPIES_OVER,
    ),
    (
        "granitehybrid-tiny-f16",
        "op offload, 2 dev 1:2",
        "dev0",
        0.30,
        HYBRID_FFN,
    ),
    (
        "deepseek2-bench-llama-bpe-Q4_K_M",
        "op offload, 2 dev 1:2",
        "dev1",
        0.06,
        LAST_LATENT_OVER,
    ),
    (
        "mamba2-bench-gpt-neox-IQ4_XS",
        "op offload, 2 dev 1:2",
        "dev0",
        0.09,
        SCAN_OVER,
    ),
    (
        "gemma3-tiny-gemma-4-Q4_K_M",
        "op offload, 2 dev 1:2",
        "dev0",
        0.16,
        COPIES_OVER,
    ),
    (
        "gemma3-tiny-f16",
        "op offload, 1 host 2:1",
        "dev0",
        0.14,
        OWN_FFN_FITS,
    ),
    (
        "qwen3moe-bench-qwen2-Q8_0",
        "op offload, 1 host 2:1",
        "dev0",
        0.06,
        OUTPUT_OVER,
    ),
    (
        "gemma3-bench-gemma-4-Q4_K_M",
        "op offload, 1 host 2:1",
        "dev0",
        0.09,
        DOWN_OVER,
    ),
];

/// Why an op-offload compute buffer is off (`COMPUTE_MISSES`).
const COPIES_OVER: &str = "over: a host layer's KV copies and its attention's output, counted \
     above the rows before them, fit in the holes those rows leave";
const VALUE_OVER: &str = "over: a later host layer's value copy and the attention's output, \
     counted above the mask, fit in holes here (qwen2's and qwen3moe's value copy does not, \
     gemma3's output does not)";
const FUSED_VALUE_OVER: &str = "over: a later host layer's value copy, counted above the \
     mask that lies above the first layer's copies (`Model::offloaded_fused_attention`), fits \
     below it, its query rows taking a place below the copies where phi3-bench's cannot (88.60 \
     MiB at 14336 cells, counted 88.6)";
const OUTPUT_OVER: &str = "over: one host layer's attention output, counted on top, fits in \
     the hole its query's rows leave (26.53 MiB: the rows before, the K and V copies, the mask)";
const DOWN_OVER: &str = "over: the host layer's FFN here is counted with its largest weight \
     copied in (the down projection, 16.61 MiB in Q6_K) beside its three rows; the engine peaks \
     with the gate's or up's copy (11.39 in Q4_K), the down projection coming once two of those \
     rows are freed (78.89 MiB; alloc trace); counting the gate's copy instead would put the \
     other settings' first GPU under (86.89 MiB logged, 84.41 so counted: the global layer's FFN \
     runs above its full mask and a 4 MiB hole)";
const OWN_FFN_FITS: &str = "over: the GPU's own FFN's up rows and their product, counted above \
     the masks after the host's attention, fit below the 1.77 MiB that attention reached; the \
     quantized file's, its query weight copied in half as large, land above (2.01 MiB logged)";
const HYBRID_FFN: &str = "over: the GPU's one block, which attends, is counted at memory's \
     rows of a hybrid block, its scan phase's, beside the mask; the engine peaks in the host's \
     last block's FFN with that mask copied in (4.52 MiB: the FFN's rows, its weight, the mask \
     and the block's output; alloc trace), as with the GPU's own blocks after it (4.63 counted)";
const HYBRID_ATTENTION: &str = "over: the host's last layer's attention runs here, counted \
     above memory's FFN rows and the weight copied in, where fewer rows lie below its copies \
     (65536 cells: 8.34 MiB below the K and V copies and the mask, 104.34 logged, 112.39 \
     counted; alloc trace); its scans' rows peak here at 8192 cells";
const SCAN_OVER: &str = "over: the GPU's own first layer scans after the host's, counted at \
     memory's fitted scan phase with the weight copied in (22.89 MiB), where its chain lands \
     above 3.57 MiB of what the host's offloaded layers leave (alloc trace)";
const LAST_LATENT_OVER: &str = "over: a device with the last latent-attention block alone is \
     counted at the latent rows traced on the host (Model::latent_unfragmented); after another \
     device, the engine's device peaks at 28.01 MiB: its split's two input copies, the mask, \
     and the query's rows (q_pe, the absorbed query, Qcur; alloc trace)";

/// The quantized models' cache: beside the llama.cpp build ($MODELSERVE_CACHE, else
/// ~/.cache/modelserve), keyed by what makes them (testbed/gen_gguf.py and versions.env). They
/// take minutes to write (gemma3's 3.5 GiB F16 above all) and are the same bytes for the same
/// key; a new key replaces the old set (about 1.9 GiB).
fn quantized_cache() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let root = match std::env::var_os("MODELSERVE_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"))
            .join("modelserve"),
    };
    let testbed = Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed");
    let mut key = std::hash::DefaultHasher::new();
    for file in ["gen_gguf.py", "versions.env"] {
        std::fs::read(testbed.join(file)).unwrap().hash(&mut key);
    }
    let name = format!("models-offload-{:016x}", key.finish());
    std::fs::create_dir_all(&root).unwrap();
    for old in std::fs::read_dir(&root).unwrap().flatten() {
        let old_name = old.file_name().to_string_lossy().into_owned();
        if old_name.starts_with("models-offload-") && old_name != name {
            let _ = std::fs::remove_dir_all(old.path());
        }
    }
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A quantized model from the cache, written there (under a temporary name) when missing.
fn cached(cache: &Path, quantize: &Path, spec: (&str, &str, &str, &str)) -> PathBuf {
    let (family, vocab, size, quant) = spec;
    let path = cache.join(format!("{family}-{size}-{vocab}-{quant}.gguf"));
    if !path.is_file() {
        let scratch = tempfile::tempdir_in(cache).unwrap();
        std::fs::rename(quantized(scratch.path(), quantize, spec), &path).unwrap();
    }
    path
}

/// The models both tests use: generated once (the tiny ones each run, the quantized ones
/// cached), the tiny ones removed when the last test holding them is done.
struct Models {
    dir: tempfile::TempDir,
    tiny: Vec<PathBuf>,
    quantized: Vec<PathBuf>,
    /// testbed/gpu-check.sh's hybrid model (testbed/gpu-check.models), which only the H200
    /// row's test serves. The tables leave the three out: there their compute buffers of 5 to
    /// 15 MiB are up to 26% over the engine's in 14 rows (gemma3's full offload on one device,
    /// the 15th, is 9.02 MiB against 9.02 now), and their host parts 1.23-1.27x the peak RSS.
    gpu_hybrid: PathBuf,
}

static MODELS: Mutex<(usize, Option<&'static Models>)> = Mutex::new((0, None));

/// A hold on the models; the last one dropped removes them.
struct Held(&'static Models);

impl Drop for Held {
    fn drop(&mut self) {
        let mut m = MODELS.lock().unwrap_or_else(|e| e.into_inner());
        m.0 -= 1;
        if m.0 == 0
            && let Some(models) = m.1.take()
        {
            let _ = std::fs::remove_dir_all(models.dir.path());
        }
    }
}

fn hold_models() -> Held {
    let mut m = MODELS.lock().unwrap_or_else(|e| e.into_inner());
    if m.1.is_none() {
        let quantize = testbed_script_with("build-llama-tool.sh", &["llama-quantize"]);
        let dir = tempfile::tempdir().unwrap();
        let tiny = gen_gguf(dir.path(), &[]);
        assert_eq!(tiny.len(), 8, "eight families expected, got {tiny:?}");
        let cache = quantized_cache();
        let quantized = QUANTIZED
            .iter()
            .map(|q| cached(&cache, &quantize, *q))
            .collect();
        let hybrid = gpu_check().into_iter().find(|q| q.0 == "granitehybrid");
        let gpu_hybrid = cached(
            &cache,
            &quantize,
            hybrid.expect("testbed/gpu-check.models lists the hybrid"),
        );
        m.1 = Some(Box::leak(Box::new(Models {
            dir,
            tiny,
            quantized,
            gpu_hybrid,
        })));
    }
    m.0 += 1;
    Held(m.1.unwrap())
}

/// testbed/gen_gguf.py's wide models (four blocks of a 1024-wide llama's and of a 1536-wide
/// qwen2's, 87 and 359 MiB in f16), written into `dir`; the op-offload table serves them
/// beside the others, where a GPU that runs the host's layers lays their copies, mask and FFN
/// out by sizes the tiny models do not reach.
fn wide_models(dir: &Path) -> Vec<PathBuf> {
    let wide = gen_gguf(dir, &["--size", "wide"]);
    assert_eq!(
        wide.len(),
        2,
        "a wide llama and qwen2 expected, got {wide:?}"
    );
    wide
}

/// Every model (and the `more` a test serves beside them), or while working on a few of them,
/// those whose file names start with one of the comma-separated prefixes in
/// `MODELSERVE_OFFLOAD_ONLY` (the test then says how many it left out, and CI never sets it).
fn chosen<'a>(models: &'a Models, more: &'a [PathBuf]) -> Vec<&'a PathBuf> {
    let all: Vec<&PathBuf> = models
        .tiny
        .iter()
        .chain(&models.quantized)
        .chain(more)
        .collect();
    let Ok(only) = std::env::var("MODELSERVE_OFFLOAD_ONLY") else {
        return all;
    };
    let picked: Vec<&PathBuf> = all
        .iter()
        .copied()
        .filter(|m| {
            only.split(',')
                .any(|p| !p.is_empty() && name(m).starts_with(p))
        })
        .collect();
    eprintln!(
        "MODELSERVE_OFFLOAD_ONLY={only}: {} of {} models, {} left out",
        picked.len(),
        all.len(),
        all.len() - picked.len()
    );
    assert!(
        !picked.is_empty(),
        "MODELSERVE_OFFLOAD_ONLY={only} matches no model"
    );
    picked
}

fn flags() -> Flags {
    Flags {
        ctx_size: CTX,
        parallel: PARALLEL,
        ubatch: UBATCH,
        build: BUILD,
        cpu: "avx2".parse().unwrap(),
        cpus: support::cpus(),
    }
}

async fn header(path: &Path) -> Header {
    read_header(
        &mut FileSource {
            path: path.to_path_buf(),
        },
        "m",
    )
    .await
    .unwrap()
    .header
}

fn name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Where the layers go.
#[derive(Clone, Copy, Debug)]
enum Setting {
    /// Every layer on one device.
    FullOne,
    /// Every layer on two devices, a quarter of them on the first.
    FullTwo,
    /// About half the layers on two devices, evenly; the first blocks on the host.
    Partial,
}

impl Setting {
    const ALL: [Setting; 3] = [Setting::FullOne, Setting::FullTwo, Setting::Partial];

    fn name(self) -> &'static str {
        match self {
            Setting::FullOne => "full, 1 dev",
            Setting::FullTwo => "full, 2 dev 1:3",
            Setting::Partial => "partial, 2 dev",
        }
    }

    fn split(self) -> Vec<f64> {
        match self {
            Setting::FullOne => vec![1.0],
            Setting::FullTwo => vec![1.0, 3.0],
            Setting::Partial => vec![1.0, 1.0],
        }
    }

    /// `-ngl` for a model of `n_layer` blocks.
    fn ngl(self, n_layer: u32) -> u32 {
        match self {
            Setting::FullOne | Setting::FullTwo => n_layer + 1,
            Setting::Partial => (n_layer.div_ceil(2) + 1).min(n_layer),
        }
    }
}

/// llama-server on `servers` as its devices, with the pods' flags and the placement's layers.
fn start(server: &Path, model: &Path, servers: &[RpcServer], p: &Placement) -> Server {
    start_with(server, model, servers, p, &[], &[])
}

/// [`start`] with `more` flags and `env` in its environment.
fn start_with(
    server: &Path,
    model: &Path,
    servers: &[RpcServer],
    p: &Placement,
    more: &[String],
    env: &[(&str, &str)],
) -> Server {
    let mut args = vec![
        "--ctx-size".to_string(),
        CTX.to_string(),
        "--parallel".into(),
        PARALLEL.to_string(),
        "--ubatch-size".into(),
        UBATCH.to_string(),
        "--ctx-checkpoints".into(),
        CTX_CHECKPOINTS.to_string(),
        "--cache-ram".into(),
        "0".into(),
        "--no-webui".into(),
        "--rpc".into(),
        rpc_arg(servers),
        "--n-gpu-layers".into(),
        p.ngl.to_string(),
        "--tensor-split".into(),
        p.tensor_split_arg(),
        "--split-mode".into(),
        "layer".into(),
        "--fit".into(),
        "off".into(),
    ];
    args.extend_from_slice(more);
    Server::start_with(server, model, &args, env)
}

/// MiB with two decimals, as the engine prints them.
fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / MIB as f64)
}

/// The table and what failed in it.
#[derive(Default)]
struct Table {
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Table {
    /// `estimate` against the engine's `engine` MiB, to the two decimals it prints.
    fn exact(&mut self, what: &str, estimate: u64, engine: f64) -> String {
        let (e, g) = (mib(estimate), format!("{engine:.2}"));
        if e == g {
            e
        } else {
            self.failures
                .push(format!("{what}: {e} MiB estimated, {g} MiB logged"));
            format!("{e}≠{g}")
        }
    }

    /// A compute buffer within `COMPUTE` of the engine's, or of a known miss's bound.
    fn near(
        &mut self,
        what: &str,
        model: &str,
        setting: &str,
        at: &str,
        est: u64,
        engine: f64,
    ) -> String {
        let e = est as f64 / MIB as f64;
        // The engine prints 0.01 MiB for the output layer's few kB of logits.
        let off = if engine < 0.02 && e < 0.02 {
            0.0
        } else {
            e / engine - 1.0
        };
        let miss = COMPUTE_MISSES
            .iter()
            .find(|(m, s, w, _, _)| model.starts_with(m) && *s == setting && *w == at);
        let most = miss.map_or(COMPUTE, |m| m.3);
        if miss.is_some() && off.abs() <= COMPUTE {
            self.failures.push(format!(
                "{what}: compute {e:.2} MiB estimated, {engine:.2} MiB logged, within {:.0}% now: \
                 drop it from COMPUTE_MISSES",
                COMPUTE * 100.0
            ));
        }
        if off.abs() > most {
            self.failures.push(format!(
                "{what}: compute {e:.2} MiB estimated, {engine:.2} MiB logged ({:+.1}%)",
                off * 100.0
            ));
        }
        format!(
            "{e:.2}/{engine:.2}{}",
            if miss.is_some() { "*" } else { "" }
        )
    }

    /// Device `i`'s cells of a row (`at`: the model and setting): its weights, KV cache and
    /// state exactly the engine's (`b`, the device at `endpoint`), its compute near it.
    fn device(
        &mut self,
        at: &str,
        name: &str,
        set: &str,
        (i, d): (usize, &DeviceShare),
        (b, endpoint): (&Buffers, &str),
    ) -> [String; 4] {
        let what = format!("{at} device {i}");
        [
            self.exact(
                &format!("{what} weights"),
                d.weights,
                b.device("model", endpoint),
            ),
            self.exact(&format!("{what} KV"), d.kv, b.device("KV", endpoint)),
            self.exact(
                &format!("{what} state"),
                d.recurrent,
                b.device("RS", endpoint),
            ),
            self.near(
                &what,
                name,
                set,
                &format!("dev{i}"),
                d.compute,
                b.device("compute", endpoint),
            ),
        ]
    }

    /// Whether the engine turned flash attention off, as its `log` says; the placement must say
    /// the same.
    fn flash_attention_off(&mut self, at: &str, log: &str, p: &Placement) -> bool {
        let off = log.contains("Flash Attention not supported, set to disabled");
        if off != p.flash_attention_off {
            self.failures.push(format!(
                "{at}: the engine turned flash attention {}, the placement says {}",
                if off { "off" } else { "on" },
                if p.flash_attention_off { "off" } else { "on" }
            ));
        }
        off
    }

    fn print(&self) {
        println!("{}", self.lines.join("\n"));
    }
}

#[tokio::test]
async fn each_device_holds_the_weights_kv_and_compute_of_the_placement() {
    let server = testbed_script_with("build-llama-tool.sh", &["llama-server"]);
    let rpc = testbed_script_with("build-llama-tool.sh", &["rpc-server"]);
    let began = std::time::Instant::now();
    let models = hold_models();
    eprintln!("offload_engine: models ready in {:?}", began.elapsed());
    let http = reqwest::Client::new();
    let devices = [RpcServer::start(&rpc), RpcServer::start(&rpc)];
    let f = flags();
    let mut t = Table::default();
    t.lines.push(format!(
        "{:<38} {:<16} {:<5} {:>15} {:>15} {:>13} {:>13} {:>13} {:>20}",
        "model (ctx 8192, 2 slots)",
        "setting",
        "where",
        "weights MiB",
        "host repack",
        "KV",
        "state",
        "compute est/eng",
        "host est+rpc/peak RSS MiB"
    ));
    for model in chosen(models.0, &[]) {
        let name = name(model);
        let h = header(model).await;
        let e = estimate(&h, &f);
        let n_layer = place_on(&h, &f, 0, &[], Backend::RPC).unwrap().n_layer;
        for setting in Setting::ALL {
            let split = setting.split();
            let p = place_on(&h, &f, setting.ngl(n_layer), &split, Backend::RPC).unwrap();
            let servers = &devices[..split.len()];
            let mut s = start(&server, model, servers, &p);
            s.ready(&http).await;
            reset_peak_rss(s.child.id());
            fill_every_slot(&s, &http, CTX, PARALLEL).await;
            let peak = peak_rss(s.child.id());
            let b = Buffers::parse(&s.log_text());
            let (set, at) = (setting.name(), format!("{name} {}", setting.name()));
            let fa_off = t.flash_attention_off(&at, &s.log_text(), &p);
            let dagger = if fa_off { "†" } else { "" };
            for (i, (d, dev)) in p.devices.iter().zip(servers).enumerate() {
                let [weights, kv, state, compute] =
                    t.device(&at, &name, set, (i, d), (&b, &dev.endpoint));
                t.lines.push(format!(
                    "{:<38} {:<16} {:<5} {:>15} {:>15} {:>13} {:>13} {:>13}",
                    name,
                    set,
                    format!("dev{i}"),
                    weights,
                    "",
                    kv,
                    state,
                    compute + dagger,
                ));
            }
            let host = &p.host;
            let what = format!("{at} host");
            let repack = b.sum("model", |n| n == "CPU_REPACK");
            let running = p.devices.iter().filter(|d| !d.layers.is_empty()).count();
            let message = rpc_message(&h, fa_off) + rpc_handover(&h, running);
            let ratio = (host.total + message) as f64 / peak as f64;
            let line = format!(
                "{:<38} {:<16} {:<5} {:>15} {:>15} {:>13} {:>13} {:>13} {:>20}",
                name,
                set,
                "host",
                t.exact(
                    &format!("{what} mapped weights"),
                    host.mapped,
                    b.host("model") - repack
                ),
                t.exact(&format!("{what} repack"), host.repack, repack),
                t.exact(&format!("{what} KV"), host.kv, b.host("KV")),
                t.exact(&format!("{what} state"), host.recurrent, b.host("RS")),
                t.near(&what, &name, set, "host", host.compute, b.host("compute")) + dagger,
                format!(
                    "{:.1}+{:.0}/{:.1} {ratio:.2}x",
                    host.total as f64 / MIB as f64,
                    message as f64 / MIB as f64,
                    peak as f64 / MIB as f64
                ),
            );
            t.lines.push(line);
            let most = if e.weights >= 1 << 30 {
                OVER_LARGE
            } else if models.0.tiny.contains(model) {
                OVER_TINY
            } else {
                OVER
            };
            if !(1.0..=most).contains(&ratio) {
                t.failures
                    .push(format!("{what}: host part / peak RSS {ratio:.3}"));
            }
        }
    }
    t.print();
    println!("placement table in {:?}", began.elapsed());
    for (m, s, w, _, why) in COMPUTE_MISSES {
        if !OFFLOAD_SETTINGS.contains(&s) {
            println!("* {m} {s} {w}: {why}");
        }
    }
    println!("† the engine turned flash attention off, as the placement says");
    assert!(t.failures.is_empty(), "{:#?}", t.failures);
}

/// testbed/gpu-check.sh's hybrid model with every layer on one GPU, the H200 row whose
/// compute the placement had 12% under (11.53 MiB for CUDA0's 13.08): its layer 5, the second
/// Mamba-2 layer after the attention of layer 3, runs its chain above the full mask that layer
/// 7's attention reads, and the holes layer 4 left. The same layout over one rpc-server device.
#[tokio::test]
async fn the_gpu_checks_hybrid_model_on_one_device_holds_its_scans_above_the_mask() {
    let server = testbed_script_with("build-llama-tool.sh", &["llama-server"]);
    let rpc = testbed_script_with("build-llama-tool.sh", &["rpc-server"]);
    let models = hold_models();
    let model = &models.0.gpu_hybrid;
    let device = [RpcServer::start(&rpc)];
    let (f, h) = (flags(), header(model).await);
    let n_layer = place_on(&h, &f, 0, &[], Backend::RPC).unwrap().n_layer;
    let p = place_on(&h, &f, n_layer + 1, &[1.0], Backend::RPC).unwrap();
    let mut s = start(&server, model, &device, &p);
    s.ready(&reqwest::Client::new()).await;
    let b = Buffers::parse(&s.log_text());
    let mut t = Table::default();
    let cells = t.device(
        "granitehybrid-gpu full, 1 dev",
        &name(model),
        Setting::FullOne.name(),
        (0, &p.devices[0]),
        (&b, &device[0].endpoint),
    );
    println!(
        "{} dev0 weights, KV, state, compute: {cells:?}",
        name(model)
    );
    let (est, engine) = (
        p.devices[0].compute,
        b.device("compute", &device[0].endpoint),
    );
    assert!(
        est as f64 / MIB as f64 >= engine,
        "compute {} MiB estimated, under the engine's {engine:.2}",
        mib(est)
    );
    assert!(t.failures.is_empty(), "{:#?}", t.failures);
}

/// The RPC client's opt-in op offload (testbed/rpc-offload.py): set, an rpc-server device takes
/// over a prompt's operations on host weights by CUDA's rule.
const RPC_OFFLOAD: (&str, &str) = ("MODELSERVE_RPC_OFFLOAD", "1");

/// Where the layers go when the device runs the host's prompt too (op offload): every block on
/// the host; about half on one device; the same on two, a third of them on the first; one block
/// on the host, the rest on two, two thirds of them on the first (which runs the host's prompt
/// and then its own layers).
const OFFLOAD_SETTINGS: [&str; 4] = [
    "op offload, all host",
    "op offload, partial",
    "op offload, 2 dev 1:2",
    "op offload, 1 host 2:1",
];

#[tokio::test]
async fn a_gpu_that_runs_the_hosts_prompt_holds_the_placements_compute() {
    let server = testbed_script_with("build-llama-tool.sh", &["llama-server"]);
    let rpc = testbed_script_with("build-llama-tool.sh", &["rpc-server"]);
    let began = std::time::Instant::now();
    let models = hold_models();
    let wide_dir = tempfile::tempdir().unwrap();
    let wide = wide_models(wide_dir.path());
    let http = reqwest::Client::new();
    let devices = [RpcServer::start(&rpc), RpcServer::start(&rpc)];
    let f = flags();
    let mut t = Table::default();
    t.lines.push(format!(
        "{:<38} {:<20} {:<5} {:>15} {:>13} {:>13} {:>15}",
        "model (ctx 8192, 2 slots)",
        "setting",
        "where",
        "weights MiB",
        "KV",
        "state",
        "compute est/eng"
    ));
    for model in chosen(models.0, &wide) {
        let name = name(model);
        let h = header(model).await;
        let n_layer = place_on(&h, &f, 0, &[], Backend::CUDA).unwrap().n_layer;
        // The output layer alone on the device, every block on the host; then about half, on
        // one device and on two (a third on the first, which also runs the host's prompt); then
        // every block but the first, on two.
        let half = Setting::Partial.ngl(n_layer);
        for (set, (ngl, split)) in OFFLOAD_SETTINGS.into_iter().zip([
            (1, vec![1.0]),
            (half, vec![1.0]),
            (half, vec![1.0, 2.0]),
            (n_layer, vec![2.0, 1.0]),
        ]) {
            // CUDA's placement: its op offload, and no CPU repack beside its host buffer type
            // (which --no-repack gives the engine over RPC).
            let p = place_on(&h, &f, ngl, &split, Backend::CUDA).unwrap();
            let servers = &devices[..split.len()];
            let mut s = start_with(
                &server,
                model,
                servers,
                &p,
                &["--no-repack".into()],
                &[RPC_OFFLOAD],
            );
            s.ready(&http).await;
            let b = Buffers::parse(&s.log_text());
            let at = format!("{name} {set}");
            let fa_off = t.flash_attention_off(&at, &s.log_text(), &p);
            let dagger = if fa_off { "†" } else { "" };
            for (i, (d, dev)) in p.devices.iter().zip(servers).enumerate() {
                let [weights, kv, state, compute] =
                    t.device(&at, &name, set, (i, d), (&b, &dev.endpoint));
                t.lines.push(format!(
                    "{:<38} {:<20} {:<5} {:>15} {:>13} {:>13} {:>15}",
                    name,
                    set,
                    format!("dev{i}"),
                    weights,
                    kv,
                    state,
                    compute + dagger,
                ));
            }
            let host = &p.host;
            let what = format!("{at} host");
            let repack = b.sum("model", |n| n == "CPU_REPACK");
            let line = format!(
                "{:<38} {:<20} {:<5} {:>15} {:>13} {:>13} {:>15}",
                name,
                set,
                "host",
                t.exact(
                    &format!("{what} mapped weights"),
                    host.mapped,
                    b.host("model") - repack
                ),
                t.exact(&format!("{what} KV"), host.kv, b.host("KV")),
                t.exact(&format!("{what} state"), host.recurrent, b.host("RS")),
                t.near(&what, &name, set, "host", host.compute, b.host("compute")) + dagger,
            );
            t.lines.push(line);
            if host.repack != 0 || repack != 0.0 {
                t.failures.push(format!(
                    "{what}: repack {} estimated, {repack:.2} MiB logged; none beside CUDA",
                    mib(host.repack)
                ));
            }
        }
    }
    t.print();
    println!("op offload table in {:?}", began.elapsed());
    for (m, s, w, _, why) in COMPUTE_MISSES {
        if OFFLOAD_SETTINGS.contains(&s) {
            println!("* {m} {s} {w}: {why}");
        }
    }
    println!("† the engine turned flash attention off, as the placement says");
    assert!(t.failures.is_empty(), "{:#?}", t.failures);
}

/// Device sizes to offer a model: every layer fits one device; about half the layers do; two
/// devices, the last holding about a third of the layers and the first about a quarter; and
/// none, not even the output layer. Each size is halfway between what the placement says the
/// device needs with the layers it should get and with one layer more, so that a compute
/// buffer off by 5% still picks the same layers.
fn cases(h: &Header, f: &Flags, n_layer: u32, on: Backend) -> Vec<(&'static str, Vec<u64>)> {
    let all = n_layer + 1;
    let need = |counts: &[u32], id: usize| -> u64 {
        let split: Vec<f64> = counts.iter().map(|c| f64::from(*c)).collect();
        let ngl = counts.iter().sum();
        place_on(h, f, ngl, &split, on).unwrap().devices[id].total
    };
    let halfway = |counts: &[u32], id: usize| -> u64 {
        let mut more = counts.to_vec();
        more[id] += 1;
        (need(counts, id) + need(&more, id)) / 2
    };
    let last = (all / 3).max(1);
    let first = (all / 4).max(1).min(all - last - 1);
    vec![
        ("all on 1", vec![need(&[all], 0) + 64 * MIB]),
        ("half on 1", vec![halfway(&[all / 2], 0)]),
        (
            "some on 2",
            vec![halfway(&[first, last], 0), halfway(&[0, last], 1)],
        ),
        ("none on 1", vec![need(&[1], 0) / 2]),
    ]
}

/// Whether llama-fit-params chose `ngl` layers where the engine turns flash attention off, and
/// said so in its log: its trial loads then size the compute buffers as with it on (the need
/// it logs for that count is below the next count's), so it keeps a layer that decide_on gives
/// back to keep flash attention on.
fn keeps_unfused(h: &Header, f: &Flags, ngl: u32, fitted: &Fitted, on: Backend) -> bool {
    let split: Vec<f64> = if fitted.split.is_empty() {
        vec![1.0]
    } else {
        fitted.split.iter().map(|c| f64::from(*c)).collect()
    };
    let p = place_on(h, f, ngl, &split, on).unwrap();
    p.flash_attention_off
        && fitted
            .log
            .contains("Flash Attention not supported, set to disabled")
}

/// Whether a device's need is within 5% of its compute buffer of what it has, with the layers
/// decided or with one more: a compute buffer off by that much may pick one layer more or less.
fn close_call(h: &Header, f: &Flags, counts: &[u32], room: &[u64], on: Backend) -> bool {
    let all = place_on(h, f, 0, &[], on).unwrap().n_layer + 1;
    (0..counts.len()).any(|id| {
        let mut more = counts.to_vec();
        more[id] += 1;
        [counts.to_vec(), more]
            .iter()
            .filter(|c| c.iter().sum::<u32>() <= all)
            .any(|c| {
                let split: Vec<f64> = c.iter().map(|n| f64::from(*n)).collect();
                let p = place_on(h, f, c.iter().sum(), &split, on).unwrap();
                let d = &p.devices[id];
                d.total.abs_diff(room[id]) as f64 <= COMPUTE * d.compute as f64
            })
    })
}

/// Where llama-fit-params' choice leaves a device below its `--fit-target`, by its own log:
/// its report of a device (`- RPCn (...): L layers, U MiB used, F MiB free`, the last for each)
/// with F under the device's margin, or its last accepted trial (`set ngl_per_device[`) with a
/// device's `mem` above its `target` (whole MiB, rounded down, so either is a real shortfall).
/// It does not look at a device again once it has filled it: the next device's layers can
/// turn pipeline parallelism on, which copies every split's inputs four times there, and under
/// op offload a device with no layers still runs the host's prompt.
fn past_target(log: &str, margins: &[u64]) -> Option<String> {
    let number = |line: &str, key: &str| -> Option<u64> {
        let rest = line.split(key).nth(1)?.trim_start();
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let mut free = vec![None; margins.len()];
    let mut target = vec![None; margins.len()];
    let (mut trial, mut accepted) = (vec![None; margins.len()], vec![None; margins.len()]);
    for line in log.lines() {
        if let Some(at) = line.find("  - RPC") {
            let id = number(&line[at..], "RPC");
            if let (Some(id), Some(f)) = (id, number(line, "used,"))
                && let Some(slot) = free.get_mut(id as usize)
            {
                *slot = Some(f);
            }
        } else if let (Some(id), Some(t)) = (number(line, "id="), number(line, "target=")) {
            if let Some(slot) = target.get_mut(id as usize) {
                *slot = Some(t);
            }
        } else if let (Some(id), Some(m)) = (number(line, "id="), number(line, "mem=")) {
            if let Some(slot) = trial.get_mut(id as usize) {
                *slot = Some(m);
            }
        } else if line.contains("set ngl_per_device[") {
            accepted.clone_from(&trial);
        }
    }
    margins.iter().enumerate().find_map(|(id, m)| {
        let margin = m / MIB;
        match (free[id], accepted[id], target[id]) {
            (Some(f), ..) if f < margin => Some(format!(
                "fit-params' own figures leave device {id} below its target: {f} MiB free, {margin} kept"
            )),
            (_, Some(used), Some(t)) if used > t => Some(format!(
                "fit-params' own last trial puts {used} MiB on device {id}, its target {t}"
            )),
            _ => None,
        }
    })
}

/// Under op offload, why the layers differ where a device's compute is a listed miss of the
/// op-offload table (`COMPUTE_MISSES`) in the direction of the difference (an over-estimate
/// offloads fewer layers than llama-fit-params, an under-estimate more), listed for the
/// setting whose layout the disputed placement has: of `ours` and `theirs` (`-ngl` and split),
/// the one with more layers, of a model of `n_layer` blocks on `offered` devices.
fn listed_miss(
    name: &str,
    on: Backend,
    ours: (u32, &[u32]),
    theirs: (u32, &[u32]),
    (n_layer, offered): (u32, usize),
) -> Option<&'static str> {
    if on != Backend::CUDA {
        return None;
    }
    let (ngl, split) = if ours.0 < theirs.0 { theirs } else { ours };
    // The devices holding layers, all offered where the split gives none.
    let devices = match split.iter().filter(|c| **c > 0).count() {
        0 => offered,
        n => n,
    };
    let setting = op_offload_setting(ngl, n_layer, devices)?;
    let listed = |over: bool| {
        COMPUTE_MISSES.iter().any(|(m, s, w, _, why)| {
            name.starts_with(m)
                && *s == setting
                && w.starts_with("dev")
                && why.starts_with(if over { "over" } else { "under" })
        })
    };
    if ours.0 < theirs.0 && listed(true) {
        Some("the device's op-offload compute is a listed over-estimate (COMPUTE_MISSES)")
    } else if ours.0 > theirs.0 && listed(false) {
        Some("the device's op-offload compute is a listed under-estimate (COMPUTE_MISSES)")
    } else {
        None
    }
}

/// The op-offload setting (`OFFLOAD_SETTINGS`) laid out as `ngl` layers of a model of
/// `n_layer` blocks on `devices` devices: only the output on one device, or blocks on the host
/// and on one device, or on two, behind several host blocks or one. None without host blocks
/// (nothing to offload) or without a device.
fn op_offload_setting(ngl: u32, n_layer: u32, devices: usize) -> Option<&'static str> {
    let host_blocks = (n_layer + 1).checked_sub(ngl)?;
    let [all_host, partial, two, one_host] = OFFLOAD_SETTINGS;
    match (devices, host_blocks) {
        (0, _) | (_, 0) => None,
        (1, _) if ngl == 1 => Some(all_host),
        (1, _) => Some(partial),
        (_, 1) => Some(one_host),
        _ => Some(two),
    }
}

/// What the RPC client holds in host memory besides the placement's host part: it copies each
/// tensor it sends a device into one message before sending it (a copy CUDA does not make: it
/// copies from the host buffer), and the heap keeps the largest. The largest of a full
/// context's graph inputs is the attention mask, a slot stream's cells by a ubatch (f16 with
/// flash attention, f32 without), or for a model without attention a ubatch of rows (the token
/// embeddings, f32).
fn rpc_message(h: &Header, fa_off: bool) -> u64 {
    let attends = match arch_key(h, "attention.head_count_kv") {
        Some(Value::Array {
            items: Some(heads), ..
        }) => heads.iter().any(|v| v.as_u64().unwrap_or(0) > 0),
        Some(v) => v.as_u64().unwrap_or(0) > 0,
        None => false,
    };
    let rows = arch_u64(h, "embedding_length") * UBATCH * 4;
    let mask = if attends {
        CTX / PARALLEL * UBATCH * if fa_off { 4 } else { 2 }
    } else {
        0
    };
    rows.max(mask)
}

/// What the RPC client holds in host memory while one rpc-server device hands a tensor to the
/// next (`running` devices with layers): ggml copies it through host memory
/// (`ggml_backend_tensor_copy` between two servers: a buffer it gets the tensor into, then the
/// message it sets it with), a copy CUDA does not make (peer to peer). Twice the largest such
/// tensor: a ubatch of the residual, or of a mamba2 layer's inner rows (its gate, where
/// recurrent layers meet at the split). Measured on mamba2-bench with the same host layers:
/// 78.8 MiB anonymous RSS over one device, 86.7 MiB over two (2026-12-05).
fn rpc_handover(h: &Header, running: usize) -> u64 {
    if running < 2 {
        return 0;
    }
    let widest = arch_u64(h, "embedding_length").max(arch_u64(h, "ssm.inner_size"));
    2 * widest * UBATCH * 4
}

/// The header's `<architecture>.<key>`.
fn arch_key<'a>(h: &'a Header, key: &str) -> Option<&'a Value> {
    h.get(&format!("{}.{key}", h.architecture()?))
}

/// [`arch_key`] as a number, 0 where the header lacks it.
fn arch_u64(h: &Header, key: &str) -> u64 {
    arch_key(h, key).and_then(Value::as_u64).unwrap_or(0)
}

#[tokio::test]
async fn the_layers_decided_for_device_sizes_are_the_ones_llama_fit_params_picks() {
    fit_table(Backend::RPC, &[], &[]).await;
}

/// The same with CUDA's placement: llama-fit-params over devices given CUDA's op-offload rule
/// (`RPC_OFFLOAD`), which then size their trials' compute buffers as a CUDA GPU does, and with
/// no CPU repack beside them, as `decide_on` places for CUDA.
#[tokio::test]
async fn under_op_offload_the_layers_decided_are_the_ones_llama_fit_params_picks() {
    fit_table(Backend::CUDA, &[RPC_OFFLOAD], &["--no-repack".into()]).await;
}

/// Prints, for each model and device sizes (`cases`), the layers `decide_on` offloads for
/// backend `on` beside what llama-fit-params picks with `env` and `more` flags, and fails on a
/// difference the table does not explain.
async fn fit_table(on: Backend, env: &[(&str, &str)], more: &[String]) {
    let fit = testbed_script_with("build-llama-tool.sh", &["llama-fit-params"]);
    let rpc = testbed_script_with("build-llama-tool.sh", &["rpc-server"]);
    let began = std::time::Instant::now();
    let models = hold_models();
    let devices = [RpcServer::start(&rpc), RpcServer::start(&rpc)];
    // rpc-server offers the host's memory as its device's: a device of `size` is the host's
    // memory less a `--fit-target` margin of the rest, in whole MiB as the flag takes it. Both
    // get the same: every device's free memory the host's, and the margins.
    let total = host_memory();
    // llama-fit-params, unlike llama-server (and its --fit), does not bound the outputs of a
    // batch by the slots: its trial loads reserve logits for a whole ubatch on the output
    // layer's device, as llama-server did before b9460 (262k vocabulary: 512 MiB, not 2). Its
    // choice is the operator's for that build.
    let f = Flags {
        build: OUTPUTS_PER_SLOT_FROM - 1,
        ..flags()
    };
    let mut t = Table::default();
    t.lines.push(format!(
        "{:<40} {:<10} {:>16} {:>14} {:>14} {}",
        "model (ctx 8192, 2 slots)", "case", "devices MiB", "decide_on", "fit-params", "note"
    ));
    for model in chosen(models.0, &[]) {
        let name = name(model);
        let h = header(model).await;
        let n_layer = place_on(&h, &f, 0, &[], on).unwrap().n_layer;
        let moe = h.tensors.iter().any(|t| t.name.contains("_exps"));
        for (case, sizes) in cases(&h, &f, n_layer, on) {
            // Rounded up: a device never has more than its size.
            let margins: Vec<u64> = sizes
                .iter()
                .map(|s| (total - s).div_ceil(MIB) * MIB)
                .collect();
            let servers = &devices[..sizes.len()];
            let mut args = vec![
                "--rpc".to_string(),
                rpc_arg(servers),
                "--ctx-size".into(),
                CTX.to_string(),
                "--parallel".into(),
                PARALLEL.to_string(),
                "--ubatch-size".into(),
                UBATCH.to_string(),
                "--fit-target".into(),
                margins
                    .iter()
                    .map(|m| (m / MIB).to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                // Its trials' lines, among them whether flash attention stayed on.
                "--verbose".into(),
            ];
            args.extend_from_slice(more);
            let fitted = fit_params(&fit, model, &args, env);
            let offered: Vec<Device> = sizes
                .iter()
                .map(|_| Device {
                    name: "RPC".into(),
                    free: total,
                })
                .collect();
            let d = decide_on(&h, &f, &offered, &margins, on).unwrap();
            let room: Vec<u64> = margins.iter().map(|m| total - m).collect();
            let p = d.placement();
            // -ngl -1: the engine's default, every layer, split by free memory.
            let engine_ngl = if fitted.ngl < 0 {
                n_layer + 1
            } else {
                u32::try_from(fitted.ngl).unwrap()
            };
            let counts: Vec<u32> = p.split.iter().map(|s| *s as u32).collect();
            let ours = match &d {
                Decision::NoFit { .. } => "0".to_string(),
                _ if counts.len() > 1 => format!("{} ({:?})", p.ngl, counts),
                _ => p.ngl.to_string(),
            };
            let theirs = if fitted.split.is_empty() {
                engine_ngl.to_string()
            } else {
                format!("{engine_ngl} ({:?})", fitted.split)
            };
            let same_split = fitted.split.is_empty() || fitted.split == counts;
            let mut note = String::new();
            if fitted.overrides {
                // --fit's step 4: MoE experts to the host, then whole layers back to the
                // devices; decide_on keeps experts with their layer.
                note = "fit-params moves experts to the host (-ot)".into();
                if !moe {
                    t.failures
                        .push(format!("{name} {case}: -ot for a model without experts"));
                }
            } else if engine_ngl == p.ngl && same_split {
            } else if engine_ngl == p.ngl + 1 && keeps_unfused(&h, &f, engine_ngl, &fitted, on) {
                note =
                    "fit-params keeps one layer more, where the engine turns flash attention off"
                        .into();
            } else if engine_ngl.abs_diff(p.ngl) <= 1 && close_call(&h, &f, &counts, &room, on) {
                note = "a layer's need is within 5% of its compute of the size".into();
            } else if let Some(why) = listed_miss(
                &name,
                on,
                (p.ngl, &counts),
                (engine_ngl, &fitted.split),
                (n_layer, sizes.len()),
            ) {
                note = why.into();
            } else if let Some(why) = past_target(&fitted.log, &margins) {
                note = why;
            } else {
                t.failures.push(format!(
                    "{name} {case}: decide_on {ours}, llama-fit-params {theirs}: {}",
                    fitted
                        .log
                        .lines()
                        .rev()
                        .take(12)
                        .collect::<Vec<_>>()
                        .join(" | ")
                ));
                note = "DIFFERS".into();
            }
            let sizes_mib: Vec<String> = sizes.iter().map(|s| mib(*s)).collect();
            t.lines.push(format!(
                "{:<40} {:<10} {:>16} {:>14} {:>14} {note}",
                name,
                case,
                sizes_mib.join(", "),
                ours,
                theirs
            ));
        }
    }
    let placement = if on == Backend::CUDA {
        "CUDA's, op offload"
    } else {
        "RPC devices'"
    };
    t.print();
    println!("fit table ({placement}) in {:?}", began.elapsed());
    assert!(t.failures.is_empty(), "{:#?}", t.failures);
}
