package nat_test

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
	"github.com/xdplb/xdplb/nat"
)

// Outbound addresses: VIPs without rules of their own, remote servers
// ("the internet") in 198.18.50.0/24 and 2001:db8:50::/48.
var (
	vipO     = netip.MustParseAddr("198.18.100.9")
	vipO6    = netip.MustParseAddr("2001:db8:100::9")
	vipT     = netip.MustParseAddr("198.18.100.10") // tenant 2's
	remote   = netip.MustParseAddr("198.18.50.1")
	remote2  = netip.MustParseAddr("198.18.50.2")
	remote6  = netip.MustParseAddr("2001:db8:50::1")
	localNet = netip.MustParsePrefix("198.19.0.0/16")
)

const (
	vni2       = 200
	directPort = 9
)

// snatEnv is a Translator with a SNAT, both on the env's synthetic clock.
type snatEnv struct {
	*env
	s *nat.SNAT
}

func alloc(vip netip.Addr, first, last uint16, dip netip.Addr, vni uint32) flow.PortAllocation {
	return flow.PortAllocation{VIP: vip, First: first, Last: last, Owner: flow.PortOwner{DIP: dip, VNI: vni}}
}

// defaultSections: dipA and dip6 of VNI 100 go out through vipO and
// vipO6; 198.19.0.0/16 is their VNI's own network.
func defaultSections() []nat.Outbound {
	return []nat.Outbound{
		{VIP: vipO, VNI: vni, DIPs: []netip.Addr{dipA}, Local: []netip.Prefix{localNet}},
		{VIP: vipO6, VNI: vni, DIPs: []netip.Addr{dip6}},
	}
}

func newSNATEnv(t testing.TB, sections []nat.Outbound, allocs ...flow.PortAllocation) *snatEnv {
	t.Helper()
	return newSNATEnvSized(t, 4096, sections, allocs...)
}

// newSNATEnvSized is newSNATEnv with a SNAT sized for capacity
// connections.
func newSNATEnvSized(t testing.TB, capacity int, sections []nat.Outbound, allocs ...flow.PortAllocation) *snatEnv {
	t.Helper()
	se := &snatEnv{}
	var err error
	se.s, err = nat.NewSNAT(nat.SNATConfig{Capacity: capacity, Seed: 1, Clock: func() flow.Tick { return se.now }})
	require.NoError(t, err)
	require.NoError(t, se.s.SetOutbound(sections))
	se.s.SetAllocations(allocs)
	se.env = newEnv(t, testRules(), testLocals(), func(c *nat.Config) {
		c.SNAT, c.Direct, c.HasDirect = se.s, directPort, true
	})
	return se
}

// out sends p from the VM (Return stage) and returns the result.
func (e *snatEnv) out(p pkt) result { e.t.Helper(); return e.run(e.ret, p.frame(), vni) }

// back sends the remote's packet p (decapsulated, Inbound stage) in vni.
func (e *snatEnv) back(p pkt, vni uint32) result {
	e.t.Helper()
	return e.run(e.in, p.to(macA).frame(), vni)
}

// vport returns the translated source port of an outgoing result.
func vport(t testing.TB, r result) uint16 {
	t.Helper()
	require.Empty(t, r.reason)
	require.NotNil(t, r.frame)
	return r.p.Key.SrcPort
}

func syn(src, dst netip.AddrPort) pkt { return pkt{src: src, dst: dst, syn: true} }

