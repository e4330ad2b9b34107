#!/usr/bin/env bash
# Builds llama-server from the llama.cpp sources vendored in the llama-cpp-python sdist, cached by
# version (see build-llama-tool.sh). Prints the path of the binary on its last line.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/build-llama-tool.sh" llama-server
