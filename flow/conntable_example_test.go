package flow_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/flow"
)

// A Mux remembers which backend each connection went to, so that the
// connection stays there when the VIP's pool changes. Time is passed in:
// the data path reads ct.Now() once per batch; this example uses
// synthetic ticks.
func ExampleConnTable() {
	ct, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: 1 << 16})
	if err != nil {
		panic(err)
	}
	k := flow.KeyFrom(100, flow.ProtoTCP,
		netip.MustParseAddrPort("198.18.0.10:40000"), netip.MustParseAddrPort("198.19.0.1:443"))

	var now flow.Tick
	// A SYN: no entry yet. Pick a backend (Maglev, say backend 7) and
	// remember it on a short leash.
	if _, _, ok := ct.Lookup(&k, now); !ok {
		fmt.Println("SYN:", ct.Insert(&k, 7, flow.ClassUntrusted, now))
	}
	// The client's ACK completes the handshake.
	now += flow.Ticks(50 * time.Millisecond)
	ct.SetClass(&k, flow.ClassEstablished, now)

	// Minutes later, even if the pool changed, the flow keeps its backend.
	now += flow.Ticks(10 * time.Minute)
	backend, class, ok := ct.Lookup(&k, now)
	fmt.Println("later:", backend, class, ok)

	// Idle past the established timeout (15 minutes), it is gone.
	now += flow.Ticks(16 * time.Minute)
	_, _, ok = ct.Lookup(&k, now)
	fmt.Println("idle:", ok)
	// Output:
	// SYN: new
	// later: 7 established true
	// idle: false
}

// The ager runs beside the data path and removes idle flows a bounded
// number of slots at a time.
func ExampleConnTable_Age() {
	ct, err := flow.NewConnTable(flow.ConnTableConfig{
		Capacity: 1000,
		Timeouts: flow.Timeouts{Untrusted: 5 * time.Second},
	})
	if err != nil {
		panic(err)
	}
	for i := range 100 {
		k := flow.KeyFrom(1, flow.ProtoTCP,
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), 40000),
			netip.MustParseAddrPort("198.19.0.1:443"))
		class := flow.ClassEstablished
		if i%4 == 0 {
			class = flow.ClassUntrusted // a SYN that never completed
		}
		ct.Insert(&k, uint32(i), class, 0)
	}
	// In a real ager: for range time.Tick(time.Second) { ct.Age(ct.Now(), budget) }.
	now := flow.Ticks(6 * time.Second)
	removed := 0
	for scanned := 0; scanned < ct.Cap(); {
		s, n := ct.Age(now, 256)
		scanned += s
		removed += n
	}
	fmt.Println("removed", removed, "left", ct.Len())
	// Output: removed 25 left 75
}

// A stage that looks up a whole batch prepares every query first, so that
// the cache misses of the batch's buckets overlap, then finishes them; a
// miss is inserted from the same query without hashing the key again.
func ExampleConnTable_Prepare() {
	ct, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: 1 << 16})
	if err != nil {
		panic(err)
	}
	var keys [4]flow.Key
	for i := range keys {
		keys[i] = flow.KeyFrom(100, flow.ProtoUDP,
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), 5000), netip.MustParseAddrPort("198.19.0.1:53"))
	}
	ct.Insert(&keys[2], 9, flow.ClassUDP, 0) // seen before

	var qs [len(keys)]flow.ConnQuery // per worker, reused batch after batch
	for i := range keys {
		ct.Prepare(&qs[i], &keys[i]) // pass 1: pack, hash, touch the buckets
	}
	for i := range keys { // pass 2
		if backend, _, ok := ct.LookupPrepared(&qs[i], 1); ok {
			fmt.Println(i, "hit", backend)
			continue
		}
		fmt.Println(i, "miss:", ct.InsertPrepared(&qs[i], uint32(i+1), flow.ClassUDP, 1))
	}
	// Output:
	// 0 miss: new
	// 1 miss: new
	// 2 hit 9
	// 3 miss: new
}
