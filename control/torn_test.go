package control

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock makes timers that fire only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	timers []*fakeTimer
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
	at time.Duration
	on bool
}

func (c *fakeClock) NewTimer() timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	return t
}

// Advance moves the clock on by d and fires the timers due; it returns
// how many fired.
func (c *fakeClock) Advance(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now += d
	fired := 0
	for _, t := range c.timers {
		if t.on && t.at <= c.now {
			t.on = false
			fired++
			select {
			case t.ch <- time.Time{}:
			default:
			}
		}
	}
	return fired
}

// armed returns how many timers are running.
func (c *fakeClock) armed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.on {
			n++
		}
	}
	return n
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drain()
	t.at, t.on = t.c.now+d, true
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drain()
	t.on = false
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

// docApplier records every document applied, marshalled.
type docApplier struct {
	mu      sync.Mutex
	applied [][]byte
	fail    error
}

func (a *docApplier) apply(d *Document) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	b, err := d.Marshal()
	if err != nil {
		return err
	}
	a.applied = append(a.applied, b)
	return nil
}

func (a *docApplier) setFail(err error) {
	a.mu.Lock()
	a.fail = err
	a.mu.Unlock()
}

func (a *docApplier) docs() [][]byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]byte(nil), a.applied...)
}

// lines splits data after every newline (the last line may have none).
func lines(data []byte) [][]byte {
	ls := bytes.SplitAfter(data, []byte("\n"))
	if len(ls[len(ls)-1]) == 0 {
		ls = ls[:len(ls)-1]
	}
	return ls
}

func readExample(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/example.yaml")
	require.NoError(t, err)
	return b
}

func marshalled(t *testing.T, data []byte) []byte {
	t.Helper()
	d, err := Parse(data)
	require.NoError(t, err)
	b, err := d.Marshal()
	require.NoError(t, err)
	return b
}

