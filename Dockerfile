# An image holding only the static agent, for control planes to `COPY --from`:
#   COPY --from=gitterm-agent /gitterm-agent /usr/local/bin/gitterm-agent
#
# Two ways to build it:
#   docker build -t gitterm-agent .
#       compiles the binary in the rust image (needs the network for that image and
#       for crates);
#   scripts/image.sh
#       packs a binary already built by scripts/build-static.sh, with no network: it
#       builds the `prebuilt` stage with a context holding only that binary, as in
#       `podman build --target prebuilt -f Dockerfile DIR_WITH_gitterm-agent`.
#
# Base images are named in full: Debian's podman and buildah refuse short names.

# The binary from the build context, as scripts/build-static.sh made it.
FROM scratch AS prebuilt
COPY gitterm-agent /gitterm-agent
# In a container, serve must listen beyond loopback to be reachable through a published
# port. It then speaks plain HTTP on every interface of the container, and the bearer
# token is the only guard: publish the port only where the control plane can reach it,
# and pass the token in with --token-file (else it is generated into
# /root/.gitterm/agent.token inside the container).
# The state root is $HOME/.gitterm; without /etc/passwd an engine may set HOME to /
# (podman does), so it is set here.
ENV HOME=/root
EXPOSE 7433
ENTRYPOINT ["/gitterm-agent"]
CMD ["serve", "--listen", "0.0.0.0:7433"]

# The binary compiled from source.
FROM docker.io/library/rust:1-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl \
 && cp target/x86_64-unknown-linux-musl/release/gitterm-agent /gitterm-agent

# The default (last) stage: the same image as `prebuilt`, from the compiled binary.
FROM scratch
COPY --from=build /gitterm-agent /gitterm-agent
# serve listens beyond loopback so a published port reaches it; the token is then the
# only guard (see the `prebuilt` stage).
ENV HOME=/root
EXPOSE 7433
ENTRYPOINT ["/gitterm-agent"]
CMD ["serve", "--listen", "0.0.0.0:7433"]
