package control

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTrackerParsesOnlyWhatItMust: a text that is the running
// document's is not parsed again (a node rereads its document after every
// broken watch, and a fleet's document can take a second to parse): from
// a store, the running revision names it; from a file, its SHA-256. A new
// version is applied without being marshalled, and from a store without
// being hashed: the canonical text is made only when a text of the
// running version at another revision, or with other bytes, needs
// comparing. The rules stay: an older revision of the same text is
// refused, a reformatted text is the running version, a changed one a
// conflict.
func TestTrackerParsesOnlyWhatItMust(t *testing.T) {
	type step struct {
		name       string
		text       []byte
		rev        int64 // 0: a file
		applied    bool
		err        error // errors.Is
		parses     int
		marshalled bool // the running document's canonical text was made
		version    uint64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"store", []step{
			{"first version", docV(1, ""), 10, true, nil, 1, false, 1},
			{"read again at its revision", docV(1, ""), 10, false, nil, 0, false, 1},
			{"its text at an older revision", docV(1, ""), 9, false, ErrStaleVersion, 1, false, 1},
			{"its text written again, a later revision", docV(1, ""), 11, false, nil, 1, true, 1},
			{"read again at that revision", docV(1, ""), 11, false, nil, 0, true, 1},
			{"reformatted", append([]byte("# comment\n"), docV(1, "")...), 12, false, nil, 1, true, 1},
			{"changed, same version", docV(1, "hash_seed: 7\n"), 13, false, ErrVersionConflict, 1, true, 1},
			{"a new version", docV(2, ""), 14, true, nil, 1, false, 2},
			{"read again", docV(2, ""), 14, false, nil, 0, false, 2},
		}},
		{"file", []step{
			{"first version", docV(1, ""), 0, true, nil, 1, false, 1},
			{"read again", docV(1, ""), 0, false, nil, 0, false, 1},
			{"reformatted", append([]byte("# comment\n"), docV(1, "")...), 0, false, nil, 1, true, 1},
			{"changed, same version", docV(1, "hash_seed: 7\n"), 0, false, ErrVersionConflict, 1, true, 1},
			{"a new version", docV(2, ""), 0, true, nil, 1, false, 2},
			{"read again", docV(2, ""), 0, false, nil, 0, false, 2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, parses, applied, apply := countingTracker()
			for _, s := range tc.steps {
				*parses = 0
				ok, err := tr.Offer(s.text, Origin{Revision: s.rev}, apply)
				assert.Equal(t, s.applied, ok, s.name)
				if s.err != nil {
					assert.ErrorIs(t, err, s.err, s.name)
				} else {
					require.NoError(t, err, s.name)
					assert.NoError(t, tr.Status().LastError, s.name)
				}
				assert.Equal(t, s.parses, *parses, "%s: parses", s.name)
				assert.Equal(t, s.marshalled, tr.appliedText != nil, "%s: marshalled", s.name)
				assert.Equal(t, s.version, tr.Status().Version, s.name)
			}
			assert.Equal(t, []uint64{1, 2}, *applied)
			assert.Equal(t, tc.name == "file", tr.appliedHashed, "hashed only without a store revision")
			last := tc.steps[len(tc.steps)-1]
			assert.Equal(t, last.rev, tr.Status().Revision)

			// SetParse(nil) is the package's parser again.
			tr.SetParse(nil)
			*parses = 0
			_, err := tr.Offer([]byte("version: 3\nbogus: 1\n"), Origin{Revision: last.rev + 1}, apply)
			assert.True(t, errors.Is(err, ErrInvalid))
			assert.Zero(t, *parses)
		})
	}
}

