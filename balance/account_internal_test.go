package balance

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// TestAccountReaderNeverBlocksWorker: while a reader holds one half of an
// Account (as SumAccounts does for a moment, or for long if it is
// descheduled), the worker counts into the other and does not wait; the
// sum of both halves has every packet.
func TestAccountReaderNeverBlocksWorker(t *testing.T) {
	snap, err := flow.NewSnapshot(1, []flow.Rule{{Name: "dns",
		VIP:      flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoUDP, Port: 53},
		Backends: []flow.Backend{{Name: "dip1", Addr: netip.MustParseAddr("10.0.0.1"), Weight: 1}},
	}}, nil)
	require.NoError(t, err)
	r := snap.Rules()[0]

	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 10}, DstIP: net.IP{198, 18, 100, 1}}
	udp := &layers.UDP{SrcPort: 1000, DstPort: 53}
	_ = udp.SetNetworkLayerForChecksum(ip)
	frame := gpkt.Serialize(t, eth, ip, udp, gopacket.Payload(make([]byte, 72))) // a 100-byte IP packet

	var (
		pool  [4]engine.Packet
		batch engine.Batch
	)
	for i := range pool {
		pool[i].SetBuffer(nil, 0, frame, 0, len(frame), 0)
		batch.Append(&pool[i])
	}
	engine.Parse{}.Process(&batch)
	require.Equal(t, len(pool), batch.Len())
	for _, p := range batch.Packets() {
		p.Rule, p.Backend = r, 0
	}

	a := NewAccount(AccountConfig{})
	a.Process(&batch) // into half 0
	a.halves[0].mu.Lock()
	a.Process(&batch) // half 0 is a reader's: into half 1, without waiting
	a.halves[0].mu.Unlock()
	a.halves[1].mu.Lock()
	a.Process(&batch) // half 1 is a reader's: into half 0
	a.halves[1].mu.Unlock()

	id := r.Backends[0].ID
	require.EqualValues(t, 8, a.halves[0].slots[id].packets)
	require.EqualValues(t, 4, a.halves[1].slots[id].packets)
	st := SumAccounts(a)
	want := Counts{Packets: 12, Bytes: 1200}
	require.Equal(t, want, st.Backend(id))
	require.Equal(t, want, st.VIP(r.VIP))
}

// FuzzTunnelledLen: the length read from any bytes an Account after
// encapsulation may be handed never panics and is never negative; on
// VXLAN frames (the seeds: outer IPv4, outer IPv4 with options, outer
// IPv6) it is the inner IP packet's length.
func FuzzTunnelledLen(f *testing.F) {
	inner := make([]byte, 14+100) // an Ethernet header and a 100-byte IP packet
	vxlan := func(outer gopacket.SerializableLayer, nl gopacket.NetworkLayer, et layers.EthernetType) []byte {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: et}
		udp := &layers.UDP{SrcPort: 50000, DstPort: 4789}
		_ = udp.SetNetworkLayerForChecksum(nl)
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true},
			eth, outer, udp, &layers.VXLAN{ValidIDFlag: true, VNI: 7}, gopacket.Payload(inner)); err != nil {
			f.Fatal(err)
		}
		return buf.Bytes()
	}
	ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2}}
	ip4opt := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2},
		Options: []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}}
	ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
		SrcIP: net.ParseIP("2001:db8::1"), DstIP: net.ParseIP("2001:db8::2")}
	seeds := [][]byte{
		vxlan(ip4, ip4, layers.EthernetTypeIPv4),
		vxlan(ip4opt, ip4opt, layers.EthernetTypeIPv4),
		vxlan(ip6, ip6, layers.EthernetTypeIPv6),
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Add(seeds[0][:40])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		n := tunnelledLen(data)
		if n < 0 {
			t.Fatalf("negative length %d", n)
		}
		for _, s := range seeds {
			if string(s) == string(data) && n != 100 {
				t.Fatalf("VXLAN seed: length %d, want 100", n)
			}
		}
	})
}
