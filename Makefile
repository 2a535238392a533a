# toolgate: `make run` starts everything with the example tools; `make test` runs every test.
GO      ?= go
DATA    ?= toolgate-data
PKGS    := ./...
# Where `make build` and `make install` put toolgate (and install the nats
# CLI): put it on PATH (export PATH="$$PWD/bin:$$PATH") to type `toolgate`.
BIN     ?= bin
LISTEN  ?= 127.0.0.1:4222
METRICS ?= 127.0.0.1:9464

.PHONY: run build install test test-short fuzz bench chaos image image-test lint fmt vet staticcheck clean mcp-servers nats s3-server

# The built binary, not `go run`: go run exits 1 whenever it is interrupted,
# whatever the program's own status, so Ctrl-C after a clean drain would end
# in make's "Error 1". exec: the signal reaches serve, whose status make sees.
run: build
	exec $(BIN)/toolgate serve --examples --data $(DATA) --listen $(LISTEN) --file-root examples/files --mcp-path-roots .cache/mcp-servers --metrics-addr $(METRICS)

build:
	$(GO) build -o $(BIN)/toolgate ./cmd/toolgate

# toolgate and the nats CLI in $(BIN), for the commands the README and
# `make run` print: export PATH="$$PWD/bin:$$PATH".
install: build nats
	cp .cache/bin/nats $(BIN)/nats

# The reference MCP servers the tests run against, and the MCP Inspector
# (a client nobody here wrote) that tests `toolgate mcp`, installed once.
MCP_SERVERS := .cache/mcp-servers
MCP_INSPECTOR_VERSION := 2.12.0
mcp-servers:
	@test -f $(MCP_SERVERS)/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js \
	  -a -f $(MCP_SERVERS)/node_modules/@modelcontextprotocol/server-everything/dist/index.js \
	  -a -f $(MCP_SERVERS)/node_modules/@modelcontextprotocol/inspector/package.json || \
	  npm install --no-audit --no-fund --prefix $(MCP_SERVERS) \
	    @modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31 \
	    @modelcontextprotocol/inspector@$(MCP_INSPECTOR_VERSION)

# The nats CLI, for the README's command blocks (docs/docs_test.go skips
# them without it). Its module has no version list on the proxy, so it is
# fetched by exact version inside a throw-away module.
NATS_CLI_VERSION ?= v0.4.0
nats:
	@test -x .cache/bin/nats || { d=$$(mktemp -d) && cd $$d && $(GO) mod init natscli >/dev/null 2>&1 && \
	  $(GO) get github.com/nats-io/natscli/nats@$(NATS_CLI_VERSION) && \
	  $(GO) build -o $(CURDIR)/.cache/bin/nats github.com/nats-io/natscli/nats; s=$$?; rm -rf $$d; exit $$s; }

# versitygw, the S3-compatible server (posix backend) the audit archive's
# S3 tests start (docs/audit.md); built like the nats CLI.
VERSITYGW_VERSION ?= v1.8.0
s3-server:
	@test -x .cache/bin/versitygw || { d=$$(mktemp -d) && cd $$d && $(GO) mod init s3server >/dev/null 2>&1 && \
	  $(GO) get github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION) && \
	  $(GO) build -o $(CURDIR)/.cache/bin/versitygw github.com/versity/versitygw/cmd/versitygw; s=$$?; rm -rf $$d; exit $$s; }

test: mcp-servers s3-server
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 15m $(PKGS)
# Without the race detector: the allocation budgets, whose counts its
# instrumentation would change, and a check of a pure function it would
# slow fifteen-fold, which under it takes a sample of its cases.
	$(GO) test -count=1 -run '^(TestAllocationBudget|TestPrefilterAgreesWithFullScan)$$' $(PKGS)
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

# Fault injection with real processes (internal/chaos): 10,000 invocations
# per scenario while stage workers and servers are SIGKILLed, restarted,
# wiped and partitioned; prints lost/duplicated figures. `make test` runs a
# short single-server variant.
CHAOS_N ?= 10000
CHAOS_RATE ?= 60
chaos:
	TOOLGATE_CHAOS_N=$(CHAOS_N) TOOLGATE_CHAOS_RATE=$(CHAOS_RATE) TOOLGATE_CHAOS_CLUSTER=1 \
	  $(GO) test -count=1 -timeout 90m -v -run '^Test(Chaos|SyncIntervalCost)' ./internal/chaos/

