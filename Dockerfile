# Builds the static agent and ships it alone, for control planes to `COPY --from`:
#   COPY --from=gitterm-agent /gitterm-agent /usr/local/bin/gitterm-agent
FROM rust:1-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl \
 && cp target/x86_64-unknown-linux-musl/release/gitterm-agent /gitterm-agent

FROM scratch
COPY --from=build /gitterm-agent /gitterm-agent
ENTRYPOINT ["/gitterm-agent"]
CMD ["serve"]
