# Builds the relay into a minimal image: a static binary on distroless
# static (no shell, no package manager, no libc), run as the non-root user
# 65532. deploy/chartcheck's TestDockerfile checks this file.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags=-buildid= -o /out/relay ./cmd/relay
# The data directory, owned by the runtime user: a named volume mounted at
# /data starts as a copy of it, so the relay can write there.
RUN mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/relay /usr/local/bin/relay
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME /data
EXPOSE 9092 9464
# Exec form: there is no shell. The URL is `relay run`'s --http-addr port
# below; a container run with another --http-addr needs its own check
# (docker-compose.yml's relay-kafka has one).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["/usr/local/bin/relay", "healthcheck", "--url", "http://127.0.0.1:9464/healthz"]
ENTRYPOINT ["/usr/local/bin/relay"]
CMD ["run", "--data-dir", "/data", "--kafka-addr", "0.0.0.0:9092", "--http-addr", "0.0.0.0:9464"]