// TestSNATGolden: a VM's first packet (TCP SYN, UDP datagram) leaves with
// the VIP and a port of its DIP's range as source, every other byte as
// gopacket builds it; the remote's answer comes back to the DIP; the next
// packets use the same port. IPv4 and IPv6.
func TestSNATGolden(t *testing.T) {
	tests := []struct {
		name string
		out  pkt
		vip  netip.Addr
	}{
		{"tcp4", syn(ap(dipA, 40000), ap(remote, 443)), vipO},
		{"udp4", udp(ap(dipA, 40001), ap(remote, 53)), vipO},
		{"tcp6", syn(ap(dip6, 40002), ap(remote6, 443)), vipO6},
		{"udp6", udp(ap(dip6, 40003), ap(remote6, 53)), vipO6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newSNATEnv(t, defaultSections(),
				alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4103, dip6, vni), alloc(vipO6, 8192, 8199, dip6, vni))
			res := e.out(tc.out)
			require.Empty(t, res.reason)
			vp := res.p.Key.SrcPort
			if tc.vip == vipO {
				require.True(t, vp >= 2048 && vp <= 2111, "port %d outside the range", vp)
			} else {
				require.True(t, vp >= 4096 && vp <= 4103 || vp >= 8192 && vp <= 8199, "port %d outside the ranges", vp)
			}
			translated := tc.out.withSrc(ap(tc.vip, vp))
			require.Equal(t, translated.frame(), res.frame, "translated frame")
			gopacketChecksumsOK(t, res.frame)
			require.Equal(t, flow.KeyFrom(vni, tc.out.protocol(), ap(tc.vip, vp), tc.out.dst), res.p.Key)
			require.EqualValues(t, uplink, res.p.OutPort)
			require.NotZero(t, res.p.Flags&engine.FlagOutbound)

			answer := translated.reply()
			answer.syn, answer.ack = tc.out.syn, true
			back := e.back(answer, vni)
			require.Empty(t, back.reason)
			require.Equal(t, answer.to(macA).withDst(tc.out.src).frame(), back.frame, "translated reply")
			gopacketChecksumsOK(t, back.frame)
			require.NotZero(t, back.p.Flags&engine.FlagOutbound)
			require.EqualValues(t, 3, back.p.OutPort, "Inbound leaves OutPort to Decap")

			next := tc.out
			next.syn, next.ack = false, true
			require.Equal(t, vp, vport(t, e.out(next)), "same connection, same port")
			st := e.s.Stats()
			require.EqualValues(t, 1, st.Created)
			require.EqualValues(t, 2, st.Out)
			require.EqualValues(t, 1, st.In)
		})
	}
}

// TestSNATPortReuse: a port is unique per remote endpoint, so a DIP with
// 8 ports holds 8 connections to each remote; the 9th to one remote is
// dropped and counted while connections to another remote still get
// every port.
func TestSNATPortReuse(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2055, dipA, vni))
	ports := map[netip.Addr][]uint16{}
	for _, r := range []netip.Addr{remote, remote2} {
		for i := range 8 {
			ports[r] = append(ports[r], vport(t, e.out(syn(ap(dipA, uint16(1000+i)), ap(r, 80)))))
		}
		require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 1008), ap(r, 80))).reason, "9th connection to %v", r)
		slices.Sort(ports[r])
		require.Equal(t, []uint16{2048, 2049, 2050, 2051, 2052, 2053, 2054, 2055}, ports[r], "every port once towards %v", r)
	}
	// Another port of the same remote is another endpoint.
	vport(t, e.out(syn(ap(dipA, 1009), ap(remote, 8080))))

	st := e.s.Stats()
	require.EqualValues(t, 17, st.Created)
	require.EqualValues(t, 9, st.Reused, "the second remote's and the other remote port's connections reuse ports")
	require.EqualValues(t, 2, st.Exhausted)
	use := e.s.Usage(nil)
	require.Len(t, use, 1)
	require.Equal(t, 17, use[0].Conns)
	require.Equal(t, 8, use[0].Ports)
	require.Equal(t, alloc(vipO, 2048, 2055, dipA, vni), use[0].PortAllocation)
	require.EqualValues(t, 2, e.drop["snat_exhausted"])
}

