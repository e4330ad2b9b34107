# The modelserve image: the operator (`modelserve controller`), the mirror (`modelserve mirror`) and
# the replicas' init container (`modelserve pull`) all run this one static binary.
#
#   docker build -t ghcr.io/modelserve/modelserve:0.1.0 .
#
# testbed/build-image.sh writes the same image (same path, user, entrypoint and environment)
# without a daemon; tests/image.rs keeps the two in step.

FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# A static musl binary for the platform being built: the final image has no libc. ring
# compiles C, with musl-gcc.
RUN target="$(uname -m)-unknown-linux-musl" \
 && rustup target add "$target" \
 && CC="musl-gcc" cargo build --release --locked --target "$target" --bin modelserve \
 && install -D -m 0755 "target/$target/release/modelserve" /out/usr/local/bin/modelserve \
 && install -d -m 1777 /out/tmp

FROM scratch
COPY --from=build /out/ /
ENV PATH=/usr/local/bin
# Not root: the chart and the generated Deployments also set runAsNonRoot with this uid.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/modelserve"]
LABEL org.opencontainers.image.title=modelserve org.opencontainers.image.licenses=Apache-2.0
