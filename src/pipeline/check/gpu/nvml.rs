//! One GPU's memory in MiB for the NVIDIA models modelserve knows without a GPU Feature Discovery
//! label on the node (by GKE accelerator, by cloud instance type). Where GFD or nvidia-smi was
//! seen reporting the model, NVML's total (for the A100 40GB the lower of the two seen, 40536
//! with ECC on, 40960 without). For the H200 and the RTX PRO 6000, whose totals were not seen, the
//! size their names and data sheets give in decimal GB (141 and 96), below what NVML reports for
//! either. Too low a figure places fewer layers; too high one would fail the load.

pub const T4: u64 = 15360;
pub const A10G: u64 = 23028;
pub const L4: u64 = 23034;
pub const L40S: u64 = 46068;
pub const A100_40GB: u64 = 40536;
pub const A100_80GB: u64 = 81920;
pub const H100_80GB: u64 = 81559;
pub const H200: u64 = 141_000_000_000 >> 20;
pub const RTX_PRO_6000: u64 = 96_000_000_000 >> 20;
