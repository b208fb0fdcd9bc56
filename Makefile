# kvstrata — `make help` lists the targets.

GO        ?= go
BIN       ?= bin
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
TOOLS     := $(CURDIR)/.tools
FUZZTIME  ?= 30s
BENCHTIME ?= 1s

.PHONY: help build build-ucx build-cuda run test test-short bench fuzz lint proto clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# -buildvcs=auto records the commit (kvstrata version) from a git clone
# even where GOFLAGS turns it off, and builds without it elsewhere.
build: ## build kvstrata and kvctl into ./bin
	$(GO) build -buildvcs=auto -o $(BIN)/ ./cmd/kvstrata ./cmd/kvctl

build-ucx: ## build with the UCX data plane (needs libucx-dev)
	$(GO) build -buildvcs=auto -tags ucx -o $(BIN)/ ./cmd/kvstrata ./cmd/kvctl

build-cuda: ## build with the HBM tier (loads the CUDA driver at run time; no toolkit needed)
	$(GO) build -buildvcs=auto -tags cuda -o $(BIN)/ ./cmd/kvstrata ./cmd/kvctl

run: ## run a single-node cache with the defaults (./data, 127.0.0.1 ports)
	$(GO) run ./cmd/kvstrata serve

# The UCX data plane's tests build with cgo against libucx (Debian
# libucx-dev); make test runs them where the headers are installed.
UCX := $(shell test -f /usr/include/ucp/api/ucp.h && echo yes)

# cmd/kvstrata's end-to-end tests start real processes (cache nodes, workers,
# frontends, a Python worker) and take about ten minutes of a 2-core machine
# under the race detector: past go test's default 10-minute bound.
TEST_TIMEOUT := 25m

test: ## run every test with the race detector, the cuda-tagged ones, and the ucx-tagged ones where libucx-dev is installed (what CI runs)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(GO) vet -tags cuda ./...
	$(GO) test -race -count=1 -tags cuda ./gpu/... ./tiers/hbm/
	$(GO) test -race -count=1 -tags cuda -run HBM ./api/daemon/ ./api/dataplane/
ifeq ($(UCX),yes)
	$(GO) vet -tags ucx ./...
	$(GO) test -race -count=1 -tags ucx ./transfer/... ./api/client/
	$(GO) vet -tags ucx,cuda ./api/dataplane/
	$(GO) test -race -count=1 -tags ucx,cuda -run HBM ./api/dataplane/
else
	@echo "make test: libucx-dev is not installed, so the ucx-tagged tests did not run (apt-get install libucx-dev)"
endif

test-short: ## run the tests without the race detector
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

bench: ## run the Go benchmarks (BENCHTIME=1s); bench/*.sh compare with fio, iperf3, redis
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./...

fuzz: ## run every fuzz target for FUZZTIME each (default 30s)
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

lint: ## go vet and gofmt
	$(GO) vet ./...
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

proto: ## regenerate api/v1 from cache.proto and keyspace.proto with the pinned generators (needs protoc)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH=$(TOOLS):$$PATH protoc --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative api/v1/cache.proto api/v1/keyspace.proto

clean: ## remove build outputs
	rm -rf $(BIN) $(TOOLS)
