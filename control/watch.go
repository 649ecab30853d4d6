package control

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is the default settle time of a Watcher (see
// WatcherOptions.Debounce).
const DefaultDebounce = 250 * time.Millisecond

// DefaultRetry is how often, by default, a Watcher re-checks the file
// while the document there is not applied (see WatcherOptions.Retry).
const DefaultRetry = 10 * time.Second

// WatcherOptions configures a Watcher. The zero value is ready to use.
type WatcherOptions struct {
	// Logger receives what the Watcher does and why (nil: slog.Default()).
	Logger *slog.Logger
	// Debounce is the settle time: the Watcher uses what it reads only
	// once two reads this far apart agree (same file, size, modification
	// time and content), each read between two equal stats of the file,
	// and a change in the file's directory restarts the wait. So a file
	// written in place (cp, scp, most editors) is not read half written,
	// as long as the writer does not pause for longer than this mid-file;
	// a sealed document (Seal) is never applied torn, however the writer
	// pauses. 0 means DefaultDebounce.
	Debounce time.Duration
	// Poll, when above 0, also re-reads the file this often, for file
	// systems that do not report changes (some network file systems).
	Poll time.Duration
	// Retry is how often the file is read again while the Watcher is not
	// running what it holds (LastError is set), in case a change was not
	// reported, and to retry an apply that failed. 0 means DefaultRetry;
	// below 0, never.
	Retry time.Duration
	// Signals, when not nil, forces a reload on every value received:
	// pass a channel given to signal.Notify(ch, syscall.SIGHUP).
	Signals <-chan os.Signal
}

// Why a Watcher did not apply what the file holds, as Status.Reason says
// it (and the xdplb_config_error metric's reason label).
const (
	ReasonUnreadable = "unreadable" // the file cannot be read
	ReasonInvalid    = "invalid"    // ErrInvalid: does not parse or validate (a torn sealed document too)
	ReasonStale      = "stale"      // ErrStaleVersion: a lower version than the running one
	ReasonConflict   = "conflict"   // ErrVersionConflict: the running version, different content
	ReasonApply      = "apply"      // the apply function refused it
)

// Reasons lists every Reason value.
var Reasons = []string{ReasonUnreadable, ReasonInvalid, ReasonStale, ReasonConflict, ReasonApply}

// Status is what a Source runs and what went wrong last; see
// Watcher.Status.
type Status struct {
	// Path is the watched file, or the store's key.
	Path string
	// Version is the running version; 0 before the first apply.
	Version uint64
	// Written is the running document's Written time (zero if it has none).
	Written time.Time
	// AppliedAt is when the running version was applied.
	AppliedAt time.Time
	// Revision is the store's revision of the running document (etcd's
	// ModRevision; see Origin); 0 for a file.
	Revision int64
	// Committed is when the running document was committed to the store,
	// as its writer recorded it; zero for a file.
	Committed time.Time
	// LastError is why the last document read was not applied (unreadable,
	// invalid, not a newer version, or apply failed); nil once a later
	// version is applied or the file again holds the running document.
	LastError error
	// Reason classifies LastError (ReasonInvalid, ...); "" when it is nil.
	Reason string
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time
	// Applied counts the versions applied; Rejected the documents refused.
	Applied, Rejected uint64
}

// SyncDelay is how long the running version took from being committed to
// the store (Committed) — or, from a file, from being written (the
// document's Written) — to being applied here (AppliedAt); 0 when neither
// is known. Clocks of the writer and the node must agree for it to mean
// much.
func (s Status) SyncDelay() time.Duration {
	from := s.Committed
	if from.IsZero() {
		from = s.Written
	}
	if from.IsZero() || s.AppliedAt.IsZero() {
		return 0
	}
	return s.AppliedAt.Sub(from)
}

// Watcher keeps a node on the newest valid version of a document file.
//
// Run loads the file, applies it, then watches the file's directory (not
// the file: editors replace a file by renaming another over it, and a
// Kubernetes ConfigMap volume swaps a symlink, and both are changes to the
// directory). On every change, on Reload, and on every value from
// WatcherOptions.Signals, it waits for the file to settle (two reads a
// settle time apart agree; see WatcherOptions.Debounce) and, if the content
// changed, parses and validates it, and applies it only if its version is
// above the running one. Anything else keeps the running version, is
// logged with the reason, is recorded in Status, and is read again every
// WatcherOptions.Retry until the file holds something that applies:
//
//   - a file that cannot be read;
//   - a document that does not parse or validate (every problem is
//     logged, located by line and column), which includes a sealed
//     document (Seal) read before it is complete;
//   - a valid document with a lower version than the running one
//     (ErrStaleVersion);
//   - a valid document with the running version that says something else
//     (ErrVersionConflict: an operator must bump version with every change;
//     a file that holds the running document, even reformatted or with
//     other comments, is not an error);
//   - a document the apply function refused.
//
// apply is called from Run's goroutine only, one document at a time; it
// applies the document whole or returns an error and changes nothing.
type Watcher struct {
	path    string
	opts    WatcherOptions
	log     *slog.Logger
	clock   clock
	reload  chan struct{}
	ready   chan struct{} // closed once the first document is applied
	running atomic.Bool

	t *Tracker

	// Owned by Run's goroutine.
	seen     [sha256.Size]byte
	seenOK   bool
	onRead   func(n int) // tests: called after each read of n bytes
	noEvents bool        // tests: a file system that reports no changes
}

// NewWatcher returns a Watcher of the document file at path. Nothing
// happens until Run.
func NewWatcher(path string, opts WatcherOptions) *Watcher {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Retry == 0 {
		opts.Retry = DefaultRetry
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Watcher{
		path:   path,
		opts:   opts,
		log:    log.With("path", path),
		clock:  realClock{},
		reload: make(chan struct{}, 1),
		ready:  make(chan struct{}),
		t:      NewTracker(path, "the file", log.With("path", path)),
	}
}

// Reload asks Run to read the file again, once it has settled, even if its
// content did not change (so a document apply refused is retried at once).
// It does not wait.
func (w *Watcher) Reload() {
	select {
	case w.reload <- struct{}{}:
	default:
	}
}

// Status returns the Watcher's current status.
func (w *Watcher) Status() Status { return w.t.Status() }

// Document returns the running document, or nil before the first apply.
func (w *Watcher) Document() *Document { return w.t.Document() }

// Ready is closed once Run has applied the first document. A node starts
// Run on its own goroutine and waits for Ready (or for Run to return the
// first load's error) before it opens its data path.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run loads and applies the file, then keeps watching it until ctx is
// done, when it returns nil. It returns an error, without watching, if the
// first load fails (unreadable, invalid, or refused by apply) or ctx is
// done before the file settles: a node must not start without a valid
// configuration. Run may be called only once.
func (w *Watcher) Run(ctx context.Context, apply func(*Document) error) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("control: Watcher.Run called twice")
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("control: watch %s: %w", w.path, err)
	}
	defer fw.Close()
	// Watch before the first read, so that no change falls in between.
	dir := filepath.Dir(w.path)
	watched := map[string]bool{}
	if !w.noEvents {
		if err := fw.Add(dir); err != nil {
			return fmt.Errorf("control: watch %s: %w", dir, err)
		}
		watched[dir] = true
		w.followLink(fw, watched, dir)
	}

	settle := w.clock.NewTimer()
	defer settle.Stop()
	// The first load settles too: a node may start while the file is
	// being written. Events until then are covered by the reads.
	for pending := w.read(); ; {
		settle.Reset(w.opts.Debounce)
		select {
		case <-ctx.Done():
			return fmt.Errorf("control: first load: %w", ctx.Err())
		case <-settle.C():
		}
		cur := w.read()
		if !cur.agrees(pending) {
			pending = cur
			continue
		}
		if _, err := w.check(cur, apply, true); err != nil {
			return fmt.Errorf("control: first load: %w", err)
		}
		break
	}
	close(w.ready)

	retry := w.clock.NewTimer()
	defer retry.Stop()
	// The poll timer runs while the file is not settling.
	poll := w.clock.NewTimer()
	defer poll.Stop()
	if w.opts.Poll > 0 {
		poll.Reset(w.opts.Poll)
	}
	var (
		settling, force bool
		pending         snapshot
		unsettled       int // reads in a row that did not agree
	)
	// begin (re)starts the wait for the file to settle.
	begin := func(f bool) {
		force = force || f
		pending, settling = w.read(), true
		settle.Reset(w.opts.Debounce)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("control: file watcher closed")
			}
			w.log.Debug("control: directory changed", "event", ev.String())
			begin(false)
			continue
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("control: file watcher closed")
			}
			w.log.Warn("control: file watcher", "error", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				begin(false) // events were lost: read the file to be sure
			}
			continue
		case <-poll.C():
			if !settling {
				begin(false)
			}
			continue
		case <-retry.C():
			if !settling {
				// A refused apply is tried again; anything else is news
				// only if the file changed.
				begin(w.Status().Reason == ReasonApply)
			}
			continue
		case <-w.reload:
			w.log.Info("control: reload requested")
			begin(true)
			continue
		case <-w.opts.Signals:
			w.log.Info("control: reload requested")
			begin(true)
			continue
		case <-settle.C():
		}
		cur := w.read()
		if !cur.agrees(pending) {
			unsettled++
			w.log.Debug("control: file still changing")
			if unsettled == warnUnsettled {
				w.log.Warn("control: the file keeps changing; waiting for it to settle before reading it",
					"settle", w.opts.Debounce, "reads", unsettled)
			}
			pending = cur
			settle.Reset(w.opts.Debounce)
			continue
		}
		settling, unsettled = false, 0
		w.check(cur, apply, force)
		force = false
		if !w.noEvents {
			w.followLink(fw, watched, dir)
		}
		if w.opts.Poll > 0 {
			poll.Reset(w.opts.Poll)
		}
		if w.Status().LastError != nil && w.opts.Retry > 0 {
			retry.Reset(w.opts.Retry)
		} else {
			retry.Stop()
		}
	}
}