// TestSNATExhaustion: with every port taken towards one remote, a new
// connection is dropped and counted, existing ones keep working both
// ways, and closing one (FIN, then the closing timeout) lets the next
// one in on the freed port. Unanswered SYNs free their ports after the
// untrusted timeout.
func TestSNATExhaustion(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2055, dipA, vni))
	dst := ap(remote, 80)
	var vps []uint16
	for i := range 8 {
		c := syn(ap(dipA, uint16(1000+i)), dst)
		vp := vport(t, e.out(c))
		vps = append(vps, vp)
		synAck := c.withSrc(ap(vipO, vp)).reply()
		synAck.syn, synAck.ack = true, true
		require.Empty(t, e.back(synAck, vni).reason)
	}
	require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 2000), dst)).reason)
	require.EqualValues(t, 1, e.s.Stats().Exhausted)
	// Existing connections are unaffected, both ways.
	for i, vp := range vps {
		c := tcp(ap(dipA, uint16(1000+i)), dst)
		require.Equal(t, vp, vport(t, e.out(c)))
		require.Equal(t, ap(dipA, uint16(1000+i)), dstOf(e.back(c.withSrc(ap(vipO, vp)).reply(), vni)))
	}
	// Close connection 3: its port is free once the closing timeout
	// passed (the others, established, keep theirs).
	fin := tcp(ap(dipA, 1003), dst)
	fin.fin = true
	require.Equal(t, vps[3], vport(t, e.out(fin)))
	require.EqualValues(t, 1, e.s.Stats().Closed)
	require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 2000), dst)).reason, "closing still holds the port")
	// A VM retrying meanwhile must not keep the closing connection alive
	// by probing its port.
	half := flow.Ticks(flow.DefaultTimeouts().Closing / 2)
	e.now += half
	require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 2000), dst)).reason, "closing still holds the port")
	e.now += half + 1
	require.Equal(t, vps[3], vport(t, e.out(syn(ap(dipA, 2000), dst))), "the freed port, a closing timeout after the FIN")
	require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 2001), dst)).reason)

	// Unanswered SYNs (untrusted) expire and free their ports.
	e2 := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2055, dipA, vni))
	for i := range 8 {
		vport(t, e2.out(syn(ap(dipA, uint16(1000+i)), dst)))
	}
	require.Equal(t, "snat_exhausted", e2.out(syn(ap(dipA, 2000), dst)).reason)
	require.Equal(t, 8, e2.s.Usage(nil)[0].Conns)
	e2.now += flow.Ticks(flow.DefaultTimeouts().Untrusted) + 1
	require.Equal(t, 0, e2.s.Usage(nil)[0].Conns, "expired connections hold nothing")
	for i := range 8 {
		vport(t, e2.out(syn(ap(dipA, uint16(3000+i)), dst)))
	}
	_, expired := e2.s.Age(e2.now+flow.Ticks(flow.DefaultTimeouts().Untrusted)+1, 1<<20)
	require.Equal(t, 8, expired)
	require.NotZero(t, e2.s.Stats().Expired)
}

// TestSNATWithdrawnRange: a range taken away keeps its connections (both
// ways) until they end, new connections get the ranges in force, and
// Usage reports the withdrawn range while it holds connections.
func TestSNATWithdrawnRange(t *testing.T) {
	a, b := alloc(vipO, 2048, 2055, dipA, vni), alloc(vipO, 3000, 3007, dipA, vni)
	e := newSNATEnv(t, defaultSections(), a)
	c := udp(ap(dipA, 5000), ap(remote, 53))
	vp := vport(t, e.out(c))
	require.Empty(t, e.back(c.withSrc(ap(vipO, vp)).reply(), vni).reason) // proves it: udp class

	e.s.SetAllocations([]flow.PortAllocation{b})
	require.Equal(t, vp, vport(t, e.out(c)), "the old port, from a withdrawn range")
	require.Equal(t, ap(dipA, 5000), dstOf(e.back(c.withSrc(ap(vipO, vp)).reply(), vni)))
	vp2 := vport(t, e.out(udp(ap(dipA, 5001), ap(remote, 53))))
	require.True(t, vp2 >= 3000 && vp2 <= 3007, "new connections use the range in force: %d", vp2)

	use := e.s.Usage(nil)
	require.Equal(t, []flow.PortRangeUse{{PortAllocation: b, Conns: 1, Ports: 1}, {PortAllocation: a, Conns: 1, Ports: 1}}, use)
	// Once its connection expired, the withdrawn range is forgotten.
	e.now += flow.Ticks(flow.DefaultTimeouts().UDP) + 1
	require.Equal(t, []flow.PortRangeUse{{PortAllocation: b}}, e.s.Usage(nil))
	e.s.SetAllocations(nil)
	require.Equal(t, "snat_exhausted", e.out(udp(ap(dipA, 5002), ap(remote, 53))).reason, "no range")
}

