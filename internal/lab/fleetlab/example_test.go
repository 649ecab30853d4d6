package fleetlab_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/fleetlab"
)

// A fleet's document for Mux 1: the VIP's backends are the fleet's VMs,
// weighted, on their hosts; the Mux peers with the router over BGP.
func ExampleFleetDoc() {
	web := fleetlab.Service{Name: "web", Addr: fleetlab.FleetVIP, Proto: flow.ProtoTCP, Port: 80,
		VNI: fleetlab.FleetVNI, DIPPort: 8080}
	doc := fleetlab.FleetDoc(1, 1, true, []fleetlab.Service{web}, fleetlab.FleetVMs()).Document()
	fmt.Println(doc.Node.Name, "AS", doc.BGP.ASN, "peers with", doc.BGP.Peers[0].Address, "AS", doc.BGP.Peers[0].ASN)
	for _, b := range doc.VIPs[0].Backends {
		fmt.Printf("%s %v on %v, weight %d\n", b.Name, netip.AddrPortFrom(b.Address, b.Port), b.Host, b.Weight)
	}
	// Output:
	// mux1 AS 65010 peers with 198.18.1.1 AS 65000
	// vm11 198.18.31.1:8080 on 198.18.21.2, weight 1
	// vm12 198.18.31.2:8080 on 198.18.21.2, weight 2
	// vm21 198.18.32.1:8080 on 198.18.22.2, weight 1
	// vm22 198.18.32.2:8080 on 198.18.22.2, weight 4
}

// The router's BIRD configuration in a fleet ends with one eBGP session
// per Mux.
func ExampleBIRDConfig_Text() {
	text := fleetlab.FleetBIRD().Text()
	for _, line := range []string{"router id 198.18.0.1;", "\tlocal as 65000;"} {
		fmt.Println(line, "→", strings.Contains(text, line))
	}
	fmt.Print(text[len(text)-2*len("protocol bgp mux1 from mux { neighbor 198.18.1.2 as 65010; }\n"):])
	// Output:
	// router id 198.18.0.1; → true
	// 	local as 65000; → true
	// protocol bgp mux1 from mux { neighbor 198.18.1.2 as 65010; }
	// protocol bgp mux2 from mux { neighbor 198.18.2.2 as 65010; }
}
