package nat_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// snatFlows6 are outbound connections of dip6 (through vipO6) whose
// packets the ICMPv6 errors below quote: TCP, UDP, and a ping (its
// identifier as the source port).
var snatFlows6 = []struct {
	name string
	vm   pkt // the VM's packet, as it leaves the VM
}{
	{"tcp", tcp(ap(dip6, 40100), ap(remote6, 443))},
	{"udp", udp(ap(dip6, 40101), ap(remote6, 53))},
	{"ping", pkt{src: ap(dip6, 0x99), dst: ap(remote6, 0), proto: flow.ProtoICMPv6}},
}

// quotedFrame6 is the frame of p (IPv6) with the extension headers exts:
// a TCP segment or UDP datagram, or with proto ICMPv6 an echo request
// whose identifier is p's source port.
func quotedFrame6(p pkt, exts ...gpkt.Ext6) []byte {
	if p.protocol() == flow.ProtoICMPv6 {
		return echoFrame(p.src.Addr(), p.dst.Addr(), macGW, false, p.src.Port(), exts...)
	}
	return frameExt6(p, exts...)
}

// snatConnect6 sends the VM's packet vm through the SNAT and returns its
// translated source port (a ping's identifier).
func snatConnect6(t testing.TB, e *snatEnv, vm pkt) uint16 {
	t.Helper()
	res := e.run(e.ret, quotedFrame6(vm), vni)
	require.Empty(t, res.reason)
	require.Equal(t, vipO6, res.p.Key.SrcAddr())
	if vm.protocol() == flow.ProtoICMPv6 {
		return echoID(t, res.frame, false)
	}
	return res.p.Key.SrcPort
}

