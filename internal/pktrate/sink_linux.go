//go:build linux

package pktrate

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/internal/netlab"
)

// SinkCounts are the sink program's counters, summed over CPUs.
type SinkCounts struct {
	// Packets and Bytes count test frames addressed to the sink's MAC.
	Packets, Bytes uint64
	// WrongMAC counts test frames with another destination MAC.
	WrongMAC uint64
	// Other counts frames that are not test traffic (passed to the kernel).
	Other uint64
}

// Sink is the counting XDP program (bpf/sink.c) attached in driver mode to
// the sink's interface: it counts and drops the test traffic, so the rate
// is read where the frames arrive, not claimed by the sender.
type Sink struct {
	objs sinkObjects
	lnk  link.Link
}

// AttachSink loads the sink program for frames to mac and UDP port
// dstPort and attaches it to ifindex in ns.
func AttachSink(ns *netlab.NS, ifindex int, mac net.HardwareAddr, dstPort uint16) (*Sink, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("pktrate: sink MAC %v is not 6 bytes", mac)
	}
	spec, err := loadSink()
	if err != nil {
		return nil, fmt.Errorf("pktrate: sink program: %w", err)
	}
	if err := spec.Variables["sink_mac"].Set([6]byte(mac)); err != nil {
		return nil, fmt.Errorf("pktrate: sink_mac: %w", err)
	}
	if err := spec.Variables["dst_port"].Set([2]byte{byte(dstPort >> 8), byte(dstPort)}); err != nil {
		return nil, fmt.Errorf("pktrate: dst_port: %w", err)
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
		c.WrongMAC += p.WrongMac
		c.Other += p.Other
	})
	if err != nil {
		return SinkCounts{}, fmt.Errorf("pktrate: read sink counters: %w", err)
	}
	return c, nil
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