// A slow writer writes example.yaml line by line while the Watcher reads
// what it leaves. No partial document is applied, and the complete one is
// applied once the writer is done:
//
//   - events: in place; the directory reports every write, and the writer
//     pauses for less than the settle time between lines (fake time);
//   - polled: in place; the file system reports nothing (Poll finds
//     changes), and the writer pauses for less than the settle time: the
//     two reads a settle time apart never agree until the file is complete;
//   - sealed: in place; the writer stalls for longer than the settle time
//     after every line, so the Watcher settles on every prefix, and the
//     checksum refuses each;
//   - rename: the writer stalls as long into a temporary file, then
//     renames it over the document (the safe way): the Watcher never even
//     sees a partial document.
func TestWatcherSlowWriter(t *testing.T) {
	const settle = 100 * time.Millisecond
	example := readExample(t)
	type how int
	const (
		events how = iota
		polled     // no directory events; poll every settle/2
		sealed     // after each line, wait until the Watcher settled on the prefix and refused it
		rename     // write a temporary file, rename it over the document
	)
	for _, tc := range []struct {
		name  string
		how   how
		data  []byte
		pause time.Duration
	}{
		{"events, pauses shorter than the settle time", events, example, settle / 2},
		{"polled, pauses shorter than the settle time", polled, example, settle / 2},
		{"sealed, stalls longer than the settle time", sealed, Seal(example), 2 * settle},
		{"rename, stalls longer than the settle time", rename, example, 2 * settle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "mux.yaml")
			require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
			clk := &fakeClock{}
			a := &docApplier{}
			var lastRead, reads atomic.Int64
			onRead := func(n int) { lastRead.Store(int64(n)); reads.Add(1) }
			var logs syncBuffer
			opts := WatcherOptions{Debounce: settle, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			if tc.how == polled {
				// No retries: every timer that fires is one read.
				opts.Poll, opts.Retry = settle/2, -1
			}
			w := startHooked(t, path, opts, a.apply, clk, onRead, tc.how == polled)
			want := marshalled(t, tc.data)

			target := path
			if tc.how == rename {
				target = filepath.Join(filepath.Dir(path), ".mux.yaml.tmp")
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			require.NoError(t, err)
			written := 0
			ls := lines(tc.data)
			for i, line := range ls {
				st0 := w.Status()
				reads0 := reads.Load()
				_, err := f.Write(line)
				require.NoError(t, err)
				written += len(line)
				switch tc.how {
				case events, sealed:
					// The directory's event makes the Watcher read this prefix.
					require.Eventually(t, func() bool { return lastRead.Load() == int64(written) }, hang, time.Millisecond,
						"waiting for a read of line %d", i+1)
				case rename:
					// The event makes it read the document (unchanged).
					require.Eventually(t, func() bool { return reads.Load() > reads0 }, hang, time.Millisecond,
						"waiting for a read after line %d", i+1)
				}
				before := reads.Load()
				if fired := clk.Advance(tc.pause); tc.how == polled {
					// Each timer that fired (poll or settle) is one read,
					// after which the Watcher arms its next timer: wait for
					// both, so that the next Advance counts from there (the
					// read alone raced the re-arming, and the reads drifted
					// onto the settle time, agreeing).
					require.Eventually(t, func() bool { return reads.Load() >= before+int64(fired) && clk.armed() > 0 }, hang, time.Millisecond,
						"waiting for the Watcher after line %d", i+1)
				}
				if tc.how == sealed && i < len(ls)-1 {
					require.Eventually(t, func() bool {
						clk.Advance(settle)
						st := w.Status()
						return st.Rejected > st0.Rejected || st.Applied > 1
					}, hang, time.Millisecond, "waiting for prefix of line %d to be settled on", i+1)
					st := w.Status()
					require.EqualValues(t, 1, st.Version, "prefix of line %d", i+1)
					require.ErrorIs(t, st.LastError, ErrInvalid, "prefix of line %d", i+1)
				}
			}
			require.NoError(t, f.Close())
			if tc.how == rename {
				require.NoError(t, os.Rename(target, path))
			}
			require.Eventually(t, func() bool {
				clk.Advance(settle)
				return w.Status().Version == 7
			}, hang, time.Millisecond, "waiting for the complete document; status %+v", w.Status())
			st := w.Status()
			assert.Nil(t, st.LastError)
			if tc.how == rename {
				assert.Zero(t, st.Rejected, "nothing partial was ever read")
			}
			if tc.how == polled {
				// 131 lines, two reads per settle time: it was noticed.
				assert.Equal(t, 1, strings.Count(logs.String(), "the file keeps changing"), logs.String())
			}

			docs := a.docs()
			require.Len(t, docs, 2, "version 1, then the complete document")
			for i, d := range docs[1:] {
				assert.Equal(t, string(want), string(d), "applied document %d is not the complete one", i+1)
			}
		})
	}
}

// startHooked runs a Watcher with the fake clock clk, the read hook
// onRead and, if noEvents, no directory events until the test ends, and
// waits for the first document.
func startHooked(t *testing.T, path string, opts WatcherOptions, apply func(*Document) error, clk *fakeClock, onRead func(int), noEvents bool) *Watcher {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	w := NewWatcher(path, opts)
	w.clock, w.onRead, w.noEvents = clk, onRead, noEvents
	return runWatcher(t, w, apply, clk)
}

