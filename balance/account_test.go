package balance_test

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/encap"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/benchutil"
	"github.com/xdplb/xdplb/internal/lab/gpkt"
)

// acctFlow is one client flow of the accounting tests.
type acctFlow struct {
	src   netip.Addr
	sport uint16
	vip   flow.VIP
	vlan  bool // an 802.1Q tag in front of the IP header
}

// frame builds one packet of f with gopacket: payload bytes of data after
// the TCP or UDP header, padded with zeros to an Ethernet minimum of 60
// bytes when shorter (padding is no part of the IP packet).
func (f acctFlow) frame(payload int) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	ls := []gopacket.SerializableLayer{eth}
	next := &eth.EthernetType
	if f.vlan {
		eth.EthernetType = layers.EthernetTypeDot1Q
		tag := &layers.Dot1Q{VLANIdentifier: 42}
		ls = append(ls, tag)
		next = &tag.Type
	}
	var nl gopacket.NetworkLayer
	if f.src.Is4() {
		*next = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocol(f.vip.Proto), SrcIP: f.src.AsSlice(), DstIP: f.vip.Addr.AsSlice()}
		nl = ip
		ls = append(ls, ip)
	} else {
		*next = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocol(f.vip.Proto), SrcIP: f.src.AsSlice(), DstIP: f.vip.Addr.AsSlice()}
		nl = ip
		ls = append(ls, ip)
	}
	if f.vip.Proto == flow.ProtoTCP {
		t := &layers.TCP{SrcPort: layers.TCPPort(f.sport), DstPort: layers.TCPPort(f.vip.Port), ACK: true, Window: 1000}
		_ = t.SetNetworkLayerForChecksum(nl)
		ls = append(ls, t)
	} else {
		u := &layers.UDP{SrcPort: layers.UDPPort(f.sport), DstPort: layers.UDPPort(f.vip.Port)}
		_ = u.SetNetworkLayerForChecksum(nl)
		ls = append(ls, u)
	}
	ls = append(ls, gopacket.Payload(make([]byte, payload)))
	fr := gpkt.MustSerialize(ls...)
	if len(fr) < 60 {
		fr = append(fr, make([]byte, 60-len(fr))...)
	}
	return fr
}

// ipLen is the oracle of the bytes counted: the length of the frame's IP
// packet as gopacket decodes it (header and payload; no Ethernet, VLAN or
// padding).
func ipLen(t testing.TB, frame []byte) uint64 {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		return uint64(len(ip.Contents) + len(ip.Payload))
	case *layers.IPv6:
		return uint64(len(ip.Contents) + len(ip.Payload))
	}
	t.Fatalf("no IP layer in %x", frame)
	return 0
}

var (
	acctWeb = flow.VIP{Addr: netip.MustParseAddr("198.18.100.1"), Proto: flow.ProtoTCP, Port: 80}
	acctDNS = flow.VIP{Addr: netip.MustParseAddr("2001:db8:100::53"), Proto: flow.ProtoUDP, Port: 53}
)

// acctBackends returns n backends named prefix00.., on hosts of both
// families (even: IPv4, odd: IPv6), so encapsulation writes both outer
// headers.
func acctBackends(prefix string, n int) []flow.Backend {
	var bs []flow.Backend
	for i := 0; i < n; i++ {
		host := netip.AddrFrom4([4]byte{198, 19, 0, byte(1 + i)})
		if i%2 == 1 {
			host = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x19, 14: byte(i >> 8), 15: byte(i)})
		}
		bs = append(bs, flow.Backend{Name: fmt.Sprintf("%s%03d", prefix, i), Addr: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}),
			MAC: [6]byte{2, 0, 0, 0, byte(i >> 8), byte(i)}, Host: host, Weight: 1})
	}
	return bs
}

func acctRules(web, dns []flow.Backend) []flow.Rule {
	return []flow.Rule{
		{Name: "web", VIP: acctWeb, Backends: web},
		{Name: "dns6", VIP: acctDNS, Backends: dns},
	}
}

// decision is what the balancing stage decided for one packet, as a
// recording stage after the Account stage saw it.
type decision struct {
	id    uint32
	vip   flow.VIP
	isNew bool
}

// acctRig is a worker polling a MemPort through Parse → balance →
// [Encap →] Account → record.
type acctRig struct {
	rules *flow.Rules
	port  *engine.MemPort
	w     *engine.Worker
	acct  *balance.Account
	pre   []engine.Stage // the stages before acct
	seen  []decision
}