// TestSNATTenants: the same DIP address in two VNIs goes out through each
// tenant's VIP, and a reply in the wrong VNI matches nothing.
func TestSNATTenants(t *testing.T) {
	sections := []nat.Outbound{
		{VIP: vipO, VNI: vni, DIPs: []netip.Addr{dipA}},
		{VIP: vipT, VNI: vni2, DIPs: []netip.Addr{dipA}},
	}
	e := newSNATEnv(t, sections, alloc(vipO, 2048, 2055, dipA, vni), alloc(vipT, 2048, 2055, dipA, vni2))
	c := udp(ap(dipA, 5000), ap(remote, 53))
	r1 := e.run(e.ret, c.frame(), vni)
	r2 := e.run(e.ret, c.frame(), vni2)
	require.Empty(t, r1.reason)
	require.Empty(t, r2.reason)
	require.Equal(t, vipO, r1.p.Key.SrcAddr())
	require.Equal(t, vipT, r2.p.Key.SrcAddr())
	back1 := c.withSrc(ap(vipO, r1.p.Key.SrcPort)).reply()
	back2 := c.withSrc(ap(vipT, r2.p.Key.SrcPort)).reply()
	require.Equal(t, "snat_no_state", e.back(back1, vni2).reason)
	require.Equal(t, "snat_no_state", e.back(back2, vni).reason)
	got1, got2 := e.back(back1, vni), e.back(back2, vni2)
	require.Equal(t, ap(dipA, 5000), dstOf(got1))
	require.EqualValues(t, vni, got1.p.Key.VNI)
	require.Equal(t, ap(dipA, 5000), dstOf(got2))
	require.EqualValues(t, vni2, got2.p.Key.VNI)
	require.EqualValues(t, 2, e.s.Stats().NoState)
}

// TestSNATPaths: what the Return and Inbound stages do with an outbound
// DIP's other traffic, and that DSR traffic is unchanged.
func TestSNATPaths(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2055, dipA, vni))
	// East-west: a destination in the section's local prefixes leaves
	// untranslated on the Direct port.
	east := syn(ap(dipA, 1000), ap(dipB, 80))
	res := e.out(east)
	require.Empty(t, res.reason)
	require.Equal(t, east.frame(), res.frame, "untranslated")
	require.Equal(t, engine.VerdictEmit, res.p.Verdict)
	require.EqualValues(t, directPort, res.p.OutPort)
	require.EqualValues(t, 1, e.s.Stats().Local)
	// A DSR connection of the same DIP is translated as before.
	c := ap(client4, 40000)
	require.Empty(t, e.inbound(tcp(c, ap(vipA, 80)).to(macA)).reason)
	rep := e.reply(tcp(ap(dipA, 8080), c))
	require.Empty(t, rep.reason)
	require.Equal(t, ap(vipA, 80), netip.AddrPortFrom(rep.p.Key.SrcAddr(), rep.p.Key.SrcPort))
	require.Zero(t, rep.p.Flags&engine.FlagOutbound)
	// A DSR reply without state still goes by the stateless rule; an
	// outbound connection's packets by their state first.
	rep = e.reply(udp(ap(dipA, 53), ap(client4, 40001)))
	require.Equal(t, ap(vipA, 53), netip.AddrPortFrom(rep.p.Key.SrcAddr(), rep.p.Key.SrcPort))
	// A DIP that is not outbound: its SYN has no state (as before).
	require.Equal(t, "nat_no_state", e.reply(syn(ap(dipB, 1000), ap(remote, 80))).reason)
	// A pool port without state; a VIP address without outbound and no
	// rule.
	require.Equal(t, "snat_no_state", e.back(udp(ap(remote, 53), ap(vipO, 2050)), vni).reason)
	require.Equal(t, "nat_no_rule", e.back(udp(ap(remote, 53), ap(vipA, 2050)), vni).reason)
	// A protocol the SNAT does not translate leaves untranslated on the
	// Direct port, for the host to route.
	other := pkt{src: ap(dip6, 0), dst: ap(remote6, 0), proto: flow.ProtoICMPv6}.frame()
	other[header.EthernetSize+header.IPv6Size] = 200 // an ICMPv6 informational message, not an echo
	res = e.run(e.ret, other, vni)
	require.Empty(t, res.reason)
	require.Equal(t, other, res.frame, "untranslated")
	require.EqualValues(t, directPort, res.p.OutPort)
	require.EqualValues(t, 1, e.s.Stats().Passed)
	// A DIP without ranges.
	e.s.SetAllocations(nil)
	require.Equal(t, "snat_exhausted", e.out(syn(ap(dipA, 1000), ap(remote, 80))).reason)
}