// TestSNATICMPv6ErrorsQuoteExtensionHeaders: an ICMPv6 error a router
// sends to an outbound VIP about an outbound connection's packet (TCP,
// UDP, a ping) whose quote has extension headers — destination options,
// a first fragment's Fragment header, a chain longer than the quote's
// edit window, a quote cut in the payload or 8 bytes into the transport
// header (before a TCP checksum) — reaches the VM translated as
// the same error without them would be: byte for byte the frame gopacket
// builds for the error about the packet the VM sent, and by gopacket's
// decoding the outer destination and the quoted source are the DIP's, the
// quoted source port (a ping's identifier) the VM's, the ICMPv6 checksum
// and the quoted transport checksum gopacket's. An error quoting a port
// without a connection is dropped as snat_no_state, the port being read
// behind the chain. Quotes the NAT cannot translate (badChains6: chains
// cut, too long or malformed, a non-first fragment, a Routing header
// with segments left, a quote ending before the ports or, for a ping,
// before the end of the echo header) are dropped as bad_l4, the SNAT's
// counters untouched. The other direction is not the SNAT's: an error
// the VM sends about an outbound connection's packet is not translated
// (nat_no_state; bad_l4 for those quotes).
func TestSNATICMPv6ErrorsQuoteExtensionHeaders(t *testing.T) {
	allocs := []flow.PortAllocation{alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni)}
	for _, ch := range extChains6 {
		n := quoteLen6(ch.exts, ch.cut)
		chain := gpkt.ChainLen6(ch.exts...)
		for _, k := range errKinds6 {
			for _, fl := range snatFlows6 {
				t.Run("inbound/"+k.name+"/"+fl.name+"/"+ch.name, func(t *testing.T) {
					e := newSNATEnv(t, defaultSections(), allocs...)
					vport := snatConnect6(t, e, fl.vm)
					sent := fl.vm.withSrc(ap(vipO6, vport))
					before := e.s.Stats()

					res := e.run(e.in, icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(sent, ch.exts...), n, k.unrch), vni)
					require.Empty(t, res.reason)
					want := icmpErrFrame(snatRouter6, dip6, macA, quotedFrame6(fl.vm, ch.exts...), n, k.unrch)
					require.Equal(t, want, res.frame, "translated error")
					require.Equal(t, dip6, res.p.Key.DstAddr())
					require.NotZero(t, res.p.Flags&engine.FlagOutbound)

					// gopacket's reading of the result.
					outer, q := icmpv6ErrOracle(t, res.frame)
					require.Equal(t, snatRouter6.AsSlice(), []byte(outer.SrcIP.To16()))
					require.Equal(t, dip6.AsSlice(), []byte(outer.DstIP.To16()))
					src, dst := quotedOracle6(t, q, chain, fl.vm.protocol(), ch.cut == 0)
					require.Equal(t, fl.vm.src, src, "quoted source")
					require.Equal(t, fl.vm.dst, dst, "quoted destination")

					// Errors never create or change state.
					after := e.s.Stats()
					require.EqualValues(t, before.ICMP+1, after.ICMP)
					after.ICMP = before.ICMP
					require.Equal(t, before, after)

					// About a port without a connection.
					other := fl.vm.withSrc(ap(vipO6, vport+1))
					res = e.run(e.in, icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(other, ch.exts...), n, k.unrch), vni)
					require.Equal(t, "snat_no_state", res.reason)
					require.EqualValues(t, 1, e.drops("snat_no_state"))
					require.EqualValues(t, before.NoState+1, e.s.Stats().NoState)
				})
			}
			for _, fl := range snatFlows6[:2] {
				t.Run("vm/"+k.name+"/"+fl.name+"/"+ch.name, func(t *testing.T) {
					// The VM's error about the remote's packet, as the VM
					// received it: not translated.
					e := newSNATEnv(t, defaultSections(), allocs...)
					snatConnect6(t, e, fl.vm)
					got := fl.vm.withSrc(fl.vm.dst).withDst(fl.vm.src)
					res := e.run(e.ret, icmpErrFrame(dip6, remote6, macGW, quotedFrame6(got, ch.exts...), n, k.unrch), vni)
					require.Equal(t, "nat_no_state", res.reason)
					require.EqualValues(t, 1, e.drops("nat_no_state"))
					require.Zero(t, e.s.Stats().ICMP)
				})
			}
		}
	}

	for _, tc := range badChains6 {
		n := quoteLen6(tc.exts, tc.cut)
		for _, k := range errKinds6 {
			for _, fl := range snatFlows6 {
				t.Run("drop/"+k.name+"/"+fl.name+"/"+tc.name, func(t *testing.T) {
					e := newSNATEnv(t, defaultSections(), allocs...)
					vport := snatConnect6(t, e, fl.vm)
					sent := fl.vm.withSrc(ap(vipO6, vport))
					before := e.s.Stats()
					res := e.run(e.in, icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(sent, tc.exts...), n, k.unrch), vni)
					require.Equal(t, "bad_l4", res.reason, "inbound")
					drops := uint64(1)
					if fl.vm.protocol() != flow.ProtoICMPv6 {
						got := fl.vm.withSrc(fl.vm.dst).withDst(fl.vm.src)
						res = e.run(e.ret, icmpErrFrame(dip6, remote6, macGW, quotedFrame6(got, tc.exts...), n, k.unrch), vni)
						require.Equal(t, "bad_l4", res.reason, "from the VM")
						drops++
					}
					require.Equal(t, map[string]uint64{"bad_l4": drops}, e.drop, "the drops counted")
					require.Equal(t, before, e.s.Stats(), "the SNAT's counters")
				})
			}
		}
	}
}

// snatExtErrSeeds connects dip6's snatFlows6 through e and returns, as
// FuzzSNAT seeds (from a router, Inbound), ICMPv6 errors about their
// translated packets whose quotes have extension headers: a first
// fragment behind destination options, a chain longer than the quote's
// edit window, a quote cut 8 bytes into the transport header — each
// required to translate — and quotes the NAT drops (a chain cut by the
// quote, a Routing header with a segment left).
func snatExtErrSeeds(t testing.TB, e *snatEnv) [][]byte {
	both := []gpkt.Ext6{gpkt.DestOpts6, firstFrag6}
	long := []gpkt.Ext6{gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}
	var seeds [][]byte
	for i, fl := range snatFlows6 {
		sent := fl.vm.withSrc(ap(vipO6, snatConnect6(t, e, fl.vm)))
		for _, q := range []struct {
			exts []gpkt.Ext6
			cut  int
		}{{both, 0}, {long, 0}, {both, 8}} {
			s := icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(sent, q.exts...), quoteLen6(q.exts, q.cut), i%2 == 0)
			require.Empty(t, e.run(e.in, s, vni).reason, "seed about %s", fl.name)
			seeds = append(seeds, s)
		}
	}
	sent := snatFlows6[0].vm.withSrc(ap(vipO6, snatConnect6(t, e, snatFlows6[0].vm)))
	return append(seeds,
		icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(sent, both...), quoteLen6(both, -4), false),
		icmpErrFrame(snatRouter6, vipO6, macA, quotedFrame6(sent, gpkt.DestOpts6, gpkt.Routing6(1)), 0, false))
}
