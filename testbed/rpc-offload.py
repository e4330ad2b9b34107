#!/usr/bin/env python3
"""Adds an opt-in op offload to llama.cpp's RPC client, in a copy of its sources:

    python3 testbed/rpc-offload.py LLAMA_CPP_SOURCE_DIR

With MODELSERVE_RPC_OFFLOAD set in llama-server's environment, an RPC device (an rpc-server
process) takes over a prompt's operations whose weights are in host memory, by the rule the CUDA
backend uses (ggml_backend_cuda_device_offload_op: 32 rows or more, never a row lookup). The
scheduler then lays a partial offload out over rpc-server devices as it does over a CUDA GPU:
on an H200 every CUDA0 and host compute buffer testbed/gpu-check.sh logged was the one
llama-server logged with this over rpc-server devices and --no-repack (CUDA's pinned host buffer
type keeps the host's weights from the CPU repack). Without the variable nothing changes: the
RPC device answers no, as it does upstream. tests/offload_engine.rs uses it."""
import sys
from pathlib import Path

ANCHOR = "static bool ggml_backend_rpc_device_supports_buft("
ADDED = """// modelserve test bed (testbed/rpc-offload.py): CUDA's op-offload rule, when asked for.
static bool ggml_backend_rpc_device_offload_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    GGML_UNUSED(dev);
    static const bool asked = getenv("MODELSERVE_RPC_OFFLOAD") != nullptr;
    if (!asked) {
        return false;
    }
    int64_t rows;
    switch (op->op) {
        case GGML_OP_GET_ROWS:
            rows = 0;
            break;
        case GGML_OP_MUL_MAT:
            rows = op->ne[1];
            break;
        case GGML_OP_MUL_MAT_ID:
        case GGML_OP_ROPE:
        case GGML_OP_ROPE_BACK:
            rows = op->ne[2];
            break;
        default:
            rows = ggml_nrows(op);
            break;
    }
    return rows >= 32;
}

"""
SLOT = "/* .offload_op           = */ NULL,"
FILLED = "/* .offload_op           = */ ggml_backend_rpc_device_offload_op,"


def main() -> int:
    path = Path(sys.argv[1]) / "ggml/src/ggml-rpc/ggml-rpc.cpp"
    text = path.read_text()
    if text.count(ANCHOR) != 1 or text.count(SLOT) != 1:
        print(f"rpc-offload: {path} does not have the RPC device interface this expects "
              f"({text.count(ANCHOR)} '{ANCHOR}', {text.count(SLOT)} '{SLOT}'); "
              "a new llama.cpp needs this script looked at", file=sys.stderr)
        return 1
    path.write_text(text.replace(ANCHOR, ADDED + ANCHOR).replace(SLOT, FILLED))
    return 0


if __name__ == "__main__":
    sys.exit(main())