// Every line-boundary prefix of the sealed example, and every byte
// prefix, is refused by Parse; of the plain example's prefixes many are
// valid documents, which is why a Watcher must not read a file mid-write.
func TestSealedPrefixesRejected(t *testing.T) {
	example := readExample(t)
	sealed := Seal(example)
	for _, tc := range []struct {
		name  string
		data  []byte
		valid func(t *testing.T, valid, total int)
	}{
		{"plain", example, func(t *testing.T, valid, total int) {
			assert.Positive(t, valid, "some prefixes of the plain example are valid documents")
			t.Logf("%d of %d line-boundary prefixes of the plain example are valid documents", valid, total)
		}},
		{"sealed", sealed, func(t *testing.T, valid, total int) {
			assert.Zero(t, valid, "a prefix of the sealed example is a valid document")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			valid, total, at := 0, 0, 0
			for _, line := range lines(tc.data) {
				_, err := Parse(tc.data[:at]) // the prefix before this line
				total++
				if err == nil {
					valid++
				} else {
					require.ErrorIs(t, err, ErrInvalid)
				}
				at += len(line)
			}
			tc.valid(t, valid, total)
			_, err := Parse(tc.data)
			require.NoError(t, err, "the complete document")
		})
	}
	for n := range len(sealed) {
		_, err := Parse(sealed[:n])
		require.ErrorIs(t, err, ErrInvalid, "byte prefix %d", n)
	}
}

func TestSealAndChecksum(t *testing.T) {
	doc := docV(3, "")
	sealed := Seal(doc)
	require.True(t, bytes.HasPrefix(sealed, []byte("checksum: sha256:")), string(sealed))
	assert.Equal(t, string(sealed), string(Seal(sealed)), "resealing changes nothing")
	assert.Equal(t, marshalled(t, doc), marshalled(t, sealed), "the checksum is not part of the document")

	// After leading comments, before the first key.
	commented := append([]byte("# fleet\n\n"), doc...)
	sc := Seal(commented)
	require.True(t, bytes.HasPrefix(sc, []byte("# fleet\n\nchecksum: sha256:")), string(sc))
	_, err := Parse(sc)
	require.NoError(t, err)

	sumLine := string(lines(sealed)[0])
	for _, tc := range []struct {
		name, data, want string
	}{
		{"edited without resealing", strings.Replace(string(sealed), "port: 80", "port: 81", 1),
			"1:11: checksum: the document does not match its checksum: the file is incomplete"},
		{"truncated", string(sealed[:len(sealed)-20]), "1:11: checksum: the document does not match its checksum"},
		{"only the checksum line", sumLine, "1:11: checksum: the document does not match its checksum"},
		{"not a checksum", "checksum: md5:abc\n" + string(doc),
			`1:11: checksum: "md5:abc" is not a checksum (want sha256: and 64 hex digits`},
		{"short", "checksum: sha256:abcd\n" + string(doc), `1:11: checksum: "sha256:abcd" is not a checksum`},
		{"too long", strings.Replace(sumLine, "\n", "00\n", 1) + string(doc), `is not a checksum`},
		{"not hex", "checksum: sha256:" + strings.Repeat("zz", 32) + "\n" + string(doc), `is not a checksum`},
		{"not the first key", string(doc) + sumLine,
			"checksum: a checksum must be the document's first key"},
		{"in a flow mapping", "{checksum: x, version: 1}", "checksum: a checksum must be the document's first key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data))
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A refused apply is retried every Retry without a reload or a change.
func TestWatcherRetriesRefusedApply(t *testing.T) {
	const settle, retry = 100 * time.Millisecond, time.Second
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
	clk := &fakeClock{}
	a := &docApplier{}
	w := startHooked(t, path, WatcherOptions{Debounce: settle, Retry: retry}, a.apply, clk, nil, false)

	a.setFail(errors.New("no room"))
	writeAtomic(t, path, docV(2, ""))
	require.Eventually(t, func() bool {
		clk.Advance(settle)
		return w.Status().Reason == ReasonApply
	}, hang, time.Millisecond)
	rejected := w.Status().Rejected
	require.Eventually(t, func() bool {
		clk.Advance(retry)
		return w.Status().Rejected > rejected
	}, hang, time.Millisecond, "retried while apply refuses")
	assert.EqualValues(t, 1, w.Status().Version)

	a.setFail(nil)
	require.Eventually(t, func() bool {
		clk.Advance(retry)
		return w.Status().Version == 2
	}, hang, time.Millisecond)
	assert.Nil(t, w.Status().LastError)
}
