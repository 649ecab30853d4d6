package steer

// The BPF object is generated and committed (steer_bpfel.go, steer_bpfel.o),
// so building this package needs no clang. Regenerate after editing
// bpf/steer.c or the header it shares with the packet-rate harness's
// programs (internal/bpf/xdp.h) with
//
//	go generate ./engine/steer   (or make generate: both packages)
//
// Reproducibility: bpf/steer.c includes no system header (-nostdinc), only
// internal/bpf/xdp.h; bpf2go
// passes -fno-ident and maps the source directory out of the debug info,
// and strips DWARF, so the object depends only on the clang version and
// the bpf2go version pinned below. The committed object was built with
// Debian clang 14.0.6 (and llvm-strip 14); running go generate twice with
// the same clang gives byte-identical output.
//
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go@v0.22.0 -cc clang -target bpfel -type steer_counters steer bpf/steer.c -- -Wall -Werror -nostdinc
