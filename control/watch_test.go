package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hang is how long a test waits for a condition before it gives up: a
// guard against hanging, not a timing assertion.
const hang = 20 * time.Second

// docV returns base with the given version (and optional extra top-level
// lines, to change the content without changing the version).
func docV(version int, extra string) []byte {
	return []byte(strings.Replace(base, "version: 1\n", fmt.Sprintf("version: %d\n%s", version, extra), 1))
}

// applier records applied versions; fail makes apply refuse.
type applier struct {
	mu      sync.Mutex
	applied []uint64
	fail    error
}

func (a *applier) apply(d *Document) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		return a.fail
	}
	a.applied = append(a.applied, d.Version)
	return nil
}

func (a *applier) setFail(err error) {
	a.mu.Lock()
	a.fail = err
	a.mu.Unlock()
}

func (a *applier) versions() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]uint64(nil), a.applied...)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs a Watcher of path until the test ends.
func start(t *testing.T, path string, opts WatcherOptions, a *applier) *Watcher {
	t.Helper()
	return startClock(t, path, opts, a.apply, nil)
}

// startClock is start with any apply function and, when clk is not nil,
// clk's timers.
func startClock(t *testing.T, path string, opts WatcherOptions, apply func(*Document) error, clk *fakeClock) *Watcher {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	if opts.Debounce == 0 {
		opts.Debounce = 10 * time.Millisecond
	}
	w := NewWatcher(path, opts)
	if clk != nil {
		w.clock = clk
	}
	return runWatcher(t, w, apply, clk)
}

// runWatcher runs w until the test ends and waits for the first document,
// advancing clk (when not nil) until it is applied.
func runWatcher(t *testing.T, w *Watcher, apply func(*Document) error, clk *fakeClock) *Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, apply) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(hang):
			t.Error("Run did not return after cancel")
		}
	})
	if clk != nil {
		require.Eventually(t, func() bool {
			clk.Advance(w.opts.Debounce)
			return w.Status().Version == 1
		}, hang, time.Millisecond, "waiting for the first document")
	}
	waitVersion(t, w, 1)
	return w
}

func waitVersion(t *testing.T, w *Watcher, v uint64) {
	t.Helper()
	require.Eventually(t, func() bool { return w.Status().Version == v }, hang, time.Millisecond,
		"waiting for version %d; status %+v", v, w.Status())
}

func waitError(t *testing.T, w *Watcher, target error) Status {
	t.Helper()
	var st Status
	require.Eventually(t, func() bool {
		st = w.Status()
		return errors.Is(st.LastError, target)
	}, hang, time.Millisecond, "waiting for %v; status %+v", target, w.Status())
	return st
}

// writeAtomic replaces path by renaming a new file over it, as editors do.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	require.NoError(t, os.WriteFile(tmp, data, 0o644))
	require.NoError(t, os.Rename(tmp, path))
}

func TestWatcherAppliesNewVersions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, "written: 2026-11-30T10:00:00Z\n"), 0o644))
	a := &applier{}
	w := start(t, path, WatcherOptions{}, a)

	st := w.Status()
	assert.Equal(t, path, st.Path)
	assert.Equal(t, time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), st.Written)
	assert.False(t, st.AppliedAt.IsZero())
	assert.Equal(t, st.AppliedAt.Sub(st.Written), st.SyncDelay())
	assert.Nil(t, st.LastError)
	assert.Equal(t, uint64(1), w.Document().Version)

	// Written in place.
	require.NoError(t, os.WriteFile(path, docV(2, ""), 0o644))
	waitVersion(t, w, 2)
	assert.Zero(t, w.Status().SyncDelay(), "no written time, no sync delay")

	// Renamed over the file.
	writeAtomic(t, path, docV(3, ""))
	waitVersion(t, w, 3)

	assert.Equal(t, []uint64{1, 2, 3}, a.versions())
	assert.Equal(t, uint64(3), w.Status().Applied)
}

func TestWatcherKeepsRunningVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
	a := &applier{}
	w := start(t, path, WatcherOptions{}, a)

	// Invalid: not applied, the reason recorded with its location.
	writeAtomic(t, path, []byte(strings.Replace(string(docV(2, "")), "port: 80", "port: 70000", 1)))
	st := waitError(t, w, ErrInvalid)
	assert.Equal(t, uint64(1), st.Version)
	assert.Contains(t, st.LastError.Error(), path+":6:11: vips[0].port: 70000 is out of range")
	assert.False(t, st.LastErrorAt.IsZero())
	assert.Positive(t, st.Rejected)
	assert.Equal(t, uint64(1), w.Document().Version, "the running document stays")

	// Fixed, with a new version: applied, the error cleared.
	writeAtomic(t, path, docV(2, ""))
	waitVersion(t, w, 2)
	assert.Nil(t, w.Status().LastError)

	// Changed without a version bump: a conflict, reported; what runs stays.
	writeAtomic(t, path, docV(2, "hash_seed: 7\n"))
	st = waitError(t, w, ErrVersionConflict)
	assert.ErrorIs(t, st.LastError, ErrStaleVersion)
	assert.Equal(t, ReasonConflict, st.Reason)
	assert.Contains(t, st.LastError.Error(), "the file has version 2, the version this node runs, but says something else")
	assert.Equal(t, uint64(2), st.Version)
	assert.Zero(t, w.Document().HashSeed, "the running document stays")

	// Back to what runs, only reformatted: nothing applied, nothing wrong.
	writeAtomic(t, path, append([]byte("# reformatted\n"), docV(2, "")...))
	require.Eventually(t, func() bool { return w.Status().LastError == nil }, hang, time.Millisecond)
	assert.Empty(t, w.Status().Reason)

	// A lower version: refused.
	writeAtomic(t, path, docV(1, ""))
	st = waitError(t, w, ErrStaleVersion)
	assert.Contains(t, st.LastError.Error(), "the file has version 1 and the node runs 2; bump version to apply the change")
	assert.Equal(t, ReasonStale, st.Reason)
	assert.NotErrorIs(t, st.LastError, ErrVersionConflict)

	// apply refuses: the version is not taken.
	a.setFail(errors.New("no room"))
	writeAtomic(t, path, docV(5, ""))
	require.Eventually(t, func() bool {
		err := w.Status().LastError
		return err != nil && strings.Contains(err.Error(), "apply version 5: no room")
	}, hang, time.Millisecond)
	assert.Equal(t, uint64(2), w.Status().Version)

	// The same file, retried on request (SIGHUP, Reload) once apply works.
	a.setFail(nil)
	w.Reload()
	waitVersion(t, w, 5)
	assert.Equal(t, []uint64{1, 2, 5}, a.versions())

	// The file goes away: recorded; it comes back as it was: all clear,
	// nothing applied again.
	require.NoError(t, os.Remove(path))
	waitError(t, w, os.ErrNotExist)
	require.NoError(t, os.WriteFile(path, docV(5, ""), 0o644))
	require.Eventually(t, func() bool { return w.Status().LastError == nil }, hang, time.Millisecond)

	// Reload of the running file: not an error, not applied twice.
	applied := w.Status().Applied
	w.Reload()
	require.NoError(t, os.WriteFile(path, docV(6, ""), 0o644))
	waitVersion(t, w, 6)
	assert.Equal(t, applied+1, w.Status().Applied)
	assert.Equal(t, []uint64{1, 2, 5, 6}, a.versions())
}

func TestWatcherSignalsAndPoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
	a := &applier{}
	sig := make(chan os.Signal, 1)
	// No retries: the signal must do it.
	w := start(t, path, WatcherOptions{Signals: sig, Retry: -1}, a)

	a.setFail(errors.New("busy"))
	require.NoError(t, os.WriteFile(path, docV(2, ""), 0o644))
	sig <- syscall.SIGHUP
	require.Eventually(t, func() bool { return w.Status().LastError != nil }, hang, time.Millisecond)
	a.setFail(nil)
	sig <- syscall.SIGHUP
	waitVersion(t, w, 2)

	// Polling finds a change too (here the directory's events find it as
	// well: there is no turning them off).
	path2 := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path2, docV(1, ""), 0o644))
	w2 := start(t, path2, WatcherOptions{Poll: 5 * time.Millisecond}, &applier{})
	require.NoError(t, os.WriteFile(path2, docV(2, ""), 0o644))
	waitVersion(t, w2, 2)
}