// BenchmarkTrackerOffer: what a node spends on a new version of a large
// document (10,000 backends in 100 VIPs, ~0.8 MB), and on reading the
// running one again.
func BenchmarkTrackerOffer(b *testing.B) {
	var text []byte
	text = append(text, "version: 1\nvips:\n"...)
	for v := range 100 {
		text = fmt.Appendf(text, "- {name: v%d, address: 198.18.1.%d, protocol: tcp, port: 80, vni: %d, backends: [\n", v, v+1, 1000+v)
		for j := range 100 {
			n := v*100 + j
			text = fmt.Appendf(text, "  {address: 198.19.%d.%d, mac: \"02:00:00:00:%02x:%02x\", host: 198.19.0.%d},\n", 16+n/250, n%250+1, n>>8, n&0xff, j+1)
		}
		text = append(text, "  ]}\n"...)
	}
	apply := func(*Document) error { return nil }
	b.Run("new-version", func(b *testing.B) {
		b.ReportMetric(float64(len(text)), "doc-bytes")
		tr := NewTracker("doc", "etcd", slog.New(slog.DiscardHandler))
		v := 1
		for b.Loop() {
			t := bytes.Replace(text, []byte("version: 1\n"), fmt.Appendf(nil, "version: %d\n", v), 1)
			v++
			if ok, err := tr.Offer(t, Origin{}, apply); !ok {
				b.Fatal(err)
			}
		}
	})
	b.Run("reread", func(b *testing.B) {
		tr := NewTracker("doc", "etcd", slog.New(slog.DiscardHandler))
		if ok, err := tr.Offer(text, Origin{}, apply); !ok {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := tr.Offer(text, Origin{}, apply); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestTrackerAdvance: Advance gives the running document a new version
// without a parse or an apply, and keeps the version monotonic whichever
// way the next version comes: a text of the advanced version or below is
// stale, an origin older than the advanced revision too, and a text above
// it applies.
func TestTrackerAdvance(t *testing.T) {
	type step struct {
		name    string
		advance uint64 // Advance to this version; else Offer text
		text    []byte
		rev     int64
		applied bool
		err     error
		version uint64 // running afterwards
	}
	steps := []step{
		{name: "before any document", advance: 2, rev: 5, err: errNoRunning, version: 0},
		{name: "first version", text: docV(1, ""), rev: 10, applied: true, version: 1},
		{name: "advanced", advance: 3, rev: 12, applied: true, version: 3},
		{name: "the same version again", advance: 3, rev: 12, version: 3},
		{name: "an older version", advance: 2, rev: 13, err: ErrStaleVersion, version: 3},
		{name: "an older revision", advance: 4, rev: 11, err: ErrStaleVersion, version: 3},
		{name: "a text of the advanced version", text: docV(3, "hash_seed: 7\n"), rev: 14, err: ErrVersionConflict, version: 3},
		{name: "a text below it", text: docV(2, ""), rev: 15, err: ErrStaleVersion, version: 3},
		{name: "the first text at an older revision", text: docV(1, ""), rev: 10, err: ErrStaleVersion, version: 3},
		{name: "a newer text", text: docV(4, ""), rev: 16, applied: true, version: 4},
	}
	tr, parses, applied, apply := countingTracker()
	for _, s := range steps {
		var ok bool
		var err error
		if s.advance != 0 {
			before := *parses
			ok, err = tr.Advance(s.advance, Origin{Revision: s.rev})
			assert.Equal(t, before, *parses, "%s: Advance parsed", s.name)
		} else {
			ok, err = tr.Offer(s.text, Origin{Revision: s.rev}, apply)
		}
		assert.Equal(t, s.applied, ok, s.name)
		switch {
		case s.err == errNoRunning:
			assert.Error(t, err, s.name)
		case s.err != nil:
			assert.ErrorIs(t, err, s.err, s.name)
		default:
			assert.NoError(t, err, s.name)
		}
		assert.Equal(t, s.version, tr.Status().Version, s.name)
		if d := tr.Document(); d != nil {
			assert.Equal(t, s.version, d.Version, "%s: Document's version", s.name)
		}
	}
	assert.Equal(t, []uint64{1, 4}, *applied, "Advance calls no apply")
	assert.EqualValues(t, 3, tr.Status().Applied, "applies counted: 1, advanced to 3, 4")
}

// TestTrackerAmend: Amend applies the running document with a new
// version and a change, without a parse: apply sees the change, the
// running document has it and the rest of the running one, the document
// before it is left as it was; it refuses what Advance refuses, and an
// apply that fails leaves the running version and records why.
func TestTrackerAmend(t *testing.T) {
	tr, parses, applied, apply := countingTracker()
	set := func(a string) func(*Document) {
		return func(d *Document) { d.VIPAddresses = []netip.Addr{netip.MustParseAddr(a)} }
	}
	_, err := tr.Amend(2, Origin{Revision: 5}, set("198.18.0.1"), apply)
	assert.Error(t, err, "no running document")
	_, err = tr.Offer(docV(1, ""), Origin{Revision: 10}, apply)
	require.NoError(t, err)
	first := tr.Document()
	before := *parses

	var seen *Document
	ok, err := tr.Amend(3, Origin{Revision: 12}, set("198.18.0.1"), func(d *Document) error { seen = d; return apply(d) })
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, before, *parses, "no parse")
	assert.Same(t, seen, tr.Document(), "what apply saw runs")
	assert.Equal(t, uint64(3), tr.Document().Version)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("198.18.0.1")}, tr.Document().VIPAddresses)
	assert.Equal(t, first.VIPs, tr.Document().VIPs, "the rest is the running document's")
	assert.Equal(t, uint64(1), first.Version, "the document before is left as it was")
	assert.Nil(t, first.VIPAddresses)

	for _, s := range []struct {
		name string
		v    uint64
		rev  int64
		err  error
	}{
		{"the same version", 3, 12, nil},
		{"an older version", 2, 13, ErrStaleVersion},
		{"an older revision", 4, 11, ErrStaleVersion},
	} {
		ok, err := tr.Amend(s.v, Origin{Revision: s.rev}, set("198.18.0.9"), apply)
		assert.False(t, ok, s.name)
		if s.err != nil {
			assert.ErrorIs(t, err, s.err, s.name)
		} else {
			assert.NoError(t, err, s.name)
		}
		assert.Equal(t, uint64(3), tr.Status().Version, s.name)
		assert.Equal(t, "198.18.0.1", tr.Document().VIPAddresses[0].String(), s.name)
	}
	failed := errors.New("the data path refused it")
	ok, err = tr.Amend(4, Origin{Revision: 14}, set("198.18.0.9"), func(*Document) error { return failed })
	assert.False(t, ok)
	assert.ErrorIs(t, err, failed)
	assert.Equal(t, ReasonApply, tr.Status().Reason)
	assert.Equal(t, uint64(3), tr.Document().Version)
	assert.Equal(t, []uint64{1, 3}, *applied)
}

// errNoRunning marks a step whose Advance finds no running document.
var errNoRunning = errors.New("no running document")

// countingTracker returns a Tracker that counts its parses, with an
// apply function that records the versions it applies.
func countingTracker() (tr *Tracker, parses *int, applied *[]uint64, apply func(*Document) error) {
	tr = NewTracker("doc", "etcd", slog.New(slog.DiscardHandler))
	parses, applied = new(int), new([]uint64)
	tr.SetParse(func(name string, data []byte) (*Document, error) {
		*parses++
		return parse(name, data)
	})
	return tr, parses, applied, func(d *Document) error { *applied = append(*applied, d.Version); return nil }
}
