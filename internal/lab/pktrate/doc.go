// Package pktrate is the end-to-end packet-rate harness: it measures how
// many packets per second a device under test (DUT) forwards, and at what
// CPU cost, on a path of three network namespaces joined by veth pairs:
//
//	generator ──veth── DUT ──veth── sink
//
// examples/pktrate is its command line; this package is the library
// (topology, generator, sink, DUT modes, trials, table).
//
// # What is measured
//
// The generator (Generator) sends prebuilt IPv4/UDP frames of a FrameSpec
// (frame size 64..1518 bytes with FCS, RFC 2544 style; 1 to 2M flows that
// differ in source address and port) from a TX-only AF_XDP socket, as fast
// as it can or at a fixed rate. The sink (Sink) is an XDP program on the
// last veth that counts and drops the test frames in per-CPU counters, so
// the delivered rate is read where the frames arrive, not claimed by the
// sender; it also counts test frames whose destination MAC is not the
// sink's (a DUT that forgot to rewrite MACs). A DUT mode forwards between
// the DUT's two veths:
//
//   - XDPRedirect ("xdp-redirect"): an XDP program rewrites the MACs and
//     bpf_redirects to the egress veth. The ceiling of this path.
//   - KernelForward ("kernel"): Linux IP forwarding. What a user gets
//     without xdplb.
//   - Process: any program run in the DUT namespace, such as
//     examples/l2fwd (the AF_XDP engine with an empty pipeline), and later
//     the Mux and the Host Agent.
//
// Run measures every mode at every point (frame size x flow count x
// offered load) in one invocation, trial after trial, interleaving the
// modes so a noisy shared machine hurts them alike; each figure is the
// median over the trials (Summarize). Per trial it reports the offered
// and delivered rates over a window after a warm-up, the loss over the
// whole trial (sent minus counted, after the path has drained), the CPU
// time of the DUT, of the generator's sending thread and of the sink, and
// the veths' drop counters (where lost frames went).
//
// # CPU accounting
//
// By default (NAPIThreadedFIFO) the kernel's receive work of the DUT's
// ingress veth and of the sink's veth runs in threaded NAPI: kernel
// threads napi/<ifname>-<id>, which the harness finds by name (its
// interface names are unique per run) and sets SCHED_FIFO, the sink above
// the DUT. The DUT's CPU time is then exact (schedstat, nanoseconds): its
// ingress NAPI threads (for xdp-redirect and kernel that is all of its
// work, the transmit into the next veth included) plus every thread of
// its processes (a Process DUT). The sink's work is on its own thread and
// never charged to the DUT. FIFO matters on a small shared machine: at
// normal priority a busy machine's other processes delay the NAPI threads
// long enough for veth's 256-frame rings to overflow even at 10 kpps;
// FIFO gives them what softirq processing has on a real host, priority
// over processes, while still letting them run on another core than the
// sender, as a NIC's interrupt would. CPU per packet is only meaningful
// at a load the DUT sustains without loss, and at low rates it includes
// a thread wake-up per burst.
//
// NAPISoftirq leaves NAPI in softirq, which runs inside the sender's
// sendto: generator, DUT and sink share one thread, and the DUT's CPU can
// only be read as the machine's softirq time in /proc/stat, which includes
// the sink's (an upper bound, tick-sampled).
//
// # veth notes
//
//   - A veth has NAPI only with an XDP program attached or GRO on, and
//     hands skbs to it only if they may be aggregated (the sending veth
//     has no TSO), otherwise to the receiving CPU's backlog. The topology
//     turns GRO on at the DUT's ingress and TSO off at the generator, so
//     every mode's receive work is in the ingress NAPI.
//   - XDP_REDIRECT into a veth (ndo_xdp_xmit) is accepted only when the
//     receiving peer has NAPI (an XDP program, or GRO on); otherwise the
//     frames are dropped. The sink's counting program provides it.
//   - The AF_XDP generator's socket is in copy mode (veth has no zero
//     copy): the kernel copies each frame into an skb in sendto. When the
//     DUT's ring is full the veth pushes back (sendto returns EAGAIN,
//     counted as Sample.Busy) or drops (GenTX drops): at "max" the offered
//     rate settles at what the DUT takes.
//   - Native XDP on a veth that receives skbs (from the generator, or from
//     kernel forwarding or an AF_XDP transmit into the sink) first copies
//     each frame into a page with XDP headroom. A real NIC's XDP sees the
//     DMA buffer directly, so every XDP figure here carries that copy.
//   - Multiple queues need numrxqueues/numtxqueues (TopologyConfig.Queues);
//     the generator sends on queue 0, which the veth delivers to RX queue 0
//     of the DUT.
//
// # Addresses and cleanup
//
// Addresses come from 198.18.0.0/15 and exist only in the lab's
// namespaces; IPv6 is disabled there. Everything (namespaces, veths, XDP
// programs, DUT processes) goes with the netlab.Lab, which a test closes
// through t.Cleanup and the command on exit or Ctrl-C; the XDP programs
// and the AF_XDP socket are closed first.
//
// The harness is Linux-only and needs root; the frame building, the
// statistics and the table are portable.
package pktrate
