# syntax=docker/dockerfile:1
#
# The agent-harness image: the release binary on a slim Debian base, run as a fixed non-root
# user (UID/GID 10001, the Helm chart's runAsUser/runAsGroup/fsGroup).
#
#   docker build -t agent-harness .                        # the default image (mock agent only)
#   docker build --target node-agents -t agent-harness-node .   # plus Node.js, for `npx` agents
#
# The built-in `mock` profile runs this binary itself (`agent-harness mock-agent`), so the
# default image serves sessions with no agent installed. Real agents are layered on top: see
# the node-agents stage, or start a Dockerfile of your own `FROM agent-harness` and install
# what the profiles' commands need (switch to USER root for apt-get, and back to ${APP_UID}).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie
ARG APP_UID=10001

# --- build ------------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
# Everything cargo reads (see .dockerignore): the root package and the workspace members under
# crates/ (the mock agent is compiled into the binary; the bench and the test kit are not). build.rs compiles proto/ with protox, so no
# protoc is needed; SQLite is bundled and built with the image's C compiler.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin agent-harness \
    && install -D -m 0755 target/release/agent-harness /out/agent-harness

# --- base: what every runtime image shares ------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim AS base
ARG APP_UID
# Debian's packages are not pinned (DL3008): a stable release replaces versions with security
# fixes, so pins would break the build rather than make it reproducible.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid "${APP_UID}" agent-harness \
    && useradd --uid "${APP_UID}" --gid "${APP_UID}" --home-dir /home/agent-harness \
        --create-home --shell /usr/sbin/nologin agent-harness \
    && install -d -o "${APP_UID}" -g "${APP_UID}" /var/lib/agent-harness /workspaces
COPY --from=build /out/agent-harness /usr/local/bin/agent-harness
USER ${APP_UID}:${APP_UID}
WORKDIR /home/agent-harness
ENV HOME=/home/agent-harness
EXPOSE 50051 9090
ENTRYPOINT ["agent-harness"]
# Listens on every address of the container. With no tokens the server refuses that and says
# so: mount a tokens file and add --tokens-file, or add --insecure-allow-non-loopback to try
# it out (see the README). The Helm chart passes its own arguments.
CMD ["serve", "--listen=0.0.0.0:50051", "--data-dir=/var/lib/agent-harness"]

# --- node-agents: base plus Node.js and npm, for profiles whose command is `npx …` ----------------
FROM base AS node-agents
ARG APP_UID
USER 0:0
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nodejs npm \
    && rm -rf /var/lib/apt/lists/*
USER ${APP_UID}:${APP_UID}

# --- the default target -------------------------------------------------------------------------
FROM base AS runtime
