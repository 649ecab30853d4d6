package mux

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// TestMuxSourceFilterFollowsDocument: the Mux's source filter refuses the
// VIPs, infra_prefixes and mux_prefixes of the document it runs and its
// own addresses, and a new version changes all of them.
func TestMuxSourceFilterFollowsDocument(t *testing.T) {
	m, err := New(Config{Interface: "up", ConfigPath: "unused", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	m.nodeAddrs = []netip.Addr{netip.MustParseAddr("198.18.0.2")}
	doc := func(text string) *control.Document {
		d, err := control.Parse([]byte(text))
		require.NoError(t, err)
		return d
	}
	const vips = `
vips:
  - {name: a, address: 198.18.100.1, protocol: udp, port: 7, vni: 100,
     backends: [{name: x, address: 198.18.4.1, mac: "02:00:00:00:04:01", host: 198.18.3.2}]}
`
	require.NoError(t, m.apply(context.Background(), doc("version: 1\ninfra_prefixes: [198.18.1.0/24]\n"+vips)))
	pl := engine.NewPipeline(engine.Parse{}, m.sources)
	verdict := func(src string) string {
		fr := gpkt.Serialize(t,
			&layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4},
			&layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: netip.MustParseAddr(src).AsSlice(), DstIP: netip.MustParseAddr("198.18.100.1").AsSlice()},
			&layers.UDP{SrcPort: 7, DstPort: 7}, gopacket.Payload("x"))
		// The batch carries the running snapshot, as a worker's does:
		// the prefix set comes with the rules of its version.
		b := engine.Batch{Snapshot: m.ctl.Snapshot()}
		var p engine.Packet
		buf := make([]byte, 2048)
		copy(buf[128:], fr)
		p.SetBuffer(nil, 0, buf, 128, len(fr), 0)
		b.Append(&p)
		pl.Process(&b)
		if b.Len() == 0 {
			return p.Reason.String()
		}
		return "pass"
	}
	for src, want := range map[string]string{
		"198.18.5.2": "pass", "198.18.100.1": "src_vip", "198.18.1.9": "src_infra", "198.18.2.9": "pass",
		"198.18.0.2": "src_node", "127.0.0.1": "src_martian", "198.18.100.2": "pass",
	} {
		require.Equal(t, want, verdict(src), "version 1, source %s", src)
	}
	// Version 2: another VIP, the infrastructure moved, the Muxes' prefix.
	require.NoError(t, m.apply(context.Background(), doc("version: 2\ninfra_prefixes: [198.18.2.0/24]\nmux_prefixes: [198.18.9.0/28]\n"+
		`vips:
  - {name: b, address: 198.18.100.2, protocol: udp, port: 7, vni: 100,
     backends: [{name: x, address: 198.18.4.1, mac: "02:00:00:00:04:01", host: 198.18.3.2}]}
`)))
	for src, want := range map[string]string{
		"198.18.5.2": "pass", "198.18.100.1": "pass", "198.18.100.2": "src_vip", "198.18.1.9": "pass",
		"198.18.2.9": "src_infra", "198.18.9.3": "src_infra", "198.18.0.2": "src_node",
	} {
		require.Equal(t, want, verdict(src), "version 2, source %s", src)
	}
}
