# raftlock's image, built the ordinary way (needs a registry for the Rust
# image): two self-contained (statically linked) binaries in an empty image.
# On a machine without a registry, scripts/docker-image.sh builds the same
# image from a local build instead (docker/Dockerfile.local).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static --cfg tokio_unstable" \
    cargo build --release --locked --target x86_64-unknown-linux-gnu --bins \
 && mkdir -p /out/data && cp target/x86_64-unknown-linux-gnu/release/raftlock target/x86_64-unknown-linux-gnu/release/raftlockctl /out/

# Runs as an unprivileged user (65532; the image has no /etc/passwd), who
# owns /data; a new volume mounted there takes that ownership.
FROM scratch
COPY --from=build /out/raftlock /out/raftlockctl /
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME /data
EXPOSE 2379 2380
# Defaults as variables, not flags: a flag would override the RAFTLOCK_*
# variables compose files set (docker-compose.tls.yml's https URLs).
ENV RAFTLOCK_DATA_DIR=/data \
    RAFTLOCK_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
    RAFTLOCK_LISTEN_PEER_URLS=http://0.0.0.0:2380
ENTRYPOINT ["/raftlock"]