// TestSNATRestart: a connection whose state was lost (a restarted agent)
// gets the same port again while it is free: the first candidate is a
// function of the 5-tuple and the seed.
func TestSNATRestart(t *testing.T) {
	e1 := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 4095, dipA, vni))
	e2 := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 4095, dipA, vni))
	for i := range 20 {
		c := tcp(ap(dipA, uint16(40000+i)), ap(remote, 443))
		require.Equal(t, vport(t, e1.out(c)), vport(t, e2.out(c)))
	}
}

// TestSNATStateRefresh: a connection that sends one way only keeps both
// its entries: the outgoing direction refreshes the returning entry, and
// the reverse.
func TestSNATStateRefresh(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2055, dipA, vni))
	up := udp(ap(dipA, 5000), ap(remote, 514))
	vp := vport(t, e.out(up))
	down := up.withSrc(ap(vipO, vp)).reply()
	require.Empty(t, e.back(down, vni).reason) // proven: udp, 60 s
	step := flow.Ticks(flow.DefaultTimeouts().UDP) / 4
	for range 12 { // three timeouts of VM → remote only
		e.now += step
		require.Equal(t, vp, vport(t, e.out(up)))
	}
	require.Equal(t, ap(dipA, 5000), dstOf(e.back(down, vni)), "the returning entry lived on")
	for range 12 { // and remote → VM only
		e.now += step
		require.Equal(t, ap(dipA, 5000), dstOf(e.back(down, vni)))
	}
	out, _ := e.s.Tables()
	k := flow.KeyFrom(vni, flow.ProtoUDP, ap(dipA, 5000), ap(remote, 514))
	_, _, ok := out.Lookup(&k, e.now)
	require.True(t, ok, "the outgoing entry lived on")
	require.Equal(t, vp, vport(t, e.out(up)))
	require.EqualValues(t, 1, e.s.Stats().Created)
	// An outgoing entry lost (evicted) takes its port back from the
	// returning one.
	require.True(t, out.Delete(&k))
	require.Equal(t, vp, vport(t, e.out(up)), "the same port")
	require.EqualValues(t, 1, e.s.Stats().Created, "not a new connection")
}

// TestSNATConcurrent: workers opening connections from one DIP to one
// remote endpoint at once never share a port. Run with -race. A SYN may
// be dropped when another worker holds the bucket of its outgoing entry
// for longer than a try-lock's spins (four workers on this machine's two
// cores: a holder descheduled mid-write; 7–17 runs in 150 dropped one or
// two): it is counted as refused, and the table counts the busy bucket.
func TestSNATConcurrent(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 2048+1023, dipA, vni))
	const workers, per = 4, 48
	got := make([][]uint16, workers)
	var wg sync.WaitGroup
	for w := range workers {
		frames := make([][]byte, per)
		for i := range per {
			frames[i] = syn(ap(dipA, uint16(10000+w*per+i)), ap(remote, 443)).frame()
		}
		bt := newBatch(t, vni, frames)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bt.reset()
			b.Worker = w
			e.ret.Process(b)
			for _, p := range b.Packets() {
				if p.Verdict == engine.VerdictTX {
					got[w] = append(got[w], p.Key.SrcPort)
				}
			}
		}()
	}
	wg.Wait()
	var all []uint16
	for _, g := range got {
		all = append(all, g...)
	}
	st := e.s.Stats()
	out, _ := e.s.Tables()
	require.EqualValues(t, workers*per, uint64(len(all))+st.Refused, "every SYN sent or counted refused: %+v", st)
	require.LessOrEqual(t, st.Refused, out.Stats().Busy, "refused only for a busy bucket")
	require.Less(t, int(st.Refused), per, "most SYNs sent")
	n := len(all)
	slices.Sort(all)
	require.Len(t, slices.Compact(all), n, "a port handed out twice")
}

