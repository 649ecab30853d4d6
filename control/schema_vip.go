package control

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/health"
)

func (d *decoder) vip(o *object) (VIP, vipMeta) {
	path := o.path
	v := VIP{}
	m := vipMeta{path: path, node: o.n}
	if n := d.get(o, "name"); n != nil {
		m.nameN = n
		v.Name, m.nameOK = d.name(n, path+".name", nameMax, true)
	} else {
		d.missing(o, "name", "a unique name, e.g. web")
	}
	addrOK, protoOK, portOK, vniOK := false, false, true, true
	if n := d.get(o, "address"); n != nil {
		m.addrN = n
		v.Address, addrOK = d.addr(n, path+".address", wantAddr, 0, false)
	} else {
		d.missing(o, "address", "the VIP's "+addrWords)
	}
	if n := d.get(o, "protocol"); n != nil {
		if s, ok := d.str(n, path+".protocol", "tcp or udp"); ok {
			switch s {
			case "tcp":
				v.Protocol, protoOK = flow.ProtoTCP, true
			case "udp":
				v.Protocol, protoOK = flow.ProtoUDP, true
			default:
				d.errorf(n, path+".protocol", "%q is not a protocol (want tcp or udp)", s)
			}
		}
	} else {
		d.missing(o, "protocol", "tcp or udp")
	}
	if n := d.get(o, "port"); n != nil {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && n.Value == "all" {
			v.Port = 0
		} else {
			p, ok := d.uint(n, path+".port", 0, math.MaxUint16, wantVIPPort)
			v.Port, portOK = uint16(p), ok
		}
	} else {
		d.missing(o, "port", wantVIPPort)
		portOK = false
	}
	if n := d.get(o, "vni"); n != nil {
		x, ok := d.uint(n, path+".vni", 0, MaxVNI, wantVNI)
		v.VNI, vniOK = uint32(x), ok
	}
	m.keyOK = addrOK && protoOK && portOK && vniOK
	if n := d.get(o, "distribution"); n != nil {
		if s, ok := d.str(n, path+".distribution", "5-tuple, 3-tuple or 2-tuple"); ok {
			mode, err := flow.ParseTupleMode(s)
			if err != nil {
				d.errorf(n, path+".distribution", "%q is not a distribution (want 5-tuple, 3-tuple or 2-tuple)", s)
			}
			v.Distribution = mode
		}
	}
	sizeN := d.get(o, "table_size")
	if sizeN != nil {
		const want = "a prime up to 16777213, at least the number of backends; 0 means sized by the pool"
		if x, ok := d.uint(sizeN, path+".table_size", 0, flow.MaglevMaxSize, want); ok {
			if x != 0 && !isPrime(x) {
				lo, hi := primesAround(x)
				if lo == 0 {
					d.errorf(sizeN, path+".table_size", "%d is not prime (Maglev needs a prime size; the smallest is %d)", x, hi)
				} else {
					d.errorf(sizeN, path+".table_size", "%d is not prime (Maglev needs a prime size; the nearest are %d and %d)", x, lo, hi)
				}
			} else {
				v.TableSize = uint32(x)
			}
		}
	}
	if n := d.get(o, "probe"); n != nil {
		v.Probe = d.probe(n, path+".probe")
	}
	names := map[string]site{}
	dips := map[netip.AddrPort]site{}
	for j, bn := range d.list(o.val("backends"), path+".backends", "backends") {
		bp := index(path+".backends", j)
		bo := d.object(bn, bp, backendKeys)
		if bo == nil {
			if d.over {
				break
			}
			if r := d.deref(bn); isNull(r) {
				d.errorf(bn, bp, "empty backend (want a mapping of %s)", keyList(backendKeys))
			}
			continue
		}
		b, bm, nameN := d.backend(bo)
		if addrOK && bm.addrOK && b.Address.Is4() != v.Address.Is4() {
			d.errorf(bm.node, bp+".address", "%v is %s but the VIP %v is %s: a DIP must have the VIP's family, since DSR NAT rewrites the destination in place (the host address may be of either family)",
				b.Address, family(b.Address), v.Address, family(v.Address))
			bm.addrOK = false
		}
		if b.Name != "" {
			if first, dup := names[b.Name]; dup {
				d.errorf(at(nameN, bo.n), bp+".name", "backend name %q is used twice in this VIP (first at %v)", b.Name, first)
			} else {
				names[b.Name] = site{bp, bo.n}
			}
		}
		if bm.addrOK {
			ap := netip.AddrPortFrom(b.Address, b.Port)
			if first, dup := dips[ap]; dup {
				d.errorf(bm.node, bp, "backend %v is listed twice in this VIP (first at %v)", ap, first)
			} else {
				dips[ap] = site{bp, bo.n}
			}
		}
		v.Backends = append(v.Backends, b)
		m.backends = append(m.backends, bm)
	}
	size := uint64(v.TableSize)
	if size == 0 {
		size = uint64(flow.MaglevAutoSize(len(v.Backends), 0))
	}
	if uint64(len(v.Backends)) > size {
		d.errorf(at(sizeN, o.n), path+".table_size", "%d backends do not fit a Maglev table of %d slots (want a larger prime)", len(v.Backends), size)
	}
	if v.Probe != nil && v.Probe.Port == 0 && portOK && v.Port == 0 {
		for j := range v.Backends {
			if v.Backends[j].Port == 0 {
				d.errorf(at(o.val("probe"), o.n), path+".probe.port", "missing: the VIP serves every port and backend %q has port 0, so there is no port to probe (want %s)", v.Backends[j].Name, wantPort)
				break
			}
		}
	}
	return v, m
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func (d *decoder) backend(o *object) (Backend, backendMeta, *yaml.Node) {
	path := o.path
	b := Backend{Weight: DefaultWeight}
	m := backendMeta{path: path, item: o.n, node: o.n}
	if n := d.get(o, "address"); n != nil {
		m.node = n
		b.Address, m.addrOK = d.addr(n, path+".address", "the DIP's "+addrWords, 0, false)
	} else {
		d.missing(o, "address", "the DIP's "+addrWords)
	}
	portOK := true
	if n := d.get(o, "port"); n != nil {
		p, ok := d.uint(n, path+".port", 0, math.MaxUint16, wantBEPort)
		b.Port, portOK = uint16(p), ok
	}
	m.addrOK = m.addrOK && portOK
	nameN := d.get(o, "name")
	if nameN != nil {
		b.Name, _ = d.name(nameN, path+".name", longNameMax, false)
	} else if m.addrOK {
		b.Name = netip.AddrPortFrom(b.Address, b.Port).String()
	}
	if n := d.get(o, "mac"); n != nil {
		m.mac = n
		b.MAC, m.macOK = d.mac(n, path+".mac")
	} else {
		d.missing(o, "mac", `the DIP's MAC address, e.g. "02:00:00:00:01:01"`)
	}
	if n := d.get(o, "host"); n != nil {
		m.host = n
		b.Host, m.hOK = d.addr(n, path+".host", "the physical address of the DIP's host (VXLAN destination)", 0, false)
	} else {
		d.missing(o, "host", "the physical address of the DIP's host (VXLAN destination)")
	}
	if n := d.get(o, "weight"); n != nil {
		w, _ := d.uint(n, path+".weight", 0, MaxWeight, "0..65535; 0 drains")
		b.Weight = uint32(w)
	}
	if n := d.get(o, "state"); n != nil {
		if s, ok := d.str(n, path+".state", "active or draining"); ok {
			switch s {
			case "active":
				b.State = flow.BackendActive
			case "draining":
				b.State = flow.BackendDraining
			case "down":
				d.errorf(n, path+".state", `"down" is for health checks to decide (want active or draining; draining takes the backend out of new flows)`)
			default:
				d.errorf(n, path+".state", "%q is not a state (want active or draining)", s)
			}
		}
	}
	return b, m, nameN
}

func (d *decoder) probe(n *yaml.Node, path string) *health.Spec {
	o := d.object(n, path, probeKeys)
	if o == nil {
		return nil
	}
	var s health.Spec
	before := len(d.errs) + d.more
	if n := d.get(o, "type"); n != nil {
		if t, ok := d.str(n, path+".type", "tcp or http"); ok {
			pt, err := health.ParseProbeType(t)
			if err != nil {
				d.errorf(n, path+".type", "%q is not a probe type (want tcp or http)", t)
			}
			s.Type = pt
		}
	} else {
		d.missing(o, "type", "tcp or http")
	}
	if n := d.get(o, "port"); n != nil {
		p, _ := d.uint(n, path+".port", 0, math.MaxUint16, "1..65535; 0 or absent means the backend's port")
		s.Port = uint16(p)
	}
	if n := d.get(o, "path"); n != nil {
		s.Path, _ = d.str(n, path+".path", "an HTTP path starting with /, e.g. /healthz")
	}
	if n := d.get(o, "method"); n != nil {
		s.Method, _ = d.str(n, path+".method", "an HTTP method such as GET or HEAD")
	}
	if n := d.get(o, "host"); n != nil {
		s.Host, _ = d.str(n, path+".host", "an HTTP Host header value")
	}
	if n := d.get(o, "expect_status"); n != nil {
		st, _ := d.uint(n, path+".expect_status", 1, 999, "an HTTP status code such as 200")
		s.ExpectStatus = int(st)
	}
	// Explicit zeros are refused: a zero field means "default" to
	// WithDefaults, which would hide the mistake.
	if n := d.get(o, "interval"); n != nil {
		s.Interval, _ = d.duration(n, path+".interval", time.Nanosecond, time.Hour)
	}
	if n := d.get(o, "timeout"); n != nil {
		s.Timeout, _ = d.duration(n, path+".timeout", time.Nanosecond, health.MaxTimeout)
	}
	thresholds := thresholdRange
	if n := d.get(o, "rise"); n != nil {
		r, _ := d.uint(n, path+".rise", 1, health.MaxThreshold, thresholds+" consecutive successes")
		s.Rise = int(r)
	}
	if n := d.get(o, "fall"); n != nil {
		f, _ := d.uint(n, path+".fall", 1, health.MaxThreshold, thresholds+" consecutive failures")
		s.Fall = int(f)
	}
	if len(d.errs)+d.more != before {
		return &s
	}
	s = s.WithDefaults()
	// health.Spec.Validate owns the rules; its errors name the field by
	// its key, which places them in the file.
	var errs []error
	if err := s.Validate(); err != nil {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		} else {
			errs = []error{err}
		}
	}
	prefix := health.ErrInvalidSpec.Error() + ": "
	for _, e := range errs {
		msg := strings.TrimPrefix(e.Error(), prefix)
		field, _, _ := strings.Cut(msg, " ")
		if slices.Contains(probeKeys, field) {
			d.errorf(at(d.get(o, field), o.n), path+"."+field, "%s", msg)
		} else {
			d.errorf(o.n, path, "%s", msg)
		}
	}
	return &s
}

// thresholdRange is what a rise or fall may be, in problems' words.
var thresholdRange = "1.." + strconv.Itoa(health.MaxThreshold)
