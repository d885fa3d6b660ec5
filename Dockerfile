# Multi-stage build: compile in the Rust image, run in a small Debian image as a non-root user.
#   docker build -t zarrgate .
#   docker run -p 8080:8080 zarrgate                      # the embedded demo
#   docker run -p 8080:8080 -v $PWD/my.toml:/srv/zarrgate/config.toml:ro -v /data:/data:ro zarrgate
# Mount URLs in the config are relative to the config file (/srv/zarrgate) or absolute (/data/...).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY static ./static
COPY schemas ./schemas
COPY benches ./benches
RUN cargo build --release --locked && strip target/release/zarrgate

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin zarrgate
COPY --from=build /src/target/release/zarrgate /usr/local/bin/zarrgate
WORKDIR /srv/zarrgate
COPY data/demo ./data/demo
COPY config.toml ./config.toml
ENV ZARRGATE_BIND=0.0.0.0:8080 \
    ZARRGATE_CONFIG=/srv/zarrgate/config.toml \
    ZARRGATE_LOG=info
VOLUME ["/data"]
EXPOSE 8080
USER zarrgate
# GET /healthz where serve listens (ZARRGATE_HEALTH_BIND / the config's health_bind when set, else
# ZARRGATE_BIND / bind); the image has no curl.
HEALTHCHECK --interval=30s --timeout=10s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/zarrgate", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/zarrgate"]
CMD ["serve"]
