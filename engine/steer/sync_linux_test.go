//go:build linux

package steer

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mapConfig reads the BPF maps themselves (not the Go mirror) back into a
// Config.
func mapConfig(tb testing.TB, p *Program) Config {
	tb.Helper()
	rules := map[ruleKey]struct{}{}
	var k ruleKey
	var v uint8
	it := p.objs.SteerRules.Iterate()
	for it.Next(&k, &v) {
		rules[k] = struct{}{}
	}
	require.NoError(tb, it.Err())
	infra := map[lpmKey]struct{}{}
	var lk lpmKey
	it = p.objs.SteerInfra.Iterate()
	for it.Next(&lk, &v) {
		infra[lk] = struct{}{}
	}
	require.NoError(tb, it.Err())
	return configOf(rules, infra)
}

func mapClasses(tb testing.TB, p *Program) uint32 {
	tb.Helper()
	var c steerSteerConfig
	require.NoError(tb, p.objs.SteerConfig.Lookup(uint32(0), &c))
	return c.Classes
}

func verdicts(tb testing.TB, p *Program, frames map[string][]byte) map[string]outcome {
	got := map[string]outcome{}
	for name, f := range frames {
		_, d := runFrame(tb, p, f)
		got[name] = outcomeOf(tb, d)
	}
	return got
}

// TestSyncLive: the same loaded program, re-synced between runs, changes
// its verdicts; the maps hold exactly the desired set each time.
func TestSyncLive(t *testing.T) {
	p := loadOrSkip(t, Options{})
	frames := map[string][]byte{
		"web":    tcp(client4, vipPort4, 40000, 80).frame(t),
		"alt":    tcp(client4, vipPort4, 40000, 8443).frame(t),
		"dip":    tcp(dipAny4, client4, 80, 40000).frame(t),
		"probe":  tcp(dipAny4, prober4, 80, 40000).frame(t),
		"vxlan6": vxlanFrame(t, client6, hostVX6, 4789),
	}
	steps := []struct {
		cfg  Config
		want map[string]outcome
	}{
		{Config{Dst: []DstRule{{vipPort4, ProtoTCP, 80}}},
			map[string]outcome{"web": outDst, "alt": outNoMatch, "dip": outNoMatch, "probe": outNoMatch, "vxlan6": outNoMatch}},
		{Config{
			Dst:   []DstRule{{vipPort4, ProtoTCP, 8443}},
			Src:   []SrcRule{{Addr: dipAny4}},
			VXLAN: []VXLANRule{{Local: hostVX6}},
		}, map[string]outcome{"web": outNoMatch, "alt": outDst, "dip": outSrc, "probe": outSrc, "vxlan6": outVXLAN}},
		{Config{
			Dst:   []DstRule{{vipPort4, ProtoTCP, 8443}, {vipPort4, ProtoTCP, 80}},
			Src:   []SrcRule{{Addr: dipAny4}},
			Infra: []netip.Prefix{netip.MustParsePrefix("198.18.3.0/24")},
		}, map[string]outcome{"web": outDst, "alt": outDst, "dip": outSrc, "probe": outInfra, "vxlan6": outNoMatch}},
		{Config{}, map[string]outcome{"web": outNoMatch, "alt": outNoMatch, "dip": outNoMatch, "probe": outNoMatch, "vxlan6": outNoMatch}},
	}
	for i, s := range steps {
		require.NoError(t, p.Sync(s.cfg), "step %d", i)
		assert.Equal(t, s.cfg.Normalize(), p.Config(), "step %d: mirror", i)
		assert.Equal(t, s.cfg.Normalize(), mapConfig(t, p), "step %d: maps", i)
		r, inf, _ := s.cfg.compile()
		cc := countsOf(r, inf)
		assert.Equal(t, cc.mask(), mapClasses(t, p), "step %d: classes", i)
		assert.Equal(t, s.want, verdicts(t, p, frames), "step %d", i)
	}
}

// TestSyncTurnsOverFullMap: Sync deletes stale entries before adding new
// ones, so a full map turns over to a different full set; a set too big or
// invalid is refused before anything changes.
func TestSyncTurnsOverFullMap(t *testing.T) {
	p := loadOrSkip(t, Options{MaxRules: 3, MaxInfraPrefixes: 1})
	a := Config{Dst: []DstRule{{Addr: vipAny4}, {Addr: vipAny6}, {Addr: vipUDP4, Proto: ProtoUDP}}}
	b := Config{Dst: []DstRule{{Addr: vipAny4}}, Src: []SrcRule{{Addr: dipAny4}, {Addr: dipAny6, Port: 1}}}
	require.NoError(t, p.Sync(a))
	require.NoError(t, p.Sync(b))
	assert.Equal(t, b.Normalize(), mapConfig(t, p))

	// Too big for the map: refused before anything changes.
	c := b
	c.Dst = append(c.Dst, DstRule{Addr: vipPort4})
	require.ErrorIs(t, p.Sync(c), ErrMapFull)
	require.ErrorIs(t, p.Sync(Config{Infra: []netip.Prefix{
		netip.MustParsePrefix("198.18.3.0/24"), netip.MustParsePrefix("198.18.4.0/24")}}), ErrMapFull)
	assert.Equal(t, b.Normalize(), mapConfig(t, p))
	require.ErrorIs(t, p.SteerDst(vipPort4, 0, 0), ErrMapFull)

	// Invalid: refused whole.
	require.ErrorIs(t, p.Sync(Config{Dst: []DstRule{{Addr: vipAny4}, {Addr: vipPort4, Port: 80}}}), ErrInvalidRule)
	assert.Equal(t, b.Normalize(), mapConfig(t, p))
}

