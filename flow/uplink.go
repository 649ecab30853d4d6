package flow

import "encoding/binary"

// buildUplink builds the uplink index (s.uplink) when every VIP address
// is in one VNI: then (address, protocol, port) names at most one rule.
func (s *Snapshot) buildUplink() {
	for i := range s.anyVIP {
		if s.anyVIP[i].multi {
			return
		}
	}
	s.uplink = make([]vipSlot, len(s.index))
	for _, r := range s.rules {
		a0, a1, meta := r.k0, r.k1, r.kmeta&^(uint64(1<<24-1)<<32) // without the VNI
		for i := vipHash(a0, a1, meta) & s.mask; ; i = (i + 1) & s.mask {
			if e := &s.uplink[i]; e.rule == nil {
				*e = vipSlot{a0: a0, a1: a1, meta: meta, rule: r}
				break
			}
		}
	}
}

// LookupUplink is Lookup for a packet whose VNI is not known — a Mux's
// uplink carries none — and is taken to be its VIP's: the rule whose VIP
// matches k's protocol, destination address and port, else the all-ports
// rule for that protocol and address, whatever k.VNI. It answers only
// when every VIP address of s is in one VNI, so that the match is unique;
// otherwise, and when no rule matches, it returns nil (find the VNI with
// VIPAddrVNI, then Lookup). One probe finds the rule and with it the VNI
// (Rule.VIP.VNI). It does not allocate.
func (s *Snapshot) LookupUplink(k *Key) *Rule {
	if s.uplink == nil {
		return nil
	}
	return s.lookupIn(s.uplink, k, 0)
}

// LookupHint is Lookup(k) for a caller that may already hold the answer:
// when hint is a rule of s whose VIP is exactly k's (VNI, protocol,
// destination address and port), it is the rule Lookup finds (VIPs are
// unique, and the exact port comes before an all-ports rule), and is
// returned after three comparisons instead of a probe; any other hint
// (nil, another snapshot's rule, an all-ports rule, another VIP) costs
// the comparisons and then Lookup. It does not allocate.
func (s *Snapshot) LookupHint(k *Key, hint *Rule) *Rule {
	if hint != nil && uint64(hint.ID) < uint64(len(s.rules)) && s.rules[hint.ID] == hint &&
		hint.k0 == binary.LittleEndian.Uint64(k.Dst[:8]) && hint.k1 == binary.LittleEndian.Uint64(k.Dst[8:]) &&
		hint.kmeta == vipMeta(k.VNI, k.Proto, k.DstPort, k.Family) {
		return hint
	}
	return s.Lookup(k)
}