// A Kubernetes ConfigMap volume: the file is a symlink through "..data",
// itself a symlink to a timestamped directory; an update writes a new
// directory and renames a new "..data" link over the old one.
func TestWatcherConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	publish := func(version int, name string) {
		ts := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(ts, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(ts, "mux.yaml"), docV(version, ""), 0o644))
		tmp := filepath.Join(dir, "..data_tmp")
		require.NoError(t, os.Symlink(name, tmp))
		require.NoError(t, os.Rename(tmp, filepath.Join(dir, "..data")))
	}
	publish(1, "..2026_11_30_10_00_00.1")
	path := filepath.Join(dir, "mux.yaml")
	require.NoError(t, os.Symlink("..data/mux.yaml", path))

	a := &applier{}
	w := start(t, path, WatcherOptions{}, a)
	publish(2, "..2026_11_30_10_05_00.2")
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "..2026_11_30_10_00_00.1")))
	waitVersion(t, w, 2)
	publish(3, "..2026_11_30_10_10_00.3")
	waitVersion(t, w, 3)
}

// A path that is a symlink into another directory: a change there is seen.
func TestWatcherFollowsSymlinkTarget(t *testing.T) {
	real := filepath.Join(t.TempDir(), "v.yaml")
	require.NoError(t, os.WriteFile(real, docV(1, ""), 0o644))
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.Symlink(real, path))
	w := start(t, path, WatcherOptions{}, &applier{})
	writeAtomic(t, real, docV(2, ""))
	waitVersion(t, w, 2)
}

func TestWatcherFirstLoad(t *testing.T) {
	dir := t.TempDir()
	run := func(path string, a *applier) error {
		w := NewWatcher(path, WatcherOptions{Logger: quietLogger()})
		ctx, cancel := context.WithTimeout(context.Background(), hang)
		defer cancel()
		return w.Run(ctx, a.apply)
	}

	err := run(filepath.Join(dir, "missing.yaml"), &applier{})
	assert.ErrorIs(t, err, os.ErrNotExist)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("version: 0\n"), 0o644))
	err = run(bad, &applier{})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), bad+":1:10: version: 0 is out of range")

	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, docV(1, ""), 0o644))
	refuse := errors.New("refused")
	err = run(good, &applier{fail: refuse})
	assert.ErrorIs(t, err, refuse)

	_, err = os.Stat(filepath.Join(dir, "nodir", "x.yaml"))
	require.Error(t, err)
	err = run(filepath.Join(dir, "nodir", "x.yaml"), &applier{})
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestWatcherRunOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
	w := start(t, path, WatcherOptions{}, &applier{})
	err := w.Run(context.Background(), (&applier{}).apply)
	require.EqualError(t, err, "control: Watcher.Run called twice")
}

// The log says why a document was refused, one problem per record.
func TestWatcherLogs(t *testing.T) {
	var buf syncBuffer
	path := filepath.Join(t.TempDir(), "mux.yaml")
	require.NoError(t, os.WriteFile(path, docV(1, ""), 0o644))
	w := start(t, path, WatcherOptions{Logger: slog.New(slog.NewTextHandler(&buf, nil))}, &applier{})
	writeAtomic(t, path, []byte(strings.Replace(string(docV(2, "")), "protocol: tcp", "protocol: sctp", 1)))
	waitError(t, w, ErrInvalid)
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), `vips[0].protocol: \"sctp\" is not a protocol`) }, hang, time.Millisecond, buf.String())
	assert.Contains(t, buf.String(), `msg="control: applied" path=`+path+" version=1")
	assert.Contains(t, buf.String(), `msg="control: invalid document, keeping the running version"`)
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Ready is closed once the first document is applied, and not when the
// first load fails.
func TestWatcherReady(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, docV(1, ""), 0o644))
	w := NewWatcher(good, WatcherOptions{Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	a := &applier{}
	go func() { done <- w.Run(ctx, a.apply) }()
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("Run returned %v before Ready", err)
	case <-time.After(hang):
		t.Fatal("Ready was not closed")
	}
	require.EqualValues(t, 1, w.Status().Version)
	cancel()
	require.NoError(t, <-done)

	refused := NewWatcher(good, WatcherOptions{Logger: quietLogger()})
	require.Error(t, refused.Run(context.Background(), (&applier{fail: errors.New("no")}).apply))
	select {
	case <-refused.Ready():
		t.Fatal("Ready closed although the first document was refused")
	default:
	}
}
