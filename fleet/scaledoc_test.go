package fleet_test

import (
	"fmt"
	"net/netip"
	"strings"
)

// scaleShape is the fleet a scale run simulates.
type scaleShape struct {
	Hosts       int // host agents
	DIPsPerHost int // probed DIPs on each host
	VIPs        int // the DIPs are spread over this many VIPs, one VNI each
	Muxes       int
	// Change makes each version change one backend's weight (DIP
	// version mod dips has weight 2), not only the version: every Mux
	// then parses and applies it, and one host's view changes.
	Change bool
	// AddVIP makes each version v add a VIP (x2 … xv, each with one DIP
	// of another VIP as its backend): a fleet-wide change (every host's
	// client filters must drop the new address), which rewrites the VIP
	// addresses every view shares and one host's view.
	AddVIP bool
}

func (s scaleShape) dips() int { return s.Hosts * s.DIPsPerHost }

func hostName(h int) string { return fmt.Sprintf("h%d", h) }

func hostAddr(h int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte(h / 250), byte(h%250 + 1)})
}

// dipAddr is DIP j's address (198.19.16.0 onwards; unique across the
// fleet, though tenants in different VNIs could share one).
func dipAddr(j int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte(16 + j/250), byte(j%250 + 1)})
}

func dipMAC(j int) string {
	return fmt.Sprintf("02:00:00:%02x:%02x:%02x", j>>16&0xff, j>>8&0xff, j&0xff)
}

// dipVIP is the VIP DIP j serves; DIP j sits on host j/DIPsPerHost, so a
// host's DIPs serve different VIPs.
func (s scaleShape) dipVIP(j int) int { return j % s.VIPs }

func vipName(v int) string { return fmt.Sprintf("v%d", v) }
func vipVNI(v int) uint32  { return uint32(100 + v) }

// scaleDoc is the fleet's document at version: every DIP a backend of
// its VIP (named by its address, the default), probed on 8080, and a VM
// port on its host. Flow style, unquoted MACs and no space after commas
// keep it small: at 10,000 DIPs it is ~1.51 MB, just under etcd's
// default request limit (1.5 MiB, 1,572,864 bytes), which a document must
// fit in.
func scaleDoc(s scaleShape, version uint64) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nmux_prefixes: [198.18.0.0/24]\nvips:\n", version)
	for v := range s.VIPs {
		fmt.Fprintf(&b, "- name: %s\n  address: 198.18.%d.%d\n  protocol: tcp\n  port: 80\n  vni: %d\n  probe: {type: tcp, port: 8080}\n  backends:\n",
			vipName(v), 1+v/250, v%250+1, vipVNI(v))
		for j := v; j < s.dips(); j += s.VIPs {
			weight := ""
			if s.Change && uint64(j) == version%uint64(s.dips()) {
				weight = ",weight: 2"
			}
			fmt.Fprintf(&b, "  - {address: %s,mac: %s,host: %s%s}\n", dipAddr(j), dipMAC(j), hostAddr(j/s.DIPsPerHost), weight)
		}
	}
	if s.AddVIP {
		for k := 2; k <= int(version); k++ {
			j := k % s.dips()
			fmt.Fprintf(&b, "- name: x%d\n  address: 198.18.%d.%d\n  protocol: tcp\n  port: 80\n  vni: %d\n  probe: {type: tcp, port: 8080}\n  backends:\n  - {address: %s,mac: %s,host: %s}\n",
				k, 10+k/250, k%250+1, vipVNI(s.dipVIP(j)), dipAddr(j), dipMAC(j), hostAddr(j/s.DIPsPerHost))
		}
	}
	b.WriteString("hosts:\n")
	for h := range s.Hosts {
		fmt.Fprintf(&b, "- name: %s\n  address: %s\n  vms:\n", hostName(h), hostAddr(h))
		for j := h * s.DIPsPerHost; j < (h+1)*s.DIPsPerHost; j++ {
			fmt.Fprintf(&b, "  - {vni: %d,address: %s,mac: %s,interface: vm%d}\n", vipVNI(s.dipVIP(j)), dipAddr(j), dipMAC(j), j-h*s.DIPsPerHost)
		}
	}
	return []byte(b.String())
}