// newAcctRig builds the rig; record adds the recording stage (which
// allocates as it appends).
func newAcctRig(t testing.TB, rules *flow.Rules, cfg balance.AccountConfig, record bool) *acctRig {
	r := &acctRig{rules: rules}
	conns, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: 4096})
	require.NoError(t, err)
	bal, err := balance.New(balance.Config{Rules: rules, Conns: conns, Hasher: flow.NewHasher(42)})
	require.NoError(t, err)
	r.acct = balance.NewAccount(cfg)
	rec := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			if p.Backend >= 0 {
				r.seen = append(r.seen, decision{p.Rule.Backends[p.Backend].ID, p.Rule.VIP, p.Flags&engine.FlagNewFlow != 0})
			}
		}
	})
	stages := []engine.Stage{engine.Parse{}, bal}
	if cfg.Encapsulated {
		enc, err := encap.NewEncap(encap.EncapConfig{SourceV4: netip.MustParseAddr("198.18.0.1"), SourceV6: netip.MustParseAddr("2001:db8::1")})
		require.NoError(t, err)
		stages = append(stages, enc)
	}
	r.pre = stages
	stages = append(stages[:len(stages):len(stages)], r.acct)
	if record {
		stages = append(stages, rec)
	}
	r.port, err = engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	r.w, err = engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{r.port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(stages...)}}})
	require.NoError(t, err)
	return r
}

// send passes frames through the pipeline and requires that none was
// dropped.
func (r *acctRig) send(t testing.TB, frames ...[]byte) {
	r.port.Inject(frames...)
	for r.port.Stats().Queued > 0 {
		r.w.Poll()
	}
	var s engine.Stats
	r.w.Counters().Snapshot(&s)
	require.Zero(t, s.Dropped(), "drops: %v", s.DropsByName())
}

// expect is the oracle: the counts per backend ID and per VIP, from the
// recorded decisions and gopacket's lengths of the frames, in order.
func expect(t testing.TB, seen []decision, frames [][]byte) (map[uint32]balance.Counts, map[flow.VIP]balance.Counts) {
	require.Len(t, seen, len(frames))
	byID, byVIP := map[uint32]balance.Counts{}, map[flow.VIP]balance.Counts{}
	add := func(c balance.Counts, n uint64, isNew bool) balance.Counts {
		c.Packets++
		c.Bytes += n
		if isNew {
			c.NewFlows++
		}
		return c
	}
	for i, d := range seen {
		n := ipLen(t, frames[i])
		byID[d.id] = add(byID[d.id], n, d.isNew)
		byVIP[d.vip] = add(byVIP[d.vip], n, d.isNew)
	}
	return byID, byVIP
}

// acctTraffic returns packets of n flows (per flow: a VIP, a family and
// maybe a VLAN tag), each flow sending perFlow packets of varied sizes
// (some short enough to be padded), interleaved.
func acctTraffic(n, perFlow int, base uint16) [][]byte {
	var flows []acctFlow
	for i := 0; i < n; i++ {
		f := acctFlow{sport: base + uint16(i), vip: acctWeb, vlan: i%3 == 0}
		f.src = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		if i%4 == 3 {
			f.vip = acctDNS
			f.src = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 14: byte(i >> 8), 15: byte(i)})
		}
		flows = append(flows, f)
	}
	var frames [][]byte
	for k := 0; k < perFlow; k++ {
		for i, f := range flows {
			frames = append(frames, f.frame((i*37+k*101)%300))
		}
	}
	return frames
}

func statsByID(st *balance.AccountStats) map[uint32]balance.Counts {
	m := map[uint32]balance.Counts{}
	for id, c := range st.Backends() {
		m[id] = c
	}
	return m
}

