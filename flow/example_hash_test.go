package flow_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/flow"
)

// A Hasher's seed is fleet configuration: every Mux uses the same one.
func ExampleHasher() {
	h := flow.NewHasher(0x5eed)
	k := flow.KeyFrom(100, flow.ProtoTCP,
		netip.MustParseAddrPort("198.18.0.1:40000"),
		netip.MustParseAddrPort("198.19.0.10:80"))
	rev := k.Reverse()

	fmt.Println(flow.HashVersion)
	fmt.Printf("5-tuple %#x\n", h.Hash(&k, flow.Tuple5))
	fmt.Println("directional hash differs by direction:", h.Hash(&k, flow.Tuple5) != h.Hash(&rev, flow.Tuple5))
	fmt.Println("symmetric hash does not:", h.SymmetricHash(&k) == h.SymmetricHash(&rev))

	// A 3-tuple hash ignores the ports: every connection from the client
	// to the VIP maps together.
	other := k
	other.SrcPort = 40001
	fmt.Println("3-tuple ignores ports:", h.Hash(&k, flow.Tuple3) == h.Hash(&other, flow.Tuple3))
	// Output:
	// xdplb-hash-v2
	// 5-tuple 0x233679e231f3491e
	// directional hash differs by direction: true
	// symmetric hash does not: true
	// 3-tuple ignores ports: true
}

func ExampleMaglev() {
	backends := []flow.MaglevBackend{
		{Name: "198.18.1.1:8080", Weight: 1},
		{Name: "198.18.1.2:8080", Weight: 1},
		{Name: "198.18.1.3:8080", Weight: 2},
		{Name: "198.18.1.4:8080", Weight: 0}, // draining: no new flows
	}
	m, err := flow.NewMaglev(backends, flow.MaglevDefaultSize)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(m.Version(), m.Size())
	for i, b := range backends {
		fmt.Printf("%s weight %d: %d slots\n", b.Name, b.Weight, m.Slots(i))
	}
	h := flow.NewHasher(1)
	k := flow.KeyFrom(0, flow.ProtoTCP,
		netip.MustParseAddrPort("198.19.0.7:51003"),
		netip.MustParseAddrPort("198.18.0.10:80"))
	fmt.Println("flow goes to", backends[m.Lookup(h.Hash(&k, flow.Tuple5))].Name)

	_, err = flow.NewMaglev(backends, 65536)
	fmt.Println(errors.Is(err, flow.ErrMaglevSize), err)
	// Output:
	// maglev-v1 65537
	// 198.18.1.1:8080 weight 1: 16384 slots
	// 198.18.1.2:8080 weight 1: 16384 slots
	// 198.18.1.3:8080 weight 2: 32769 slots
	// 198.18.1.4:8080 weight 0: 0 slots
	// flow goes to 198.18.1.3:8080
	// true flow: invalid maglev table size: 65536 is not prime
}

func ExampleRules() {
	web := func(state flow.BackendState) []flow.Backend {
		return []flow.Backend{
			{Name: "198.18.1.5:8080", Addr: netip.MustParseAddr("198.18.1.5"), Port: 8080,
				MAC: [6]byte{2, 0, 0, 0, 0, 5}, Host: netip.MustParseAddr("198.18.10.1"), Weight: 1},
			{Name: "198.18.1.6:8080", Addr: netip.MustParseAddr("198.18.1.6"), Port: 8080,
				MAC: [6]byte{2, 0, 0, 0, 0, 6}, Host: netip.MustParseAddr("198.18.10.2"), Weight: 1, State: state},
		}
	}
	config := func(state flow.BackendState) []flow.Rule {
		return []flow.Rule{{
			Name:     "web",
			VIP:      flow.VIP{Addr: netip.MustParseAddr("198.18.0.10"), Proto: flow.ProtoTCP, Port: 80, VNI: 7},
			Mode:     flow.Tuple5,
			Backends: web(state),
		}}
	}

	rules := flow.NewRules() // version 0, no rules
	if _, err := rules.Update(1, config(flow.BackendActive)); err != nil {
		fmt.Println(err)
		return
	}

	// The data path: load once per batch, then per packet.
	h := flow.NewHasher(1)
	snap := rules.Load()
	k := flow.KeyFrom(7, flow.ProtoTCP,
		netip.MustParseAddrPort("198.19.0.7:51003"),
		netip.MustParseAddrPort("198.18.0.10:80"))
	if r := snap.Lookup(&k); r != nil {
		if i, ok := r.Pick(h.Hash(&k, r.Mode)); ok {
			b := &r.Backends[i]
			fmt.Printf("v%d %s → %s via host %s\n", snap.Version, r.Name, b.Name, b.Host)
		}
	}

	// Health marks 198.18.1.6 down: version 2 sends every new flow to .5.
	s2, _ := rules.Update(2, config(flow.BackendDown))
	r := s2.Lookup(&k)
	i, _ := r.Pick(h.Hash(&k, r.Mode))
	fmt.Printf("v%d %s → %s\n", s2.Version, r.Name, r.Backends[i].Name)

	// Versions only move forward.
	_, err := rules.Update(2, config(flow.BackendActive))
	fmt.Println(errors.Is(err, flow.ErrStaleVersion), rules.Load().Version)
	// Output:
	// v1 web → 198.18.1.6:8080 via host 198.18.10.2
	// v2 web → 198.18.1.5:8080
	// true 2
}
