# The modelserve image: the operator (`modelserve controller`), the mirror (`modelserve mirror`) and
# the replicas' init container (`modelserve pull`) all run this one static binary.
#
#   docker build -t ghcr.io/modelserve/modelserve:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/modelserve/modelserve:0.1.0 .
#
# testbed/build-image.sh writes the same image (same path, user, entrypoint and environment)
# without a daemon; tests/image.rs keeps the two in step.

# Build on the machine's own platform and cross-compile to the target's: no emulation.
FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95-bookworm AS build
ARG TARGETARCH
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# A static musl binary: the final image has no libc. ring compiles C, with musl-gcc.
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-musl ;; \
      arm64) target=aarch64-unknown-linux-musl; apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu \
             && export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc ;; \
      *) echo "unsupported TARGETARCH '$TARGETARCH': amd64 or arm64" >&2; exit 1 ;; \
    esac \
 && rustup target add "$target" \
 && CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --locked --target "$target" --bin modelserve \
 && install -D -m 0755 "target/$target/release/modelserve" /out/usr/local/bin/modelserve \
 && install -d -m 1777 /out/tmp

FROM scratch
COPY --from=build /out/ /
ENV PATH=/usr/local/bin
# Not root: the chart and the generated Deployments also set runAsNonRoot with this uid.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/modelserve"]
LABEL org.opencontainers.image.title=modelserve org.opencontainers.image.licenses=Apache-2.0