// TestAccountCounts: per backend and per VIP, packets, bytes (the client's
// IP packets, whatever Ethernet framing, VLAN tag or padding they came
// with) and new flows, against gopacket's lengths and the decisions the
// balancing stage made — before and after encapsulation (outer IPv4 and
// IPv6), which must count alike.
func TestAccountCounts(t *testing.T) {
	const flows, perFlow = 300, 3
	frames := acctTraffic(flows, perFlow, 1000)
	var results []balance.AccountStats
	for _, cfg := range []balance.AccountConfig{{}, {Encapsulated: true}} {
		t.Run(fmt.Sprintf("encapsulated=%v", cfg.Encapsulated), func(t *testing.T) {
			rules := flow.NewRules()
			_, err := rules.Update(1, acctRules(acctBackends("w", 6), acctBackends("d", 3)))
			require.NoError(t, err)
			r := newAcctRig(t, rules, cfg, true)
			r.send(t, frames...)

			wantID, wantVIP := expect(t, r.seen, frames)
			st := balance.SumAccounts(r.acct)
			require.Equal(t, wantID, statsByID(&st))
			for id, c := range wantID {
				require.Equal(t, c, st.Backend(id))
			}
			require.Equal(t, wantVIP[acctWeb], st.VIP(acctWeb))
			require.Equal(t, wantVIP[acctDNS], st.VIP(acctDNS))
			require.Len(t, wantID, 9, "every backend received traffic")

			// Independent of the decisions: every packet and every flow
			// once.
			var total balance.Counts
			for _, c := range wantID {
				total.Packets += c.Packets
				total.NewFlows += c.NewFlows
			}
			require.EqualValues(t, flows*perFlow, total.Packets)
			require.EqualValues(t, flows, total.NewFlows)
			results = append(results, st)
		})
	}
	require.Len(t, results, 2)
	require.Equal(t, statsByID(&results[0]), statsByID(&results[1]), "before and after encapsulation")
}

// TestAccountSkipsUndecided: packets without a balancing decision — no
// balancing stage, no rule (dropped before the stage), a rule without
// backends — are not counted.
func TestAccountSkipsUndecided(t *testing.T) {
	rules := flow.NewRules()
	_, err := rules.Update(1, acctRules(acctBackends("w", 2), nil)) // dns6 has no backend
	require.NoError(t, err)
	acct := balance.NewAccount(balance.AccountConfig{})
	bal, err := balance.New(balance.Config{Rules: rules, Hasher: flow.NewHasher(1)})
	require.NoError(t, err)
	port, err := engine.NewMemPort(engine.MemPortConfig{})
	require.NoError(t, err)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port}, Inputs: []engine.Input{
		{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, acct)},
	}})
	require.NoError(t, err)
	web := acctFlow{src: netip.MustParseAddr("198.18.0.1"), sport: 1, vip: acctWeb}
	port.Inject(web.frame(10))
	w.Poll()

	w2, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port}, Inputs: []engine.Input{
		{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, bal, acct)},
	}})
	require.NoError(t, err)
	other := web
	other.vip.Port = 81
	dns := acctFlow{src: netip.MustParseAddr("2001:db8::1"), sport: 1, vip: acctDNS}
	port.Inject(other.frame(10), dns.frame(10))
	w2.Poll()
	var s engine.Stats
	w2.Counters().Snapshot(&s)
	require.Equal(t, map[string]uint64{"no_rule": 1, "no_backend": 1}, s.DropsByName())

	st := balance.SumAccounts(acct)
	require.Empty(t, statsByID(&st))
	require.Zero(t, st.VIP(acctWeb))
	require.Zero(t, st.Backend(1))
}

// TestAccountReload: across reloads a backend keeps its counters (its ID is
// stable); a removed backend's counts stay in its VIP's total, which never
// decreases; backends added past the counters' initial size are counted,
// whether the stage watches the rules (room made per snapshot) or not
// (room made on first sight).
func TestAccountReload(t *testing.T) {
	for _, watch := range []bool{false, true} {
		t.Run(fmt.Sprintf("rules=%v", watch), func(t *testing.T) {
			rules := flow.NewRules()
			web := acctBackends("w", 4)
			_, err := rules.Update(1, acctRules(web, acctBackends("d", 2)))
			require.NoError(t, err)
			cfg := balance.AccountConfig{}
			if watch {
				cfg.Rules = rules
			}
			r := newAcctRig(t, rules, cfg, true)
			frames := acctTraffic(200, 2, 1000)
			r.send(t, frames...)
			before := balance.SumAccounts(r.acct)
			web0 := rules.Load().LookupVIP(acctWeb).Backends[0]
			require.NotZero(t, before.Backend(web0.ID).Packets)

			// Remove w000, add 200 backends (IDs past 64).
			_, err = rules.Update(2, acctRules(append(web[1:], acctBackends("x", 200)...), acctBackends("d", 2)))
			require.NoError(t, err)
			snap := rules.Load()
			require.Nil(t, func() *flow.Rule { r, _, _ := snap.Backend(web0.ID); return r }(), "w000 is gone")

			r.seen = nil
			more := acctTraffic(1000, 1, 20000)
			r.send(t, more...)
			after := balance.SumAccounts(r.acct)

			// The removed backend's counts are unchanged and still readable;
			// every VIP total grew by exactly the new traffic.
			require.Equal(t, before.Backend(web0.ID), after.Backend(web0.ID))
			_, wantVIP := expect(t, r.seen, more)
			for _, v := range []flow.VIP{acctWeb, acctDNS} {
				b, a, d := before.VIP(v), after.VIP(v), wantVIP[v]
				require.Equal(t, balance.Counts{Packets: b.Packets + d.Packets, Bytes: b.Bytes + d.Bytes, NewFlows: b.NewFlows + d.NewFlows}, a, "VIP %v", v)
			}
			// New backends with IDs past the initial 64 were counted.
			var high int
			for id := range after.Backends() {
				if id > 64 {
					high++
				}
			}
			require.Greater(t, high, 100)
		})
	}
}