# The container image (deploy/Dockerfile): docker when its daemon runs, else
# buildah or podman (chroot isolation, vfs storage). Where no registry is
# reachable the bases are made from Debian's mirror and the local Go
# toolchain; deploy/image/build.sh says how. Takes minutes.
IMAGE ?= toolgate:latest
image:
	IMAGE=$(IMAGE) deploy/image/build.sh

# Builds the image, then runs it: `toolgate version` and `toolgate serve`
# (embedded NATS, /healthz) as the image's user, from its exported layers
# under bwrap (deploy/image_test.go). Not part of `make test`.
image-test: image
	cd deploy && TOOLGATE_IMAGE_TEST=1 IMAGE=$(IMAGE) $(GO) test -count=1 -v -run '^TestImage' -timeout 20m .

# Each decoder of outside input, fuzzed for FUZZTIME: every Fuzz function
# of the tree, found in the test files, so a new one cannot be left out.
FUZZTIME ?= 20s
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' --exclude-dir=.cache '^func Fuzz' . | sort); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    echo "$$t $$(dirname $$f)"; \
	    $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f)/; \
	  done; \
	done

# First toolgate as shipped: a `toolgate serve` process with its defaults,
# load from the bench process connected as an agent, beside the bare and
# floor chains on serve's own server, with the serve process's CPU per call
# and, from a 20 s CPU profile of serve (.cache/serve.prof), the share per
# call of toolgate's stages, Ed25519, JSON and nats-server.
# Then the in-process series: throughput and latency through all six stages
# next to the bare chain; the goals (saturation, latency unloaded and at half
# load, authorization) each printed with its target; then 200 concurrent
# calls of a tool that waits 1 s, with execute's default concurrency (goal:
# all end within 2 s, s/batch); then the labelled tool outputs through the
# verify stage, per category: recall, benign intact, µs/KiB and µs per
# output (docs/safety.md).
# SOAK is the length of the memory-growth run at half saturation (make bench
# SOAK=10m for the long run).
# The shipped series measures serve with --sync always (as shipped) and
# with --sync interval, each beside the chains, with the store's writes and
# fsyncs per call. With --sync interval it also measures, in turn in the
# same rounds, the starting build (BASELINE, built from this repository's
# history into .cache/bin/toolgate-BASELINE): goal 4 halves its own CPU per
# call. Without the history the goal is read against the first shipped
# build's recorded figure.
SOAK ?= 1m
BASELINE ?= 57a9526
bench: mcp-servers
	@$(MAKE) -s .cache/bin/toolgate-$(BASELINE) || echo "make bench: the starting build ($(BASELINE)) could not be built; goal 4 is read against a recorded figure"
	$(GO) run ./cmd/toolgate bench --rate 300 --duration 10s --workers 16 --soak $(SOAK) --serve-cpuprofile .cache/serve.prof \
	  $$(test -x .cache/bin/toolgate-$(BASELINE) && echo --baseline-binary .cache/bin/toolgate-$(BASELINE))
	$(GO) test -run '^$$' -bench '^BenchmarkWaitingCalls$$' -benchtime 3x ./internal/node/
	$(GO) test -run '^$$' -bench '^BenchmarkOutputCorpus$$' -benchtime 5x ./stages/verify/
	$(GO) test -run '^$$' -bench '^BenchmarkDocumentFetch$$' -benchtime 300x ./internal/documents/
	$(GO) test -run '^$$' -bench '^BenchmarkCheckpoint$$' -benchtime 20x ./kvstore/
	$(GO) test -run '^$$' -bench '^BenchmarkShadow$$' -benchtime 3000x ./stages/authorize/

.cache/bin/toolgate-$(BASELINE):
	@mkdir -p .cache/bin
	rm -rf .cache/baseline-src && mkdir -p .cache/baseline-src
	git archive $(BASELINE) | tar -x -C .cache/baseline-src
	cd .cache/baseline-src && $(GO) build -o ../bin/toolgate-$(BASELINE) ./cmd/toolgate
	rm -rf .cache/baseline-src

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

clean:
	rm -rf bin $(DATA)
