// Package xsk is the AF_XDP plumbing both of xdplb's AF_XDP users share:
// the data path's port (engine/afxdp) and the packet-rate harness's
// generator (internal/lab/pktrate). It creates a socket with its own UMEM
// (Open), maps its four rings and binds it (retrying a queue the kernel
// is still releasing), and drives the rings (Ring): single-producer
// single-consumer arrays shared with the kernel, whose indices are read
// with atomic loads and published with atomic stores, about once per
// batch, with cached copies in between.
//
// What a socket is for — which chunks go where, when to wake the kernel,
// what to count — stays with its user.
//
// AF_XDP needs Linux; on other systems the package is empty.
package xsk
