//! What the engine really offloaded, from its own log: llama.cpp writes `offloaded N/M layers to
//! GPU` and each weights buffer when its build can offload (at `-lv 4` from b11312 on), and `no
//! usable GPU found, --gpu-layers option will be ignored` when it cannot. A build that can
//! offload but finds no device (a CPU image with the RPC backend, say) still counts the layers
//! it was asked for; its weights' buffers, all in host memory, tell. A replica that answers on
//! fewer GPU layers than the Check stage planned (a CPU image, a GPU the container does not see)
//! runs many times slower, and is said so rather than called Ready.

/// What the log says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// `offloaded N/M layers to GPU`.
    Layers { done: u32, of: u32 },
    /// The engine found no GPU and runs every layer on the CPU.
    NoGpu,
    /// The log says neither (not read, cut short, or a build that does not say).
    Unknown,
}

/// The largest part of a log read.
pub const MAX_LOG: i64 = 4 << 20;

/// Reads the engine's log.
pub fn seen(log: &str) -> Seen {
    if log.contains("no usable GPU found") {
        return Seen::NoGpu;
    }
    match layers(log) {
        // A build with an offloading backend but no device counts the layers it was asked to
        // offload; its weights' buffers then say where they really are.
        Some((done, _)) if done > 0 && weights_on_host_only(log) => Seen::NoGpu,
        Some((done, of)) => Seen::Layers { done, of },
        None => Seen::Unknown,
    }
}

/// Whether the log names the weights' buffers (`<buffer> model buffer size = ...`) and every
/// one of them is host memory (`CPU`, `CPU_Mapped`, `CPU_REPACK`, a GPU runtime's `*_Host`).
fn weights_on_host_only(log: &str) -> bool {
    let mut buffers = log.lines().filter_map(|l| {
        let (head, _) = l.split_once(" model buffer size")?;
        head.split_whitespace().last()
    });
    let mut any = false;
    let host = buffers.all(|b| {
        any = true;
        b.starts_with("CPU") || b.ends_with("_Host")
    });
    any && host
}

/// `offloaded N/M layers to GPU`, the last one logged.
fn layers(log: &str) -> Option<(u32, u32)> {
    for line in log.lines().rev() {
        let Some((_, rest)) = line.split_once("offloaded ") else {
            continue;
        };
        let Some((counts, _)) = rest.split_once(" layers to GPU") else {
            continue;
        };
        if let Some((done, of)) = counts.split_once('/')
            && let (Ok(done), Ok(of)) = (done.trim().parse(), of.trim().parse())
        {
            return Some((done, of));
        }
    }
    None
}

/// Why the engine's offload falls short of the `planned` layers, if it does.
pub fn shortfall(planned: u32, seen: Seen) -> Option<String> {
    match seen {
        Seen::NoGpu if planned > 0 => Some(format!(
            "the engine found no usable GPU and runs every layer on the CPU, though {planned} were planned on GPUs: check that engine.image is a GPU build (server-cuda-bN, server-rocm-bN, server-vulkan-bN) and that the container gets the GPUs"
        )),
        Seen::Layers { done, of } if done < planned => Some(format!(
            "the engine offloaded {done} of {of} layers to its GPUs, fewer than the {planned} planned, and runs the rest on the CPU"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_own_line_says_what_it_offloaded() {
        let log = "load_tensors: offloading output layer to GPU\nload_tensors: offloading 32 repeating layers to GPU\nload_tensors: offloaded 33/33 layers to GPU\nload_tensors: CUDA0 model buffer size = 4403.50 MiB\n";
        assert_eq!(seen(log), Seen::Layers { done: 33, of: 33 });
        assert_eq!(shortfall(33, seen(log)), None);
        assert_eq!(
            seen("warning: no usable GPU found, --gpu-layers option will be ignored\n"),
            Seen::NoGpu
        );
        assert_eq!(seen("main: model loaded\n"), Seen::Unknown);
    }

    #[test]
    fn a_build_that_counts_layers_it_could_not_offload_is_told_by_its_buffers() {
        // The test bed's CPU engine (RPC backend built in, no device), at -lv 4.
        let cpu = "I load_tensors: offloading output layer to GPU\nI load_tensors: offloading 1 repeating layers to GPU\nI load_tensors: offloaded 3/3 layers to GPU\nI load_tensors:   CPU_Mapped model buffer size =     0.21 MiB\n";
        assert_eq!(seen(cpu), Seen::NoGpu);
        // Partly offloaded: the GPU holds some weights, the host (pinned or mapped) the rest.
        let partial = "load_tensors: offloaded 20/33 layers to GPU\nload_tensors: CPU_Mapped model buffer size = 100.00 MiB\nload_tensors: CUDA_Host model buffer size = 10.00 MiB\nload_tensors: CUDA0 model buffer size = 2000.00 MiB\n";
        assert_eq!(seen(partial), Seen::Layers { done: 20, of: 33 });
        let rpc = "load_tensors: offloaded 5/5 layers to GPU\nload_tensors: RPC0[127.0.0.1:50501] model buffer size = 1.00 MiB\nload_tensors: CPU_Mapped model buffer size = 0.20 MiB\n";
        assert_eq!(seen(rpc), Seen::Layers { done: 5, of: 5 });
    }

    #[test]
    fn fewer_layers_or_no_gpu_is_a_shortfall_that_says_what_to_check() {
        let less = shortfall(33, Seen::Layers { done: 20, of: 33 }).unwrap();
        assert!(
            less.contains("offloaded 20 of 33 layers") && less.contains("33 planned"),
            "{less}"
        );
        let cpu = shortfall(33, Seen::NoGpu).unwrap();
        assert!(
            cpu.contains("no usable GPU") && cpu.contains("server-cuda"),
            "{cpu}"
        );
        assert_eq!(
            shortfall(0, Seen::NoGpu),
            None,
            "nothing was planned on a GPU"
        );
        assert_eq!(shortfall(33, Seen::Unknown), None);
    }
}
