# The README's commands. `make test` is what CI runs (through .ci/run).
GO ?= go

.PHONY: test test-short bench generate lab vet

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

# Regenerates the committed BPF objects (needs clang).
generate:
	$(GO) generate ./engine/steer/...
