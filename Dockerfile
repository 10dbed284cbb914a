# Builds the relay binary into a small image.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /relay ./cmd/relay

FROM debian:bookworm-slim
COPY --from=build /relay /usr/local/bin/relay
USER 65532:65532
VOLUME /data
EXPOSE 9092 9464
ENTRYPOINT ["relay"]
CMD ["run", "--data-dir", "/data", "--kafka-addr", "0.0.0.0:9092", "--http-addr", "0.0.0.0:9464"]