// TestSyncUndoesAFailure: a Sync the kernel refuses midway puts the
// running set back, in the maps themselves and in the lookup classes, so a
// node refusing a version keeps steering the one it runs. The fault is
// the kernel's own: a key written behind the Program's back makes its
// create-only update fail with EEXIST. Each step of the failed Sync
// (deleting the running set's stale rules, adding new ones, in map order)
// may or may not have run before the failing one: several rounds.
func TestSyncUndoesAFailure(t *testing.T) {
	p := loadOrSkip(t, Options{})
	running := Config{
		Dst:   []DstRule{{Addr: vipPort4, Proto: ProtoTCP, Port: 80}, {Addr: vipAny4}},
		Infra: []netip.Prefix{netip.MustParsePrefix("198.18.3.0/24")},
	}
	blocked := DstRule{Addr: vipUDP4, Proto: ProtoUDP}
	next := Config{
		Dst:   []DstRule{{Addr: vipAny4}, blocked, {Addr: vipAny6}, {Addr: vipPort6, Proto: ProtoTCP, Port: 443}},
		Src:   []SrcRule{{Addr: dipAny4}},
		VXLAN: []VXLANRule{{Local: hostVX4}},
		Infra: []netip.Prefix{netip.MustParsePrefix("2001:db8:3::/48")},
	}
	bk, err := blocked.key()
	require.NoError(t, err)
	require.NoError(t, p.Sync(running))
	r, inf, err := running.compile()
	require.NoError(t, err)
	classes := countsOf(r, inf)
	for round := range 8 {
		require.NoError(t, p.objs.SteerRules.Update(&bk, uint8(1), ebpf.UpdateNoExist), "round %d", round)
		require.Error(t, p.Sync(next), "round %d: the kernel refuses the blocked key", round)
		require.NoError(t, p.objs.SteerRules.Delete(&bk), "round %d", round)
		assert.Equal(t, running.Normalize(), p.Config(), "round %d: mirror", round)
		assert.Equal(t, running.Normalize(), mapConfig(t, p), "round %d: maps", round)
		assert.Equal(t, classes.mask(), mapClasses(t, p), "round %d: classes", round)
	}
	require.NoError(t, p.Sync(next), "the same set, once the kernel takes it")
	assert.Equal(t, next.Normalize(), mapConfig(t, p))
}

func TestIncremental(t *testing.T) {
	p := loadOrSkip(t, Options{})
	web := tcp(client4, vipPort4, 40000, 80).frame(t)
	vx := vxlanFrame(t, client4, hostVX4, 4789)
	from := tcp(dipPort6, client6, 8080, 40000).frame(t)
	probe := tcp(dipPort6, prober6, 8080, 40000).frame(t)
	run := func() []outcome {
		var out []outcome
		for _, f := range [][]byte{web, vx, from, probe} {
			_, d := runFrame(t, p, f)
			out = append(out, outcomeOf(t, d))
		}
		return out
	}
	infra := netip.MustParsePrefix("2001:db8:3::/48")

	require.NoError(t, p.SteerDst(vipPort4, ProtoTCP, 80))
	require.NoError(t, p.SteerDst(vipPort4, ProtoTCP, 80), "idempotent")
	require.NoError(t, p.SteerVXLAN(hostVX4, 0))
	require.NoError(t, p.SteerSrc(dipPort6, 8080))
	assert.Equal(t, []outcome{outDst, outVXLAN, outSrc, outSrc}, run())
	assert.Equal(t, uint32(classDstPort|classVXLAN|classSrcPort), mapClasses(t, p))

	require.NoError(t, p.AddInfraPrefix(infra))
	assert.Equal(t, []outcome{outDst, outVXLAN, outSrc, outInfra}, run())

	require.NoError(t, p.UnsteerDst(vipPort4, ProtoTCP, 80))
	require.NoError(t, p.UnsteerDst(vipPort4, ProtoTCP, 80), "absent")
	require.NoError(t, p.UnsteerVXLAN(hostVX4, DefaultVXLANPort))
	require.NoError(t, p.RemoveInfraPrefix(infra))
	assert.Equal(t, []outcome{outNoMatch, outNoMatch, outSrc, outSrc}, run())
	require.NoError(t, p.UnsteerSrc(dipPort6, 8080))
	assert.Equal(t, []outcome{outNoMatch, outNoMatch, outNoMatch, outNoMatch}, run())
	assert.Equal(t, uint32(0), mapClasses(t, p))
	assert.Equal(t, Config{}, mapConfig(t, p))

	require.ErrorIs(t, p.SteerDst(netip.Addr{}, 0, 0), ErrInvalidRule)
	require.ErrorIs(t, p.SteerDst(vipAny4, 1, 80), ErrInvalidRule)
	require.ErrorIs(t, p.AddInfraPrefix(netip.Prefix{}), ErrInvalidRule)
}

