package fleet_test

import (
	"fmt"
	"strings"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/fleet"
)

const fleetDoc = `
version: 4
mux_prefixes: [198.18.0.0/28]
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: vm-a, address: 198.19.1.1, port: 8080, mac: "02:00:00:00:01:01", host: 198.19.0.1}
      - {name: vm-b, address: 198.19.1.2, port: 8080, mac: "02:00:00:00:01:02", host: 198.19.0.2}
  - name: api
    address: 198.18.100.2
    protocol: tcp
    port: 443
    vni: 100
    backends:
      - {name: vm-b, address: 198.19.1.2, port: 8443, mac: "02:00:00:00:01:02", host: 198.19.0.2}
hosts:
  - name: host-1
    address: 198.19.0.1
    vms:
      - {vni: 100, address: 198.19.1.1, mac: "02:00:00:00:01:01", interface: vm-a}
  - name: host-2
    address: 198.19.0.2
    vms:
      - {vni: 100, address: 198.19.1.2, mac: "02:00:00:00:01:02", interface: vm-b}
`

// A Host Agent runs its host's view of the fleet's document: the VIPs
// its own VMs serve, with only those backends, and every VIP's address
// (for its source filters). Apply stores one view per host in etcd.
func ExampleHostView() {
	doc, err := control.Parse([]byte(fleetDoc))
	if err != nil {
		panic(err)
	}
	view, err := fleet.HostView(doc, "host-1")
	if err != nil {
		panic(err)
	}
	for _, v := range view.VIPs {
		var names []string
		for _, b := range v.Backends {
			names = append(names, b.Name)
		}
		fmt.Println("vip", v.Name, "backends", names)
	}
	fmt.Println("hosts", len(view.Hosts), "vip addresses", view.VIPAddresses)
	// Output:
	// vip web backends [vm-a]
	// hosts 1 vip addresses [198.18.100.1 198.18.100.2]
}

// Diff says what applying a document changes, a line each, as xdplbctl
// diff prints it before an apply.
func ExampleDiff() {
	cur, err := control.Parse([]byte(fleetDoc))
	if err != nil {
		panic(err)
	}
	next, err := control.Parse([]byte(strings.Replace(
		strings.Replace(fleetDoc, "version: 4", "version: 5", 1),
		"port: 8443,", "port: 9443,", 1)))
	if err != nil {
		panic(err)
	}
	for _, line := range fleet.Diff(cur, next) {
		fmt.Println(line)
	}
	// Output:
	// version 4 -> 5
	// ~ vip api backend vm-b: 198.19.1.2:8443 on 198.19.0.2 -> 198.19.1.2:9443 on 198.19.0.2
}