// TestAccountNoAllocs: counting a batch allocates nothing once the
// counters have room (the steady state), before and after encapsulation.
func TestAccountNoAllocs(t *testing.T) {
	for _, cfg := range []balance.AccountConfig{{}, {Encapsulated: true}} {
		rules := flow.NewRules()
		_, err := rules.Update(1, acctRules(acctBackends("w", 100), acctBackends("d", 100)))
		require.NoError(t, err)
		cfg.Rules = rules
		r := newAcctRig(t, rules, cfg, false)
		r.port.Replay(acctTraffic(64, 1, 1000))
		r.w.Poll()
		require.Zero(t, testing.AllocsPerRun(100, func() { r.w.Poll() }), "encapsulated=%v", cfg.Encapsulated)
		// Counted: the first poll, AllocsPerRun's warm-up and its 100 runs.
		st := balance.SumAccounts(r.acct)
		require.Equal(t, uint64((1+1+100)*64), st.VIP(acctWeb).Packets+st.VIP(acctDNS).Packets)
	}
}

// TestAccountConcurrentRead reads the counters while a worker counts (run
// it with -race): every read is consistent — nothing decreases, new flows
// never exceed packets — and the last read has everything.
func TestAccountConcurrentRead(t *testing.T) {
	rules := flow.NewRules()
	_, err := rules.Update(1, acctRules(acctBackends("w", 50), acctBackends("d", 50)))
	require.NoError(t, err)
	r := newAcctRig(t, rules, balance.AccountConfig{}, true) // grows on first sight, under the reader
	frames := acctTraffic(2000, 1, 1000)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for _, f := range frames {
			r.port.Inject(f)
			r.w.Poll()
		}
	}()
	var last map[uint32]balance.Counts
	var lastWeb balance.Counts
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		st := balance.SumAccounts(r.acct)
		cur := statsByID(&st)
		for id, c := range cur {
			require.LessOrEqual(t, c.NewFlows, c.Packets)
			p := last[id]
			require.True(t, c.Packets >= p.Packets && c.Bytes >= p.Bytes && c.NewFlows >= p.NewFlows, "ID %d went back", id)
		}
		for id := range last {
			require.Contains(t, cur, id)
		}
		web := st.VIP(acctWeb)
		require.GreaterOrEqual(t, web.Packets, lastWeb.Packets)
		last, lastWeb = cur, web
	}
	wg.Wait()
	var s engine.Stats
	r.w.Counters().Snapshot(&s)
	require.Zero(t, s.Dropped(), "drops: %v", s.DropsByName())
	wantID, _ := expect(t, r.seen, frames)
	require.Equal(t, wantID, last)
}

