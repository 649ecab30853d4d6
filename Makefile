# The README's commands. `make test` is what CI runs (through .ci/run).
GO ?= go

.PHONY: test test-short bench generate lab vet pgo

# gofmt, vet and all tests of the library and of the benchmarks module,
# race detector on.
# Tests that need root skip (with a message) without it; CI runs as root.
test:
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	cd benchmarks && $(GO) vet ./... && $(GO) test -race -count=1 ./...

# Without the race detector (faster, for a quick check).
test-short:
	$(GO) test -count=1 ./...

# Microbenchmarks against peers; see benchmarks/README.md.
bench:
	cd benchmarks && $(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

# Regenerates the committed BPF objects (needs clang): the steering
# program and the packet-rate harness's, which share internal/bpf/xdp.h.
generate:
	$(GO) generate ./engine/steer/... ./internal/lab/pktrate/...

# Regenerates the profile the binaries are built with (profile-guided
# optimisation: go build uses a main package's default.pgo): the CPU
# profiles of the Mux and Host Agent pipeline benchmarks, merged, one copy
# per binary. One profile, not one per binary: the build cache keys every
# package's compilation by the profile's content, so the binaries share one
# optimised build of their dependencies. See benchmarks/README.md for what
# it gains (benchmarks/abpgo.sh).
pgo:
	set -e; d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	$(GO) test -run '^$$' -bench 'BenchmarkMuxPipeline/.*/impl=xdplb' -benchtime 3s -cpu 1 -cpuprofile "$$d/mux.pprof" -o "$$d/mux.test" ./mux/; \
	$(GO) test -run '^$$' -bench 'BenchmarkHostAgentPipeline' -benchtime 2s -cpu 1 -cpuprofile "$$d/hostagent.pprof" -o "$$d/hostagent.test" ./hostagent/; \
	$(GO) tool pprof -proto "$$d/mux.pprof" "$$d/hostagent.pprof" > examples/mux/default.pgo; \
	cp examples/mux/default.pgo examples/hostagent/default.pgo; \
	cp examples/mux/default.pgo examples/lab/default.pgo; \
	cp examples/mux/default.pgo examples/xdplbctl/default.pgo
