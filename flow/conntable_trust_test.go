package flow

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConnTableNext: the trust rule. An untrusted flow is proven only by a
// packet that is neither a SYN nor a FIN/RST arriving ProveAfter or more
// after its entry was stored; proven flows move as Advance says.
func TestConnTableNext(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 64, ProveAfter: 200 * time.Millisecond})
	require.Equal(t, Tick(200), ct.ProveAfter())
	U, E, C, D := ClassUntrusted, ClassEstablished, ClassClosing, ClassUDP
	cases := []struct {
		cur, seen StateClass
		age       Tick
		want      StateClass
	}{
		{U, E, 0, U},     // an ACK right after the SYN (or an ACK pair)
		{U, E, 199, U},   // just too soon
		{U, E, 200, E},   // a later segment proves it
		{U, D, 5, U},     // a burst of datagrams
		{U, D, 1000, D},  // a datagram a second later
		{U, U, 5000, U},  // a SYN retransmission proves nothing
		{U, C, 5000, U},  // nor does a FIN or RST
		{E, U, 0, E},     // a SYN never demotes a proven flow
		{E, C, 0, C},     // FIN or RST
		{C, E, 0, C},     // stragglers after the FIN
		{C, U, 0, U},     // the tuple reused: starts over
		{D, D, 0, D},     // UDP stays UDP
		{D, C, 0, C},     // (an ICMP error's class suggestion)
		{E, E, 10000, E}, // age plays no part once proven
	}
	for _, c := range cases {
		assert.Equal(t, c.want, ct.Next(c.cur, c.seen, c.age), "Next(%v, %v, %d)", c.cur, c.seen, c.age)
	}
}

// TestConnTableUntrustedNotRefreshed: lookups do not extend an untrusted
// entry's life, and LookupPreparedAge reports its age since it was stored.
func TestConnTableUntrustedNotRefreshed(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 64, Timeouts: Timeouts{Untrusted: time.Second}})
	k := ctKey4(7)
	require.Equal(t, InsertNew, ct.Insert(&k, 3, ClassUntrusted, 100))
	var q ConnQuery
	for now := Tick(100); now <= 1100; now += 50 {
		ct.Prepare(&q, &k)
		_, cls, age, ok := ct.LookupPreparedAge(&q, now)
		require.True(t, ok, "at %d", now)
		require.Equal(t, ClassUntrusted, cls)
		require.Equal(t, now-100, age)
	}
	ct.Prepare(&q, &k)
	_, _, _, ok := ct.LookupPreparedAge(&q, 1101)
	require.False(t, ok, "an untrusted entry outlived its timeout because lookups refreshed it")
}

// TestConnTableProvenCount: Stats.Proven follows every way an entry comes
// and goes (insert, update, class change, delete, expiry, reuse of an
// expired slot), checked against the entries themselves after random
// operations.
func TestConnTableProvenCount(t *testing.T) {
	for _, fam := range []int{4, 6} {
		ct := newCT(t, ConnTableConfig{Capacity: 256, IPv6Capacity: 256,
			Timeouts: Timeouts{Untrusted: time.Second, Established: 3 * time.Second, Closing: time.Second, UDP: 2 * time.Second}})
		rng := rand.New(rand.NewPCG(uint64(fam), 1))
		now := Tick(1)
		for range 20000 {
			k := ctKeyOf(fam, uint32(rng.IntN(600)))
			cls := StateClass(rng.IntN(ctClasses))
			switch rng.IntN(6) {
			case 0, 1:
				ct.Insert(&k, 1, cls, now)
			case 2, 3:
				ct.SetClass(&k, cls, now)
			case 4:
				ct.Delete(&k)
			case 5:
				ct.Age(now, 64)
			}
			now += Tick(rng.IntN(3))
		}
		proven := 0
		ct.Range(func(_ Key, _ uint32, c StateClass, _ Tick) bool {
			if c != ClassUntrusted {
				proven++
			}
			return true
		})
		require.Equal(t, proven, ct.Stats().Proven, "IPv%d", fam)
		ct.Age(now+1e6, ct.Cap())
		require.Zero(t, ct.Stats().Proven, "IPv%d: all aged out", fam)
	}
}

// TestConnTableProvenLimit: promotions stop at ProvenShare × Capacity
// (counted), the refused flows stay untrusted, and a proven entry leaving
// makes room for the next promotion.
func TestConnTableProvenLimit(t *testing.T) {
	ct := newCT(t, ConnTableConfig{Capacity: 100, ProvenShare: 0.1})
	keys := make([]Key, 20)
	for i := range keys {
		keys[i] = ctKey4(uint32(i + 1))
		require.True(t, ct.Insert(&keys[i], 1, ClassUntrusted, 0).Stored())
	}
	for i := range keys {
		require.Equal(t, i < 10, ct.SetClass(&keys[i], ClassEstablished, 1), "promotion %d", i)
	}
	st := ct.Stats()
	assert.Equal(t, 10, st.Proven)
	assert.Equal(t, uint64(10), st.PromoteRefused)
	_, cls, ok := ct.Lookup(&keys[15], 1)
	require.True(t, ok)
	assert.Equal(t, ClassUntrusted, cls, "a refused promotion leaves the flow untrusted")
	// Moving between proven classes is not a promotion.
	require.True(t, ct.SetClass(&keys[0], ClassClosing, 2))
	require.True(t, ct.Delete(&keys[1]))
	require.True(t, ct.SetClass(&keys[15], ClassEstablished, 3), "room after a delete")
	require.False(t, ct.SetClass(&keys[16], ClassEstablished, 3))
	_, err := NewConnTable(ConnTableConfig{Capacity: 10, ProvenShare: 1.5})
	require.ErrorIs(t, err, ErrConnTableConfig)
	_, err = NewConnTable(ConnTableConfig{Capacity: 10, ProveAfter: 10 * time.Second})
	require.ErrorIs(t, err, ErrConnTableConfig)
}