// TestClassesSkipLookups: the classes word gates lookups. With the word
// cleared behind the Program's back, an existing entry is not consulted.
func TestClassesSkipLookups(t *testing.T) {
	p := loadOrSkip(t, Options{})
	require.NoError(t, p.SteerDst(vipAny4, 0, 0))
	f := icmp(client4, vipAny4).frame(t)
	_, d := runFrame(t, p, f)
	require.Equal(t, outDst, outcomeOf(t, d))
	require.NoError(t, p.objs.SteerConfig.Update(uint32(0), steerSteerConfig{}, ebpf.UpdateAny))
	_, d = runFrame(t, p, f)
	require.Equal(t, outNoMatch, outcomeOf(t, d))
}

func TestClosed(t *testing.T) {
	p := loadOrSkip(t, Options{})
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "idempotent")
	require.ErrorIs(t, p.SteerDst(vipAny4, 0, 0), ErrClosed)
	require.ErrorIs(t, p.Sync(Config{}), ErrClosed)
	require.ErrorIs(t, p.RegisterSocket(0, 0), ErrClosed)
	require.ErrorIs(t, p.Attach(1, AttachAuto), ErrClosed)
	_, err := p.Stats()
	require.ErrorIs(t, err, ErrClosed)
}

// TestSteerAll: with SetSteerAll every frame — ARP, non-VIP traffic,
// malformed frames — goes to the socket; turning it off restores the rules.
func TestSteerAll(t *testing.T) {
	p := loadOrSkip(t, Options{})
	require.NoError(t, p.RegisterSocket(0, xskFD(t)))
	require.NoError(t, p.SteerDst(vipPort4, 6, 80))
	frames := [][]byte{
		arpFrame(t, false),
		tcp(client4, prober4, 1, 2).frame(t),
		tcp(client4, vipPort4, 40000, 80).frame(t),
		make([]byte, 14), // no EtherType the rules know
	}
	require.NoError(t, p.SetSteerAll(true))
	for i, f := range frames {
		ret, d := runFrame(t, p, f)
		assert.Equal(t, uint32(xdpRedirect), ret, "frame %d", i)
		assert.Equal(t, Stats{Redirected: 1, MatchedAll: 1}, d, "frame %d", i)
	}
	require.NoError(t, p.SetSteerAll(false))
	ret, _ := runFrame(t, p, frames[0])
	assert.Equal(t, uint32(xdpPass), ret, "ARP passes again")
	ret, _ = runFrame(t, p, frames[2])
	assert.Equal(t, uint32(xdpRedirect), ret, "the VIP rule still holds")
	assert.Equal(t, uint32(classDstPort), mapClasses(t, p))
}

// TestSyncVetoesBeforeRules: a source rule does not steer what its new
// prefixes veto after a Sync that failed midway. Here the kernel refuses
// the prefix (its trie is full behind the Program's back, as an
// allocation failure of the unpreallocated trie would refuse it): the
// Sync fails and the DIP's traffic to the prober still reaches the
// kernel. Sync adds prefixes before rules, so the rule is never in the
// map without its veto even for a moment, and the undo of a failure
// (TestSyncUndoesAFailure) takes the rule out if it was; this test sees
// the outcome, not which of the two gave it.
func TestSyncVetoesBeforeRules(t *testing.T) {
	p := loadOrSkip(t, Options{MaxInfraPrefixes: 1})
	dip := tcp(dipAny4, client4, 80, 40000).frame(t)
	probe := tcp(dipAny4, prober4, 80, 40000).frame(t)
	cfg := Config{
		Src:   []SrcRule{{Addr: dipAny4}},
		Infra: []netip.Prefix{netip.MustParsePrefix("198.18.3.0/24")},
	}
	other, err := infraKey(netip.MustParsePrefix("2001:db8:9::/48"))
	require.NoError(t, err)
	require.NoError(t, p.objs.SteerInfra.Update(&other, uint8(1), ebpf.UpdateNoExist))

	require.Error(t, p.Sync(cfg))
	_, d := runFrame(t, p, probe)
	assert.NotEqual(t, outSrc, outcomeOf(t, d), "steered to the data path although the prober's prefix vetoes it")

	require.NoError(t, p.objs.SteerInfra.Delete(&other))
	require.NoError(t, p.Sync(cfg), "converges once the kernel takes the prefix")
	_, d = runFrame(t, p, probe)
	assert.Equal(t, outInfra, outcomeOf(t, d))
	_, d = runFrame(t, p, dip)
	assert.Equal(t, outSrc, outcomeOf(t, d))
}