// TestSNATNoAllocs: outgoing and returning translation of established
// connections (ICMP errors about them too, ICMPv6 ones quoting extension
// headers), and new connections, allocate nothing per packet.
func TestSNATNoAllocs(t *testing.T) {
	e := newSNATEnv(t, defaultSections(), alloc(vipO, 2048, 4095, dipA, vni), alloc(vipO6, 2048, 4095, dip6, vni))
	var outs, backs [][]byte
	for i := range 32 {
		src, r := dipA, remote
		if i%2 == 1 {
			src, r = dip6, remote6
		}
		c := udp(ap(src, uint16(5000+i)), ap(r, 53))
		if i%4 == 2 {
			c = tcp(ap(src, uint16(5000+i)), ap(r, 443))
		}
		res := e.out(c)
		require.Empty(t, res.reason)
		outs = append(outs, c.frame())
		backs = append(backs, c.withSrc(netip.AddrPortFrom(res.p.Key.SrcAddr(), res.p.Key.SrcPort)).reply().to(macA).frame())
	}
	// Pings, their replies, and an ICMP error about a connection.
	for i := range 4 {
		res := e.run(e.ret, echoFrame(dipA, remote, macGW, false, uint16(0x700+i)), vni)
		require.Empty(t, res.reason)
		outs = append(outs, echoFrame(dipA, remote, macGW, false, uint16(0x700+i)))
		backs = append(backs, echoFrame(remote, vipO, macA, true, echoID(t, res.frame, true)))
	}
	c := tcp(ap(dipA, 6000), ap(remote, 443))
	res := e.out(c)
	require.Empty(t, res.reason)
	backs = append(backs, icmpErr(remote, vipO, macA, c.withSrc(ap(vipO, res.p.Key.SrcPort)), 0, false))
	// ICMPv6 errors whose quotes have extension headers, the long chain's
	// rewrite (rewriteQuoteChain) included.
	c = tcp(ap(dip6, 6001), ap(remote6, 443))
	sent := c.withSrc(ap(vipO6, vport(t, e.out(c))))
	for _, exts := range [][]gpkt.Ext6{{gpkt.DestOpts6, firstFrag6}, {gpkt.DestOpts6, gpkt.DestOpts6, firstFrag6}} {
		backs = append(backs, icmpErrFrame(remote6, vipO6, macA, frameExt6(sent, exts...), 0, false))
	}
	ob, ib := newBatch(t, vni, outs), newBatch(t, vni, backs)
	require.Zero(t, testing.AllocsPerRun(50, func() { e.ret.Process(ob.reset()) }), "outgoing")
	require.Zero(t, testing.AllocsPerRun(50, func() { e.in.Process(ib.reset()) }), "returning")
	e.in.Process(ib.reset())
	e.ret.Process(ob.reset())
	for i := range backs {
		require.Zero(t, ib.pkts[i].Reason, "returning packet %d", i)
	}
	for i := range outs {
		require.Zero(t, ob.pkts[i].Reason, "outgoing packet %d", i)
	}
	require.Zero(t, testing.AllocsPerRun(20, func() {
		e.now += flow.Ticks(flow.DefaultTimeouts().Established) + 1
		e.ret.Process(ob.reset())
	}), "new connections")
}

// TestSNATConfigErrors: SetOutbound refuses what it cannot translate.
func TestSNATConfigErrors(t *testing.T) {
	s, err := nat.NewSNAT(nat.SNATConfig{Capacity: 64})
	require.NoError(t, err)
	for name, o := range map[string]nat.Outbound{
		"no VIP":         {VNI: vni, DIPs: []netip.Addr{dipA}},
		"VNI too large":  {VIP: vipO, VNI: 1 << 24, DIPs: []netip.Addr{dipA}},
		"family differs": {VIP: vipO, VNI: vni, DIPs: []netip.Addr{dip6}},
		"bad prefix":     {VIP: vipO, VNI: vni, DIPs: []netip.Addr{dipA}, Local: []netip.Prefix{{}}},
	} {
		require.ErrorIs(t, s.SetOutbound([]nat.Outbound{o}), nat.ErrSNATConfig, name)
	}
	_, err = nat.NewSNAT(nat.SNATConfig{})
	require.ErrorIs(t, err, nat.ErrSNATConfig)
	require.Equal(t, flow.DefaultTimeouts().Established, s.MaxTimeout())
}

