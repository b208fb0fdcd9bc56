# syntax=docker/dockerfile:1
#
# kvstrata as a container image: a static binary built without cgo (so
# without the UCX data plane, which needs libucx; the TCP data plane is
# pure Go) on a distroless base that holds no shell and no package
# manager, run as the unprivileged user nonroot (65532).
#
#   docker build -t kvstrata .
#   docker run --rm -p 7070-7072:7070-7072 -p 6380:6380 -p 9090:9090 \
#     -e KVSTRATA_ADVERTISE_HOST=127.0.0.1 -v kvstrata-data:/data kvstrata
#
# The node listens on every address of the container, so it must be told
# what others dial (KVSTRATA_ADVERTISE_HOST, or --advertise-host): the
# address of the machine, or 127.0.0.1 for clients on the same one. Every
# other setting keeps its built-in default, /data is its data directory
# (the SSD tier), and any setting can be given as a flag after `serve` or
# as a KVSTRATA_ variable.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so that a change of the sources reuses their layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/ ./cmd/kvstrata ./cmd/kvctl
# The data directory, owned by nonroot, so that a new volume mounted there
# is too.
RUN mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvstrata /out/kvctl /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV KVSTRATA_DATA_DIR=/data \
    KVSTRATA_LISTEN_GRPC=0.0.0.0:7070 \
    KVSTRATA_LISTEN_DATA=0.0.0.0:7071 \
    KVSTRATA_CLUSTER_RAFT_ADDR=0.0.0.0:7072 \
    KVSTRATA_LISTEN_RESP=0.0.0.0:6380 \
    KVSTRATA_LISTEN_HTTP=0.0.0.0:9090
# gRPC, data plane, raft, Redis protocol, metrics and health.
EXPOSE 7070 7071 7072 6380 9090
VOLUME ["/data"]
ENTRYPOINT ["/usr/local/bin/kvstrata"]
CMD ["serve"]