// BenchmarkAccount measures the Account stage alone over a batch of 64
// packets of established flows to 200 backends, already balanced (and
// encapsulated, for encapsulated=true): ns/pkt is the stage's cost per
// packet in wall time, cpu-ns/pkt in the thread's CPU time (what to read
// on a shared machine). Run it with -cpu 1.
func BenchmarkAccount(b *testing.B) {
	for _, encapsulated := range []bool{false, true} {
		b.Run(fmt.Sprintf("encapsulated=%v", encapsulated), func(b *testing.B) {
			rules := flow.NewRules()
			_, err := rules.Update(1, acctRules(acctBackends("w", 100), acctBackends("d", 100)))
			require.NoError(b, err)
			r := newAcctRig(b, rules, balance.AccountConfig{Encapsulated: encapsulated, Rules: rules}, false)
			// The batch, as the stages before the Account leave it.
			var batch engine.Batch
			var pool [engine.MaxBatch]engine.Packet
			pre := engine.NewPipeline(r.pre...)
			for i, f := range acctTraffic(engine.MaxBatch, 1, 1000) {
				buf := make([]byte, 2048)
				copy(buf[engine.DefaultHeadroom:], f)
				pool[i].SetBuffer(nil, 0, buf, engine.DefaultHeadroom, len(f), 0)
				batch.Append(&pool[i])
			}
			pre.Process(&batch)
			require.Equal(b, engine.MaxBatch, batch.Len())
			acct := r.acct
			b.ReportAllocs()
			var cpu benchutil.CPUTimer
			b.ResetTimer()
			cpu.Start()
			for i := 0; i < b.N; i++ {
				acct.Process(&batch)
			}
			cpuNs := cpu.Stop()
			b.StopTimer()
			pkts := float64(b.N) * engine.MaxBatch
			if cpuNs > 0 {
				b.ReportMetric(float64(cpuNs)/pkts, "cpu-ns/pkt")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/pkts, "ns/pkt")
		})
	}
}

// TestAccountAddID: AddID, given the backend's ID its caller kept with its
// decision, counts what Add counts — a backend's first packet (its VIP
// bound), IDs past the counters' first size (64), a VIP of another
// family, and a reply to an outbound connection (flow.ReservedID, counted
// under its rule's ID).
func TestAccountAddID(t *testing.T) {
	rules := flow.NewRules()
	_, err := rules.Update(1, acctRules(acctBackends("w", 100), acctBackends("d", 3)))
	require.NoError(t, err)
	web, dns := rules.Load().Rules()[0], rules.Load().Rules()[1]
	require.Greater(t, web.Backends[99].ID, uint32(64), "an ID past the counters' first size")
	ret := &flow.Rule{ID: 5, VIP: acctWeb, Backends: []flow.Backend{{ID: flow.ReservedID}}}
	adds := []struct {
		r *flow.Rule
		i int32
		n int
	}{
		{web, 0, 100}, {web, 99, 40}, {web, 5, 60}, {web, 5, 61}, {web, 0, 1500},
		{dns, 2, 80}, {dns, 0, 90}, {ret, 0, 52}, {ret, 0, 53},
	}
	byAdd := balance.NewAccount(balance.AccountConfig{})
	byID := balance.NewAccount(balance.AccountConfig{})
	var b engine.Batch
	pa, pi := byAdd.Begin(&b), byID.Begin(&b)
	for _, a := range adds {
		pa.Add(a.r, a.i, a.n)
		pi.AddID(a.r, a.r.Backends[a.i].ID, a.n, false)
	}
	pa.End()
	pi.End()
	want, got := balance.SumAccounts(byAdd), balance.SumAccounts(byID)
	require.Equal(t, statsByID(&want), statsByID(&got))
	require.Len(t, statsByID(&got), 5)
	require.Equal(t, balance.Counts{Packets: 2, Bytes: 1600}, got.Backend(web.Backends[0].ID))
	require.Equal(t, balance.Counts{Packets: 1, Bytes: 40}, got.Backend(web.Backends[99].ID))
	require.Equal(t, balance.Counts{Packets: 5, Bytes: 1761}, got.VIP(acctWeb))
	require.Equal(t, balance.Counts{Packets: 2, Bytes: 170}, got.VIP(acctDNS))
	require.Equal(t, balance.Counts{Packets: 2, Bytes: 105}, got.Returns(5))
	require.Equal(t, want.Returns(5), got.Returns(5))

	// newFlow counts a new flow's first packet, as Packet counts one
	// with engine.FlagNewFlow.
	byNew := balance.NewAccount(balance.AccountConfig{})
	pn := byNew.Begin(&b)
	id := web.Backends[3].ID
	pn.AddID(web, id, 60, true)
	pn.AddID(web, id, 70, false)
	pn.AddID(web, id, 80, true)
	pn.End()
	got = balance.SumAccounts(byNew)
	require.Equal(t, balance.Counts{Packets: 3, Bytes: 210, NewFlows: 2}, got.Backend(id))
	require.Equal(t, balance.Counts{Packets: 3, Bytes: 210, NewFlows: 2}, got.VIP(acctWeb))
}