// TestSNATAmbiguousNotDropped: Stats.Ambiguous counts the replies dropped
// as nat_no_state because their source is the endpoint of several rules.
// An outbound DIP's packet from such an endpoint is not dropped but the
// SNAT's (a connection of its own): it is not counted there, so that
// Ambiguous stays a part of the nat_no_state drops.
func TestSNATAmbiguousNotDropped(t *testing.T) {
	rules := append(testRules(),
		// Two VIPs served by the same DIP endpoint: ambiguous.
		flow.Rule{Name: "amb1", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.20"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
			Backends: []flow.Backend{{Name: "a", Addr: dipA, Port: 7000, MAC: macA, Weight: 1}}},
		flow.Rule{Name: "amb2", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.21"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
			Backends: []flow.Backend{
				{Name: "a", Addr: dipA, Port: 7000, MAC: macA, Weight: 1},
				{Name: "b", Addr: dipB, Port: 7000, MAC: macB, Weight: 1},
			}},
		flow.Rule{Name: "amb3", VIP: flow.VIP{Addr: netip.MustParseAddr("198.18.100.22"), Proto: flow.ProtoTCP, Port: 80, VNI: vni},
			Backends: []flow.Backend{{Name: "b", Addr: dipB, Port: 7000, MAC: macB, Weight: 1}}},
	)
	s, err := nat.NewSNAT(nat.SNATConfig{Capacity: 4096, Seed: 1})
	require.NoError(t, err)
	require.NoError(t, s.SetOutbound(defaultSections())) // dipA is outbound, dipB is not
	s.SetAllocations([]flow.PortAllocation{alloc(vipO, 2048, 2111, dipA, vni)})
	e := newEnv(t, rules, testLocals(), func(c *nat.Config) { c.SNAT, c.Direct, c.HasDirect = s, directPort, true })

	res := e.reply(tcp(ap(dipA, 7000), ap(remote, 443)))
	require.Empty(t, res.reason, "the SNAT's")
	require.Equal(t, vipO, res.p.Key.SrcAddr())
	require.Zero(t, e.tr.Stats().Ambiguous, "translated, not dropped")

	require.Equal(t, "nat_no_state", e.reply(tcp(ap(dipB, 7000), ap(remote, 443))).reason)
	require.EqualValues(t, 1, e.tr.Stats().Ambiguous)
	require.EqualValues(t, e.drops("nat_no_state"), e.tr.Stats().Ambiguous)
}

// runStage puts frame through stage alone, as env.run does, reporting to
// t (fuzz targets must not report to the env's F). nil when the frame
// does not parse.
func runStage(t *testing.T, stage engine.Stage, frame []byte, vni uint32) *engine.Packet {
	buf := make([]byte, engine.DefaultHeadroom+len(frame)+64)
	copy(buf[engine.DefaultHeadroom:], frame)
	p := new(engine.Packet)
	p.SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(frame), 3)
	if engine.ParsePacket(p, vni) != 0 {
		return nil
	}
	var b engine.Batch
	b.Append(p)
	stage.Process(&b)
	return p
}

// snatFuzzSeeds are outgoing frames of outbound DIPs (new and known
// connections, east-west, other DIPs) and remote packets (answers to
// them, to pool ports without state, to rule ports).
func snatFuzzSeeds() (outs, backs [][]byte) {
	ps := []pkt{
		syn(ap(dipA, 40000), ap(remote, 443)),
		tcp(ap(dipA, 40000), ap(remote, 443)),
		udp(ap(dipA, 40001), ap(remote, 53)),
		syn(ap(dip6, 40002), ap(remote6, 443)),
		udp(ap(dip6, 40003), ap(remote6, 53)),
		syn(ap(dipA, 40004), ap(dipB, 80)),
		syn(ap(dipB, 40005), ap(remote, 80)),
		udp(ap(dipA, 53), ap(remote, 53)),
		udp(ap(dipA, 40006), ap(remote, 53)).withFrag(2),
	}
	for _, p := range ps {
		outs = append(outs, p.frame())
		q := p.reply()
		switch p.src.Addr() {
		case dipA:
			q.dst = ap(vipO, 2048+p.src.Port()%64)
		case dip6:
			q.dst = ap(vipO6, 4096+p.src.Port()%64)
		}
		q.syn, q.ack = p.syn, true
		backs = append(backs, q.to(macA).frame())
	}
	backs = append(backs, udp(ap(remote, 53), ap(vipA, 53)).to(macA).frame())
	// Pings and their replies, ICMP errors about outbound packets.
	outs = append(outs, echoFrame(dipA, remote, macGW, false, 0x77), echoFrame(dip6, remote6, macGW, false, 0x78))
	backs = append(backs, echoFrame(remote, vipO, macA, true, 2050), echoFrame(remote6, vipO6, macA, true, 4100),
		icmpErr(remote, vipO, macA, tcp(ap(vipO, 2055), ap(remote, 443)), 0, false),
		icmpErr(remote6, vipO6, macA, udp(ap(vipO6, 4099), ap(remote6, 53)), 0, true),
		icmpErrFrame(remote, vipO, macA, echoFrame(vipO, remote, macGW, false, 2051), 0, true))
	return outs, backs
}

