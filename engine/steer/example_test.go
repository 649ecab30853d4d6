//go:build linux

package steer_test

import (
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/engine/steer"
)

// A Config is the plain spec of what to steer; Validate and Normalize need
// no privileges.
func ExampleConfig_Normalize() {
	cfg := steer.Config{
		Dst: []steer.DstRule{
			{Addr: netip.MustParseAddr("198.18.0.10"), Proto: steer.ProtoTCP, Port: 443},
			{Addr: netip.MustParseAddr("2001:db8::10")}, // every protocol and port
		},
		VXLAN: []steer.VXLANRule{{Local: netip.MustParseAddr("198.18.1.1")}}, // port 4789
		Src:   []steer.SrcRule{{Addr: netip.MustParseAddr("198.18.2.10"), Port: 8080}},
		Infra: []netip.Prefix{netip.MustParsePrefix("198.18.3.1/24")},
	}
	if err := cfg.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	n := cfg.Normalize()
	for _, r := range n.Dst {
		fmt.Println(r)
	}
	fmt.Println(n.VXLAN[0])
	fmt.Println(n.Src[0])
	fmt.Println("infra", n.Infra[0])

	bad := steer.Config{Dst: []steer.DstRule{{Addr: netip.MustParseAddr("198.18.0.10"), Port: 80}}}
	fmt.Println(bad.Validate())
	// Output:
	// dst 198.18.0.10:443 tcp
	// dst 2001:db8::10
	// vxlan 198.18.1.1:4789
	// src 198.18.2.10:8080
	// infra 198.18.3.0/24
	// steer: invalid rule: dst 198.18.0.10:80 proto 0: a port needs tcp or udp
}

// A Mux uplink: steer the VIPs into the AF_XDP sockets, pass the rest.
// Needs CAP_BPF and CAP_NET_ADMIN, so it is compiled but not run.
func Example() {
	p, err := steer.Load(steer.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close() // detaches; nothing stays on the interface

	const uplink = 2 // ifindex
	if err := p.Attach(uplink, steer.AttachAuto); err != nil {
		fmt.Println(err)
		return
	}
	// For each RX queue q, with xsk an AF_XDP socket bound to (uplink, q):
	//	p.RegisterSocket(q, xsk.FD())

	// Apply (and later re-apply) the desired set, live.
	err = p.Sync(steer.Config{Dst: []steer.DstRule{
		{Addr: netip.MustParseAddr("198.18.0.10"), Proto: steer.ProtoTCP, Port: 443},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	s, _ := p.Stats()
	fmt.Println("redirected", s.Redirected, "passed", s.Passed())
}
