package netlab

import (
	"errors"
	"fmt"
	"net/netip"
)

// ErrOutsideTestRange is returned (wrapped) by every method that would
// configure an address or route outside TestRanges.
var ErrOutsideTestRange = errors.New("netlab: address outside the test ranges 198.18.0.0/15 and 2001:db8::/32")

// TestRanges are the only prefixes a lab may use: the RFC 2544 benchmarking
// range and the RFC 3849 documentation range.
var TestRanges = [...]netip.Prefix{
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// CheckAddr reports whether a is inside TestRanges. It returns nil when it
// is and an error wrapping ErrOutsideTestRange otherwise.
func CheckAddr(a netip.Addr) error {
	a = a.Unmap()
	for _, r := range TestRanges {
		if r.Contains(a) {
			return nil
		}
	}
	return fmt.Errorf("%w: %v", ErrOutsideTestRange, a)
}

// CheckPrefix reports whether the whole of p lies inside TestRanges: the
// address and every address the prefix covers. 198.18.0.1/24 passes,
// 198.18.0.1/8 does not (its subnet covers real networks).
func CheckPrefix(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("%w: invalid prefix", ErrOutsideTestRange)
	}
	m := p.Masked()
	for _, r := range TestRanges {
		if r.Bits() <= m.Bits() && r.Contains(m.Addr()) {
			return nil
		}
	}
	return fmt.Errorf("%w: %v", ErrOutsideTestRange, p)
}

// parseTestPrefix parses s as a prefix ("198.18.0.1/24"); a bare address is
// taken as a host prefix (/32 or /128). The result must pass CheckPrefix.
func parseTestPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil {
			return netip.Prefix{}, fmt.Errorf("netlab: %q is neither a prefix nor an address", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if err := CheckPrefix(p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// parseTestAddr parses s as an address that must pass CheckAddr.
func parseTestAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("netlab: %q is not an address: %w", s, err)
	}
	if err := CheckAddr(a); err != nil {
		return netip.Addr{}, err
	}
	return a, nil
}
