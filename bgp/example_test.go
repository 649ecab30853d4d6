package bgp_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdplb/xdplb/bgp"
)

// A Mux announcing its healthy VIPs to two routers, and withdrawing them
// before it stops. It needs a network with routers, so it is compiled but
// not run by go test.
func Example() {
	a, err := bgp.New(bgp.Config{
		ASN:           65010,
		RouterID:      netip.MustParseAddr("198.18.0.10"),
		ListenPort:    179,
		HoldTime:      9 * time.Second,
		WithdrawGrace: bgp.DefaultWithdrawGrace,
		// IPv6 VIPs over the IPv4 sessions, with this next hop.
		NextHop6: netip.MustParseAddr("2001:db8::10"),
		Peers: []bgp.Peer{
			{Address: netip.MustParseAddr("198.18.0.1"), ASN: 65000},
			{Address: netip.MustParseAddr("198.18.0.2"), ASN: 65000},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	prometheus.MustRegister(a.Collector())
	if err := a.Start(context.Background()); err != nil {
		log.Fatal(err)
	}

	// After every configuration or health change: the healthy VIPs.
	healthy := []netip.Addr{netip.MustParseAddr("198.18.100.1"), netip.MustParseAddr("2001:db8:100::1")}
	var want []netip.Prefix
	for _, vip := range healthy {
		want = append(want, bgp.HostPrefix(vip))
	}
	if err := a.Sync(want); err != nil {
		log.Print(err)
	}

	// On SIGTERM: withdraw, keep forwarding for the grace period, then
	// close the sessions; only then stop the data path.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	<-stop
	if err := a.Shutdown(context.Background()); err != nil {
		log.Print(err)
	}
}

func ExampleConfig_Validate() {
	cfg := bgp.Config{
		ASN:      65010,
		RouterID: netip.MustParseAddr("2001:db8::10"),
		HoldTime: time.Second,
		Peers:    []bgp.Peer{{Address: netip.MustParseAddr("198.18.0.1"), Passive: true}},
	}
	fmt.Println(cfg.Validate())
	// Output:
	// bgp: invalid config: router_id: 2001:db8::10 is not an IPv4 address
	// bgp: invalid config: hold_time: 1s: must be whole seconds from 3s to 65535s (or 0 for 1m30s)
	// bgp: invalid config: peers[0].asn: missing (1..4294967295)
	// bgp: invalid config: peers[0].passive: a passive peer needs a listen_port
}

func ExampleHostPrefix() {
	fmt.Println(bgp.HostPrefix(netip.MustParseAddr("198.18.100.1")))
	fmt.Println(bgp.HostPrefix(netip.MustParseAddr("2001:db8:100::1")))
	// Output:
	// 198.18.100.1/32
	// 2001:db8:100::1/128
}
