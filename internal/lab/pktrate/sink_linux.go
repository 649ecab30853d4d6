//go:build linux

package pktrate

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// SinkCounts are the sink program's counters, summed over CPUs.
type SinkCounts struct {
	// Packets and Bytes count plain test frames addressed to the sink's
	// MAC.
	Packets, Bytes uint64
	// VXLANPackets and VXLANBytes count VXLAN-encapsulated test frames
	// (outer UDP to port 4789 around a test frame) addressed to the
	// sink's MAC; Bytes include the outer headers.
	VXLANPackets, VXLANBytes uint64
	// WrongMAC counts test frames of either kind with another destination
	// MAC.
	WrongMAC uint64
	// Other counts frames that are not test traffic (passed to the kernel).
	Other uint64
}

// Delivered returns the count of test frames of kind out, and of the
// other kind.
func (c SinkCounts) Delivered(out Output) (delivered, otherKind uint64) {
	if out == OutputVXLAN {
		return c.VXLANPackets, c.Packets
	}
	return c.Packets, c.VXLANPackets
}

// SinkConfig says what the sink counts as test traffic.
type SinkConfig struct {
	// MAC is the sink interface's address: test frames addressed to
	// another are counted as WrongMAC.
	MAC net.HardwareAddr
	// DstPort is the test traffic's UDP destination port (of the inner
	// frame, for VXLAN test frames).
	DstPort uint16
	// DstAddr, when valid, is the test traffic's IPv4 destination (of the
	// inner frame for VXLAN); other frames are not test traffic.
	DstAddr netip.Addr
	// Capture, for tests, copies the first Capture test frames (at most
	// MaxCapture; per CPU) for Sink.Captured. Zero for measurements: the
	// code is then pruned from the program.
	Capture int
}

// MaxCapture is the most frames a sink captures per CPU, and
// MaxCaptureLen the most bytes of each it keeps.
const (
	MaxCapture    = 16
	MaxCaptureLen = 256
)

// Sink is the counting XDP program (bpf/sink.c) attached in driver mode to
// the sink's interface: it counts and drops the test traffic, so the rate
// is read where the frames arrive, not claimed by the sender.
type Sink struct {
	objs sinkObjects
	lnk  link.Link
}

// AttachSink loads the sink program for cfg and attaches it to ifindex in
// ns.
func AttachSink(ns *netlab.NS, ifindex int, cfg SinkConfig) (*Sink, error) {
	if len(cfg.MAC) != 6 {
		return nil, fmt.Errorf("pktrate: sink MAC %v is not 6 bytes", cfg.MAC)
	}
	if cfg.DstAddr.IsValid() && !cfg.DstAddr.Is4() {
		return nil, fmt.Errorf("pktrate: sink destination %v is not IPv4", cfg.DstAddr)
	}
	if cfg.Capture < 0 || cfg.Capture > MaxCapture {
		return nil, fmt.Errorf("pktrate: sink capture %d outside [0, %d]", cfg.Capture, MaxCapture)
	}
	spec, err := loadSink()
	if err != nil {
		return nil, fmt.Errorf("pktrate: sink program: %w", err)
	}
	var addr [4]byte
	if cfg.DstAddr.IsValid() {
		addr = cfg.DstAddr.As4()
	}
	for name, v := range map[string]any{
		"sink_mac":    [6]byte(cfg.MAC),
		"dst_port":    [2]byte{byte(cfg.DstPort >> 8), byte(cfg.DstPort)},
		"dst_addr":    addr,
		"capture_max": uint32(cfg.Capture),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("pktrate: sink %s: %w", name, err)
		}
	}
	s := &Sink{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("pktrate: load sink program: %w", err)
	}
	err = ns.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: s.objs.XdpSink, Interface: ifindex, Flags: link.XDPDriverMode})
		s.lnk = l
		return err
	})
	if err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("pktrate: attach sink program to ifindex %d in %s: %w", ifindex, ns, err)
	}
	return s, nil
}

// Counts reads the counters.
func (s *Sink) Counts() (SinkCounts, error) {
	var c SinkCounts
	err := perCPUSum(s.objs.SinkStats, func(p sinkSinkCounters) {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
		c.VXLANPackets += p.VxlanPackets
		c.VXLANBytes += p.VxlanBytes
		c.WrongMAC += p.WrongMac
		c.Other += p.Other
	})
	if err != nil {
		return SinkCounts{}, fmt.Errorf("pktrate: read sink counters: %w", err)
	}
	return c, nil
}

// Captured returns copies of the test frames captured so far (see
// SinkConfig.Capture), CPU by CPU, each cut to MaxCaptureLen bytes.
func (s *Sink) Captured() ([][]byte, error) {
	var counts []sinkSinkCounters
	if err := s.objs.SinkStats.Lookup(uint32(0), &counts); err != nil {
		return nil, fmt.Errorf("pktrate: read sink counters: %w", err)
	}
	var out [][]byte
	for slot := uint32(0); slot < MaxCapture; slot++ {
		var caps []sinkCapture
		if err := s.objs.Captures.Lookup(slot, &caps); err != nil {
			return nil, fmt.Errorf("pktrate: read capture %d: %w", slot, err)
		}
		for cpu, c := range caps {
			if cpu < len(counts) && uint64(slot) < counts[cpu].Captured {
				n := min(int(c.Len), MaxCaptureLen)
				out = append(out, append([]byte(nil), c.Data[:n]...))
			}
		}
	}
	return out, nil
}

// ResetCapture forgets the captured frames, so the sink captures the next
// ones. Call it while no test traffic arrives.
func (s *Sink) ResetCapture() error {
	var counts []sinkSinkCounters
	if err := s.objs.SinkStats.Lookup(uint32(0), &counts); err != nil {
		return fmt.Errorf("pktrate: read sink counters: %w", err)
	}
	for i := range counts {
		counts[i].Captured = 0
	}
	if err := s.objs.SinkStats.Update(uint32(0), counts, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("pktrate: reset the sink's capture: %w", err)
	}
	return nil
}

// Close detaches and unloads the program.
func (s *Sink) Close() error {
	var errs []error
	if s.lnk != nil {
		errs = append(errs, s.lnk.Close())
		s.lnk = nil
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

// perCPUSum reads a per-CPU array's single entry and adds up the CPUs'
// values with add.
func perCPUSum[T any](m *ebpf.Map, add func(T)) error {
	var per []T
	if err := m.Lookup(uint32(0), &per); err != nil {
		return err
	}
	for _, p := range per {
		add(p)
	}
	return nil
}
