package pktrate

// The BPF objects are generated and committed (sink_bpfel.go/.o,
// redirect_bpfel.go/.o), so building this package needs no clang.
// Regenerate after editing bpf/*.c or the header they share with
// engine/steer (internal/bpf/xdp.h) with
//
//	go generate ./internal/lab/pktrate   (or make generate: both packages)
//
// As for engine/steer: the C includes no system header (-nostdinc), bpf2go
// passes -fno-ident and strips DWARF, so the objects depend only on the
// clang version (Debian clang 14.0.6 built the committed ones) and the
// bpf2go version pinned below.
//
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go@v0.22.0 -cc clang -target bpfel -type sink_counters sink bpf/sink.c -- -Wall -Werror -nostdinc
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go@v0.22.0 -cc clang -target bpfel -type redirect_counters redirect bpf/redirect.c -- -Wall -Werror -nostdinc
