package mux

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/health"
)

// differ sets v (a settable field) to a value different from its own,
// for the kinds control.VIP and control.Backend hold.
func differ(t *testing.T, v reflect.Value, path string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() ^ 1)
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() ^ 1)
	case reflect.Array:
		differ(t, v.Index(0), path+"[0]")
	case reflect.Struct:
		if a, ok := v.Interface().(netip.Addr); ok {
			v.Set(reflect.ValueOf(a.Next()))
			return
		}
		t.Fatalf("%s: no way to change a %v: teach differ", path, v.Type())
	default:
		t.Fatalf("%s: no way to change a %v: teach differ", path, v.Type())
	}
}

// TestVIPEqualCoversEveryField changes each field of a VIP (and of its
// probe and its backends) in turn: vipEqual must tell every change, as
// reflect.DeepEqual does, so a field added to control.VIP, Backend or
// health.Spec without a comparison in vipEqual fails here.
func TestVIPEqualCoversEveryField(t *testing.T) {
	base := func() control.VIP {
		return control.VIP{Name: "web", Address: netip.MustParseAddr("198.18.0.10"), Protocol: 6, Port: 80, VNI: 100,
			Distribution: 1, TableSize: 251, InboundNAT: "nat",
			Probe: &health.Spec{Type: health.ProbeHTTP, Port: 8080, Path: "/", Method: "GET", ExpectStatus: 200, Host: "h",
				Interval: 2, Timeout: 1, Rise: 2, Fall: 3},
			Backends: []control.Backend{{Name: "a", Address: netip.MustParseAddr("198.19.0.1"), Port: 8080,
				MAC: [6]byte{2, 0, 0, 0, 0, 1}, Host: netip.MustParseAddr("198.19.1.1"), Weight: 1, State: 1}}}
	}
	a, b := base(), base()
	require.True(t, vipEqual(&a, &b), "equal VIPs in separate memory")
	n := 0
	check := func(path string, mutate func(v *control.VIP) reflect.Value) {
		t.Run(path, func(t *testing.T) {
			a, b := base(), base()
			differ(t, mutate(&b), path)
			require.False(t, reflect.DeepEqual(a, b), "the change is a change")
			assert.False(t, vipEqual(&a, &b), "vipEqual misses a change of %s", path)
		})
		n++
	}
	vt := reflect.TypeFor[control.VIP]()
	for i := range vt.NumField() {
		f := vt.Field(i)
		switch f.Name {
		case "Probe":
			st := reflect.TypeFor[health.Spec]()
			for k := range st.NumField() {
				check("Probe."+st.Field(k).Name, func(v *control.VIP) reflect.Value { return reflect.ValueOf(v.Probe).Elem().Field(k) })
			}
		case "Backends":
			bt := reflect.TypeFor[control.Backend]()
			for k := range bt.NumField() {
				check("Backends[0]."+bt.Field(k).Name, func(v *control.VIP) reflect.Value { return reflect.ValueOf(&v.Backends[0]).Elem().Field(k) })
			}
		default:
			check(f.Name, func(v *control.VIP) reflect.Value { return reflect.ValueOf(v).Elem().Field(i) })
		}
	}
	t.Run("probe removed", func(t *testing.T) {
		a, b := base(), base()
		b.Probe = nil
		assert.False(t, vipEqual(&a, &b))
		assert.False(t, vipEqual(&b, &a))
	})
	t.Run("backend added", func(t *testing.T) {
		a, b := base(), base()
		b.Backends = append(b.Backends, b.Backends[0])
		assert.False(t, vipEqual(&a, &b))
	})
	t.Logf("%d field changes checked", n)
}
