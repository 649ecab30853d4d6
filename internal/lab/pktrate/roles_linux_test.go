//go:build linux

package pktrate

import (
	"context"
	"encoding/binary"
	"flag"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/hostagent"
	"github.com/xdplb/xdplb/internal/lab/netlab"
	"github.com/xdplb/xdplb/internal/node"
	"github.com/xdplb/xdplb/mux"
)

// helperMux makes the test binary the Mux, with the flags the Mux mode
// passes (those of examples/mux it uses), serving /metrics at -metrics
// as examples/mux does.
func helperMux(args []string) error {
	fs := flag.NewFlagSet("mux", flag.ContinueOnError)
	iface := fs.String("interface", "", "")
	config := fs.String("config", "", "")
	_ = fs.String("log-level", "", "")
	metrics := fs.String("metrics", "", "")
	conns := fs.Int("conns", 1<<16, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := mux.Config{Interface: *iface, ConfigPath: *config, Logger: log}
	cfg.Conns.Capacity = *conns
	m, err := mux.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	defer node.ServeMetrics(log, "mux", *metrics, m.Collector())()
	return m.Run(ctx)
}

// helperHostAgent makes the test binary the Host Agent, with the flags
// the HostAgent mode passes.
func helperHostAgent(args []string) error {
	fs := flag.NewFlagSet("hostagent", flag.ContinueOnError)
	uplink := fs.String("uplink", "", "")
	host := fs.String("host", "", "")
	config := fs.String("config", "", "")
	_ = fs.String("log-level", "", "")
	conns := fs.Int("conns", 1<<16, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := hostagent.Config{Uplink: *uplink, Host: *host, ConfigPath: *config,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	cfg.NAT.Capacity = *conns
	a, err := hostagent.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return a.Run(ctx)
}

// roleCase is one DUT mode of TestPathModes and what its frames at the
// sink must look like.
type roleCase struct {
	dut   DUT
	flows int
	// check verifies one captured frame; spec is the generator's.
	check func(t *testing.T, topo *Topology, spec FrameSpec, frame []byte) (flow int)
	// after checks all captured frames' flows together.
	after func(t *testing.T, flows map[int][][]byte)
	// fastPath: the mode's samples carry fast-path counters (the Mux).
	fastPath bool
	skip     string
}

// TestPathModes runs every DUT mode of the one-armed and the tunnel path
// briefly at a load any of them sustains, each in a topology of its own,
// and checks that the sink counted what the generator sent, with the
// right MACs and of the right kind, that the frames it captured are what
// the mode must deliver (decoded with gopacket, checksums verified), and
// that nothing is left behind. It asserts no rate.
func TestPathModes(t *testing.T) {
	netlab.RequireRoot(t)
	self, err := os.Executable()
	require.NoError(t, err)
	noNFT := ""
	if _, err := exec.LookPath("nft"); err != nil {
		noNFT = "nft not found (Debian package nftables)"
	}
	helper := func(role string) []string { return []string{helperEnv + "=" + role} }
	cases := []roleCase{
		{dut: KernelForward{OneArm: true}, flows: 1000, check: checkOneArmPlain},
		{dut: XDPRedirect{OneArm: true}, flows: 1000, check: checkOneArmPlain},
		{dut: Process{Label: "helper-1arm", Path: self, Env: helper("redirect"), On: PathOneArm,
			Args: []string{"-in", "{in}", "-out", "{out}", "-dst-mac", "{next_mac}"}}, flows: 1000, check: checkOneArmPlain},
		{dut: Mux{Bin: self, Env: helper("mux"), Conns: 1 << 16}, flows: 4, check: checkMuxFrame, after: checkMuxSpread, fastPath: true},
		{dut: HostAgent{Bin: self, Env: helper("hostagent"), Conns: 1 << 16}, flows: 1000, check: checkTunnelFrame},
		{dut: KernelVXLANDNAT{}, flows: 1000, check: checkTunnelFrame, skip: noNFT},
	}
	for _, tc := range cases {
		t.Run(tc.dut.Name(), func(t *testing.T) {
			if tc.skip != "" {
				t.Skip(tc.skip)
			}
			const prefix = "pkrp"
			lab := netlab.New(t, prefix)
			flows := map[int][][]byte{}
			var captured int
			var spec FrameSpec
			cfg := Config{
				DUTs:   []DUT{tc.dut},
				Sizes:  []int{64},
				Flows:  []int{tc.flows},
				Loads:  []Load{{PPS: 10_000}},
				Warmup: 300 * time.Millisecond, Duration: 300 * time.Millisecond, Drain: 200 * time.Millisecond,
				Trials:   1,
				Topology: TopologyConfig{SinkCapture: MaxCapture},
				AfterTrial: func(topo *Topology, p Point, trial int) error {
					spec = topo.Spec(p.Size, p.Flows)
					frames, err := topo.Sink.Captured()
					if err != nil {
						return err
					}
					captured = len(frames)
					for _, f := range frames {
						i := tc.check(t, topo, spec, f)
						flows[i] = append(flows[i], f)
					}
					return nil
				},
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			results, err := Run(ctx, lab, cfg)
			require.NoError(t, err)
			require.Len(t, results, 1)
			s := results[0].Samples[0]
			t.Logf("%s: sent %d, received %d, window %v: %d/%d, drops %+v", results[0].DUT, s.Sent, s.Received, s.Window, s.WindowSent, s.WindowReceived, s.Drops)
			assert.NotZero(t, s.Sent)
			// Frames the generator's veth could not queue (GenTX: the
			// receiving CPU's backlog was full, which a loaded 2-core CI
			// machine does to even the kernel path at 10 kpps) never
			// entered the path; every frame that did must arrive.
			entered := s.Sent - min(s.Drops.GenTX, s.Sent)
			assert.Less(t, float64(s.Drops.GenTX), 0.2*float64(s.Sent), "the generator could not send")
			assert.GreaterOrEqual(t, float64(s.Received), 0.99*float64(entered), "sink counted too few")
			assert.LessOrEqual(t, s.Received, s.Sent)
			assert.Zero(t, s.WrongMAC, "frames reached the sink without the sink's MAC")
			assert.Zero(t, s.WrongKind, "frames of the wrong kind (plain/VXLAN) reached the sink")
			assert.NotZero(t, s.WindowReceived)
			assert.GreaterOrEqual(t, captured, MaxCapture/2, "the sink captured too few frames")
			if tc.after != nil {
				tc.after(t, flows)
			}
			if tc.fastPath {
				// The harness read the Mux's counters at the window's
				// start and end: with 4 flows its workers look most
				// packets up.
				if assert.NotNil(t, s.FastPath, "no fast-path counters in the Mux's sample") {
					t.Logf("fast path in the window: %+v", *s.FastPath)
					assert.NotZero(t, s.FastPath.Lookups(), "the fast path looked nothing up")
					// Counted over the window, not since the start: the
					// warm-up and start-up would come near double.
					assert.LessOrEqual(t, float64(s.FastPath.Lookups()), 1.5*float64(s.WindowSent), "lookups not over the window")
				}
				assert.NotNil(t, results[0].Summary.FastPath)
			} else {
				assert.Nil(t, s.FastPath)
				assert.Nil(t, results[0].Summary.FastPath)
			}
			require.NoError(t, lab.Close())
			assert.Empty(t, netlab.Leftovers(prefix))
		})
	}
}

// checkTestFrame checks an (inner) test frame against spec: flow i's
// source, the destination dst:dport, valid IPv4 and UDP checksums, the
// payload Frame wrote, and returns i.
func checkTestFrame(t *testing.T, spec FrameSpec, ip *layers.IPv4, udp *layers.UDP, dst netip.Addr, dport uint16) int {
	t.Helper()
	assert.Equal(t, uint16(0xffff), header.Checksum(ip.Contents, 0), "IPv4 header checksum")
	src, ok := netip.AddrFromSlice(ip.SrcIP.To4())
	require.True(t, ok)
	assert.Equal(t, dst.String(), ip.DstIP.String())
	assert.Equal(t, layers.UDPPort(dport), udp.DstPort)
	i := int(binary.BigEndian.Uint32(src.AsSlice())-binary.BigEndian.Uint32(spec.Src.AsSlice()))*FlowPortsPerAddr +
		int(udp.SrcPort) - FlowPortBase
	require.True(t, i >= 0 && i < spec.Flows, "source %v:%d is no flow of the spec", src, udp.SrcPort)
	seg := append(append([]byte{}, udp.Contents...), udp.Payload...)
	s4, d4 := src.As4(), dst.As4()
	assert.Equal(t, uint16(0xffff), header.Checksum(seg, header.PseudoHeaderChecksum(17, s4[:], d4[:], uint16(len(seg)))), "UDP checksum")
	for j, b := range udp.Payload {
		if b != byte(j+udpLen) {
			t.Errorf("payload byte %d is %#x, want %#x", j, b, byte(j+udpLen))
			break
		}
	}
	return i
}

func decode(t *testing.T, frame []byte) []gopacket.Layer {
	t.Helper()
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	require.Nil(t, p.ErrorLayer(), "gopacket: %v", p.ErrorLayer())
	return p.Layers()
}

// checkOneArmPlain: a test frame back at the generator, from the DUT's
// veth to the generator's.
func checkOneArmPlain(t *testing.T, topo *Topology, spec FrameSpec, frame []byte) int {
	ls := decode(t, frame)
	require.Len(t, ls, 4, "eth ip udp payload")
	eth := ls[0].(*layers.Ethernet)
	assert.Equal(t, topo.GenLink.MAC, eth.DstMAC)
	assert.Equal(t, topo.DUTIn.MAC, eth.SrcMAC)
	return checkTestFrame(t, spec, ls[1].(*layers.IPv4), ls[2].(*layers.UDP), VIPAddr, DstPort)
}

// checkMuxFrame: the Mux's VXLAN, back at the generator (the router):
// from the Mux's address to a backend's host, the VIP's VNI, the
// backend's MAC inside, the client's frame unchanged.
func checkMuxFrame(t *testing.T, topo *Topology, spec FrameSpec, frame []byte) int {
	ls := decode(t, frame)
	require.Len(t, ls, 8, "eth ip udp vxlan eth ip udp payload")
	eth := ls[0].(*layers.Ethernet)
	assert.Equal(t, topo.GenLink.MAC, eth.DstMAC)
	assert.Equal(t, topo.DUTIn.MAC, eth.SrcMAC)
	oip := ls[1].(*layers.IPv4)
	assert.Equal(t, uint16(0xffff), header.Checksum(oip.Contents, 0), "outer IPv4 checksum")
	assert.Equal(t, DUTInAddr.String(), oip.SrcIP.String())
	oudp := ls[2].(*layers.UDP)
	assert.Equal(t, layers.UDPPort(VXLANPort), oudp.DstPort)
	assert.GreaterOrEqual(t, uint16(oudp.SrcPort), uint16(49152))
	assert.Equal(t, uint32(TunnelVNI), ls[3].(*layers.VXLAN).VNI)
	inner := ls[4].(*layers.Ethernet)
	found := false
	for _, b := range MuxBackends {
		if b.MAC.String() == inner.DstMAC.String() {
			found = true
			assert.Equal(t, b.Host.String(), oip.DstIP.String(), "outer destination is not the host of backend %s", b.Name)
		}
	}
	assert.True(t, found, "inner destination %v is no backend's MAC", inner.DstMAC)
	return checkTestFrame(t, spec, ls[5].(*layers.IPv4), ls[6].(*layers.UDP), VIPAddr, DstPort)
}

// checkMuxSpread: a flow sticks to one backend, and the flows spread
// over more than one (deterministic: the hash seed and the flows are
// fixed).
func checkMuxSpread(t *testing.T, flows map[int][][]byte) {
	backends := map[string]bool{}
	for i, fs := range flows {
		first := ""
		for _, f := range fs {
			mac := decode(t, f)[4].(*layers.Ethernet).DstMAC.String()
			if first == "" {
				first = mac
			}
			assert.Equal(t, first, mac, "flow %d changed backends", i)
			backends[mac] = true
		}
	}
	assert.Greater(t, len(flows), 1)
	assert.Greater(t, len(backends), 1, "every flow went to one backend")
}

// checkTunnelFrame: the inner frame at the VM, translated to the DIP.
func checkTunnelFrame(t *testing.T, topo *Topology, spec FrameSpec, frame []byte) int {
	ls := decode(t, frame)
	require.Len(t, ls, 4, "eth ip udp payload")
	eth := ls[0].(*layers.Ethernet)
	assert.Equal(t, topo.SinkLink.MAC, eth.DstMAC)
	return checkTestFrame(t, spec, ls[1].(*layers.IPv4), ls[2].(*layers.UDP), DIPAddr, DIPPort)
}

// TestHostAgentDocumentIsValid: the Host Agent plans the document as the
// tunnel path needs (hostagent builds on Linux only).
func TestHostAgentDocumentIsValid(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 7}
	doc, err := control.Parse([]byte(HostAgentDocument(mac, "povm1")))
	require.NoError(t, err)
	plan, err := hostagent.NewPlan(doc, HostName, nil)
	require.NoError(t, err)
	assert.Equal(t, DUTInAddr, plan.Host.Address)
	require.Len(t, plan.Ports, 1)
	assert.Equal(t, "povm1", plan.Ports[0].Interface)
	assert.Equal(t, uint32(TunnelVNI), plan.Ports[0].VNI)
	require.Len(t, plan.Endpoints, 1)
	assert.Equal(t, []netip.Addr{DIPAddr}, plan.Endpoints[0].Addrs)
	assert.Equal(t, [6]byte(mac), [6]byte(plan.Endpoints[0].MAC))
	// The generator plays the Mux: the agent accepts its VXLAN.
	require.Len(t, plan.TunnelSources, 1)
	assert.True(t, plan.TunnelSources[0].Contains(GenAddr), "mux_prefixes %v", plan.TunnelSources)
	// The test traffic's sources are not infrastructure (never NATed).
	for _, p := range plan.Infra {
		assert.False(t, p.Contains(FlowSrc), "%v", p)
	}
}