// warnUnsettled is how many reads in a row that do not agree make a
// Watcher warn that the file does not settle.
const warnUnsettled = 20

// snapshot is one read of the file, between two stats.
type snapshot struct {
	err    error
	data   []byte
	sum    [sha256.Size]byte
	fi     os.FileInfo // the stat before the read
	stable bool        // the stat after the read agreed with fi
}

// read reads the file between two stats.
func (w *Watcher) read() snapshot {
	before, err := os.Stat(w.path)
	if err != nil {
		return snapshot{err: err}
	}
	data, err := readFile(w.path)
	if err != nil {
		return snapshot{err: err}
	}
	after, err := os.Stat(w.path)
	if err != nil {
		return snapshot{err: err}
	}
	if w.onRead != nil {
		w.onRead(len(data))
	}
	return snapshot{data: data, sum: sha256.Sum256(data), fi: before, stable: sameStat(before, after)}
}

func sameStat(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// agrees reports whether s and an earlier read p saw the same, settled
// file: the same content and stats, or the same error.
func (s snapshot) agrees(p snapshot) bool {
	if s.err != nil || p.err != nil {
		return s.err != nil && p.err != nil && s.err.Error() == p.err.Error()
	}
	return s.stable && p.stable && sameStat(s.fi, p.fi) && s.sum == p.sum
}

// followLink also watches the directory of the file the path resolves to,
// when the path is a symlink into another directory, and stops watching
// the one it resolved to before.
func (w *Watcher) followLink(fw *fsnotify.Watcher, watched map[string]bool, dir string) {
	want := map[string]bool{dir: true}
	if real, err := filepath.EvalSymlinks(w.path); err == nil {
		want[filepath.Dir(real)] = true
	}
	for d := range want {
		if !watched[d] {
			if err := fw.Add(d); err == nil {
				watched[d] = true
			}
		}
	}
	for d := range watched {
		if !want[d] {
			_ = fw.Remove(d) // fails when the directory is gone; nothing to do
			delete(watched, d)
		}
	}
}

// check applies the settled read s if it is a valid newer version. It
// skips content it saw last time unless force. It reports whether it
// applied a document, and why not when it refused one.
func (w *Watcher) check(s snapshot, apply func(*Document) error, force bool) (bool, error) {
	if s.err != nil {
		w.seenOK = false // whatever comes back next is news
		w.t.Refuse(s.err, ReasonUnreadable)
		return false, s.err
	}
	if !force && w.seenOK && s.sum == w.seen {
		return false, nil
	}
	w.seen, w.seenOK = s.sum, true
	return w.t.Offer(s.data, Origin{}, apply)
}

// clock makes the Watcher's timers; tests replace it.
type clock interface {
	// NewTimer returns a stopped timer.
	NewTimer() timer
}

// timer is a time.Timer (Go 1.23 semantics: Reset and Stop discard a
// value not yet received).
type timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

type realClock struct{}

func (realClock) NewTimer() timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return realTimer{t}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop()                 { r.t.Stop() }