// FuzzSNAT: any frame from a VM or from a Mux through the SNAT's stages:
// no panic; a forwarded frame parses again to the key the stage left,
// with valid checksums when the input's were; and an outgoing packet the
// SNAT translated has its answer (the remote's packet to the VIP port)
// translated back to the VM's endpoint, in its VNI.
func FuzzSNAT(f *testing.F) {
	outs, backs := snatFuzzSeeds()
	for _, s := range outs {
		f.Add(s, true)
	}
	for _, s := range backs {
		f.Add(s, false)
	}
	e := newSNATEnv(f, defaultSections(), alloc(vipO, 2048, 2111, dipA, vni), alloc(vipO6, 4096, 4159, dip6, vni))
	for _, s := range snatExtErrSeeds(f, e) {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, frame []byte, fromVM bool) {
		var stage engine.Stage = e.in
		if fromVM {
			stage = e.ret
		}
		p := runStage(t, stage, frame, vni)
		if p == nil {
			return
		}
		var orig engine.Packet
		orig.SetBuffer(nil, 0, frame, 0, len(frame), 0)
		require.Zero(t, engine.ParsePacket(&orig, vni))
		if p.Verdict == engine.VerdictDrop {
			require.NotEqual(t, engine.DropUnsupported, p.Reason, "a parsed packet the rewrite refused")
			return
		}
		out := append([]byte(nil), p.Data()...)
		var q engine.Packet
		q.SetBuffer(nil, 0, out, 0, len(out), 0)
		require.Zero(t, engine.ParsePacket(&q, vni), "translated frame does not parse")
		require.Equal(t, p.Key, q.Key, "key and bytes disagree")
		if checksumsValid(&orig) {
			require.True(t, checksumsValid(&q), "checksums broken by the translation")
		}
		if !fromVM || p.Flags&engine.FlagOutbound == 0 {
			return
		}
		require.EqualValues(t, uplink, p.OutPort)
		k := p.Key
		answer := udp(netip.AddrPortFrom(k.DstAddr(), k.DstPort), netip.AddrPortFrom(k.SrcAddr(), k.SrcPort))
		if k.Proto == flow.ProtoTCP {
			answer = tcp(answer.src, answer.dst)
		}
		answerFrame := answer.to(macA).frame()
		if k.Proto == flow.ProtoICMP || k.Proto == flow.ProtoICMPv6 {
			// A ping: the echo reply, with the identifier sent.
			id := binary.BigEndian.Uint16(p.L4()[4:])
			answerFrame = echoFrame(k.DstAddr(), k.SrcAddr(), macA, true, id)
			origID := binary.BigEndian.Uint16(orig.L4()[4:])
			back := runStage(t, e.in, answerFrame, vni)
			require.NotNil(t, back)
			require.Zero(t, back.Reason, "the echo reply to a translated ping")
			require.Equal(t, orig.Key.SrcAddr(), back.Key.DstAddr())
			require.Equal(t, origID, binary.BigEndian.Uint16(back.L4()[4:]))
			return
		}
		back := runStage(t, e.in, answerFrame, vni)
		require.NotNil(t, back)
		require.Zero(t, back.Reason, "the answer to a translated packet")
		require.Equal(t, orig.Key.SrcAddr(), back.Key.DstAddr())
		require.Equal(t, orig.Key.SrcPort, back.Key.DstPort)
		require.EqualValues(t, vni, back.Key.VNI)
	})
}
