// Command pktrate is the end-to-end packet-rate harness: it builds a
// topology of network namespaces and veths, sends prebuilt UDP frames
// from an AF_XDP socket, counts what arrives with an XDP program at the
// sink, and prints a Markdown table comparing DUT modes measured in the
// same run (see internal/lab/pktrate).
//
//	sudo go run ./examples/pktrate -duts xdp-redirect,kernel,l2fwd \
//	    -size 64 -flows 1,1k -load max,200k -duration 2s -trials 5
//	sudo go run ./examples/pktrate -duts l2fwd-1arm,mux,kernel-1arm,xdp-tx-1arm \
//	    -size 64 -flows 1,1k,1M -load max,300k
//	sudo go run ./examples/pktrate -duts hostagent,kernel-vxlan-dnat \
//	    -size 64 -flows 1,1k,1M -load max,300k -conntrack-max 2M
//
// Modes, by path (one run measures modes of one path):
//
//   - routed (generator → DUT → sink): xdp-redirect (XDP bpf_redirect
//     between the DUT's veths: the ceiling), kernel (Linux IP
//     forwarding), l2fwd (examples/l2fwd, the AF_XDP engine with an empty
//     pipeline);
//   - one-arm (generator ⇄ DUT, frames leave on the veth they came in
//     on): mux (examples/mux, VXLAN out), l2fwd-1arm, kernel-1arm,
//     xdp-tx-1arm (XDP_TX: the ceiling);
//   - tunnel (generator → host → VM, VXLAN in): hostagent
//     (examples/hostagent), kernel-vxlan-dnat (a vxlan device, nftables
//     DNAT with conntrack, IP forwarding);
//
// and any program given with -proc. For mux rows a list under the table
// gives the share of the Mux's fast-path lookups that hit, the lookups
// and the naps in the measurement window (medians over the trials), read
// from the Mux's /metrics, which it serves at 127.0.0.1:9109 inside the
// DUT namespace; rows of other modes have no such line and the table is
// unchanged. The example binaries are built with
// `go build` into a temporary directory unless -l2fwd-bin, -mux-bin or
// -hostagent-bin name them. Needs root. Ctrl-C stops the run and removes
// everything it made.
package main
