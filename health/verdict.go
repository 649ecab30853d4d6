package health

import (
	"fmt"
	"net/netip"
	"time"
)

// Verdict is one probed DIP's health as the host that probed it sees it:
// what a Host Agent reports (hostagent.DIPHealth, Config.OnDIPHealth) and
// what a Mux that does not probe applies (mux.Mux.SetDIPHealth). A DIP is
// named by its tenant network, so two tenants' DIPs with the same address
// stay apart. It is a plain value, encoded as JSON with the tags below
// (Addr as text, Since as RFC 3339).
type Verdict struct {
	// VNI is the DIP's tenant network.
	VNI uint32 `json:"vni"`
	// Addr is the DIP.
	Addr netip.Addr `json:"addr"`
	// Port is the port probed.
	Port uint16 `json:"port"`
	// Up says whether the DIP may take new flows. A DIP not probed yet
	// is not Up.
	Up bool `json:"up"`
	// Since is when the verdict last changed (for a DIP not probed yet:
	// when probing it began).
	Since time.Time `json:"since"`
	// Reason is the last failure ("" when Up).
	Reason string `json:"reason,omitempty"`
}

// VerdictKey names the DIP a Verdict is about: (VNI, address, probed
// port). It is comparable.
type VerdictKey struct {
	VNI  uint32
	Addr netip.Addr
	Port uint16
}

// Key returns the DIP v is about.
func (v Verdict) Key() VerdictKey { return VerdictKey{VNI: v.VNI, Addr: v.Addr, Port: v.Port} }

// String returns "vni 100 198.18.31.1:8080".
func (k VerdictKey) String() string {
	return fmt.Sprintf("vni %d %v", k.VNI, netip.AddrPortFrom(k.Addr, k.Port))
}

// String returns e.g. "vni 100 198.18.31.1:8080 down since 2026-11-30T10:00:00Z: connection refused".
func (v Verdict) String() string {
	s := v.Key().String()
	if v.Up {
		s += " up"
	} else {
		s += " down"
	}
	s += " since " + v.Since.UTC().Format(time.RFC3339)
	if v.Reason != "" {
		s += ": " + v.Reason
	}
	return s
}
