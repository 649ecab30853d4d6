package hostagent_test

import (
	"fmt"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/hostagent"
)

// A Host Agent reads the fleet's document and keeps what concerns its
// host: NewPlan shows what it would run, without privileges (this is what
// `hostagent -check` prints).
func ExampleNewPlan() {
	doc, err := control.Parse([]byte(`version: 4
infra_prefixes: [198.18.1.0/24]   # the Muxes: health probes
vips:
  - name: web
    address: 198.18.100.1
    protocol: tcp
    port: 80
    vni: 100
    backends:
      - {name: vm-a, address: 198.18.4.1, port: 8080, mac: "02:00:00:00:04:01", host: 198.18.3.2}
      - {name: vm-b, address: 198.18.4.2, port: 8080, mac: "02:00:00:00:04:02", host: 198.18.3.2}
hosts:
  - name: host-1
    address: 198.18.3.2
    vms:
      - {vni: 100, address: 198.18.4.1, mac: "02:00:00:00:04:01", interface: vm_a}
      - {vni: 100, address: 198.18.4.2, mac: "02:00:00:00:04:02", interface: vm_b}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	plan, err := hostagent.NewPlan(doc, "host-1", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("uplink steers", plan.Uplink.VXLAN)
	for _, vp := range plan.Ports {
		fmt.Printf("port %d %s (VNI %d) steers %v, except to %v\n", vp.Index, vp.Interface, vp.VNI, vp.Steer.Src, vp.Steer.Infra)
	}
	for _, e := range plan.Endpoints {
		fmt.Printf("VXLAN to VNI %d, MAC %v → port %d\n", e.VNI, e.MAC, e.OutPort)
	}
	// Output:
	// uplink steers [vxlan 198.18.3.2:4789]
	// port 1 vm_a (VNI 100) steers [src 198.18.4.1:8080], except to [198.18.1.0/24 198.18.3.2/32]
	// port 2 vm_b (VNI 100) steers [src 198.18.4.2:8080], except to [198.18.1.0/24 198.18.3.2/32]
	// VXLAN to VNI 100, MAC 02:00:00:00:04:01 → port 1
	// VXLAN to VNI 100, MAC 02:00:00:00:04:02 → port 2
}
