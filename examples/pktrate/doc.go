// Command pktrate is the end-to-end packet-rate harness: it builds a
// generator → DUT → sink topology of network namespaces and veths, sends
// prebuilt UDP frames from an AF_XDP socket, counts what arrives with an
// XDP program at the sink, and prints a Markdown table comparing DUT modes
// measured in the same run (see internal/pktrate).
//
//	sudo go run ./examples/pktrate -duts xdp-redirect,kernel,l2fwd \
//	    -size 64 -flows 1,1k -load max,200k -duration 2s -trials 5
//
// Modes: xdp-redirect (XDP bpf_redirect between the DUT's veths: the
// ceiling), kernel (Linux IP forwarding), l2fwd (examples/l2fwd, the AF_XDP
// engine with an empty pipeline, built with `go build` first), and any
// program given with -proc. Needs root. Ctrl-C stops the run and removes
// everything it made.
package main
