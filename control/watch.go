package control

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits after the last change in the
// file's directory before it reads the file.
const DefaultDebounce = 100 * time.Millisecond

// WatcherOptions configures a Watcher. The zero value is ready to use.
type WatcherOptions struct {
	// Logger receives what the Watcher does and why (nil: slog.Default()).
	Logger *slog.Logger
	// Debounce is the quiet time after the last change in the file's
	// directory before the file is read, so that an editor's burst of
	// writes is read once, whole. 0 means DefaultDebounce.
	Debounce time.Duration
	// Poll, when above 0, also re-reads the file this often, for file
	// systems that do not report changes (some network file systems).
	Poll time.Duration
	// Signals, when not nil, forces a reload on every value received:
	// pass a channel given to signal.Notify(ch, syscall.SIGHUP).
	Signals <-chan os.Signal
}

// Status is what a Watcher runs and what went wrong last; see
// Watcher.Status.
type Status struct {
	// Path is the watched file.
	Path string
	// Version is the running version; 0 before the first apply.
	Version uint64
	// Written is the running document's Written time (zero if it has none).
	Written time.Time
	// AppliedAt is when the running version was applied.
	AppliedAt time.Time
	// LastError is why the last document read was not applied (unreadable,
	// invalid, not a newer version, or apply failed); nil once a later
	// version is applied or the file again holds the running version.
	LastError error
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time
	// Applied counts the versions applied; Rejected the documents refused.
	Applied, Rejected uint64
}

// SyncDelay is AppliedAt − Written: how long the running version took from
// being written to being applied here (0 when the document has no Written
// time). Clocks of the writer and the node must agree for it to mean much.
func (s Status) SyncDelay() time.Duration {
	if s.Written.IsZero() || s.AppliedAt.IsZero() {
		return 0
	}
	return s.AppliedAt.Sub(s.Written)
}

// Watcher keeps a node on the newest valid version of a document file.
//
// Run loads the file, applies it, then watches the file's directory (not
// the file: editors replace a file by renaming another over it, and a
// Kubernetes ConfigMap volume swaps a symlink, and both are changes to the
// directory). On every change, on Reload, and on every value from
// WatcherOptions.Signals, it reads the file and, if the content changed,
// parses and validates it, and applies it only if its version is above
// the running one. Anything else keeps the running version, is logged with
// the reason, and is recorded in Status:
//
//   - a document that does not parse or validate (every problem is
//     logged, located by line and column);
//   - a valid document whose version is not above the running one
//     (ErrStaleVersion: an operator must bump version with every change;
//     a file that still holds exactly the running document is not an
//     error);
//   - a document the apply function refused.
//
// apply is called from Run's goroutine only, one document at a time; it
// applies the document whole or returns an error and changes nothing.
type Watcher struct {
	path    string
	opts    WatcherOptions
	log     *slog.Logger
	reload  chan struct{}
	ready   chan struct{} // closed once the first document is applied
	running atomic.Bool

	mu  sync.Mutex
	st  Status
	doc *Document

	// Owned by Run's goroutine.
	seen, applied [sha256.Size]byte
	seenOK        bool
}

// NewWatcher returns a Watcher of the document file at path. Nothing
// happens until Run.
func NewWatcher(path string, opts WatcherOptions) *Watcher {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Watcher{
		path:   path,
		opts:   opts,
		log:    log.With("path", path),
		reload: make(chan struct{}, 1),
		ready:  make(chan struct{}),
		st:     Status{Path: path},
	}
}

// Reload asks Run to read the file again now, even if its content did not
// change (so a document apply refused can be retried). It does not wait.
func (w *Watcher) Reload() {
	select {
	case w.reload <- struct{}{}:
	default:
	}
}

// Status returns the Watcher's current status.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

// Document returns the running document, or nil before the first apply.
func (w *Watcher) Document() *Document {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.doc
}

// Ready is closed once Run has applied the first document. A node starts
// Run on its own goroutine and waits for Ready (or for Run to return the
// first load's error) before it opens its data path.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run loads and applies the file, then keeps watching it until ctx is
// done, when it returns nil. It returns an error, without watching, if the
// first load fails (unreadable, invalid, or refused by apply): a node must
// not start without a valid configuration. Run may be called only once.
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
	if err := fw.Add(dir); err != nil {
		return fmt.Errorf("control: watch %s: %w", dir, err)
	}
	watched := map[string]bool{dir: true}
	w.followLink(fw, watched, dir)
	if _, err := w.check(apply, true); err != nil {
		return fmt.Errorf("control: first load: %w", err)
	}
	close(w.ready)

	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var poll <-chan time.Time
	if w.opts.Poll > 0 {
		t := time.NewTicker(w.opts.Poll)
		defer t.Stop()
		poll = t.C
	}
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("control: file watcher closed")
			}
			w.log.Debug("control: directory changed", "event", ev.String())
			debounce.Reset(w.opts.Debounce)
			continue
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("control: file watcher closed")
			}
			w.log.Warn("control: file watcher", "error", err)
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				continue
			}
			// Events were lost: read the file to be sure.
		case <-debounce.C:
		case <-poll:
		case <-w.reload:
			force = true
		case <-w.opts.Signals:
			force = true
		}
		if force {
			w.log.Info("control: reload requested")
		}
		w.check(apply, force)
		w.followLink(fw, watched, dir)
	}
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

// check reads the file and applies it if it is a valid newer version. It
// skips content it saw last time unless force. It reports whether it
// applied a document, and why not when it refused one.
func (w *Watcher) check(apply func(*Document) error, force bool) (bool, error) {
	data, err := readFile(w.path)
	if err != nil {
		w.seenOK = false // whatever comes back next is news
		w.refuse(err)
		return false, err
	}
	sum := sha256.Sum256(data)
	if !force && w.seenOK && sum == w.seen {
		return false, nil
	}
	w.seen, w.seenOK = sum, true
	doc, err := parse(w.path, data)
	if err != nil {
		w.refuse(err)
		return false, err
	}
	if cur := w.Document(); cur != nil && doc.Version <= cur.Version {
		if sum == w.applied {
			// Back to what runs (say, a bad edit reverted): nothing to do,
			// and nothing wrong any more.
			w.log.Info("control: file holds the running version", "version", cur.Version)
			w.mu.Lock()
			w.st.LastError, w.st.LastErrorAt = nil, time.Time{}
			w.mu.Unlock()
			return false, nil
		}
		err := fmt.Errorf("%w: the file has version %d and the node runs %d; bump version to apply the change",
			ErrStaleVersion, doc.Version, cur.Version)
		w.refuse(err)
		return false, err
	}
	if err := apply(doc); err != nil {
		err = fmt.Errorf("control: apply version %d: %w", doc.Version, err)
		w.refuse(err)
		return false, err
	}
	w.applied = sum
	now := time.Now()
	w.mu.Lock()
	w.doc = doc
	w.st.Version, w.st.Written, w.st.AppliedAt = doc.Version, doc.Written, now
	w.st.LastError, w.st.LastErrorAt = nil, time.Time{}
	w.st.Applied++
	st := w.st
	w.mu.Unlock()
	attrs := []any{"version", doc.Version, "vips", len(doc.VIPs)}
	if !doc.Written.IsZero() {
		attrs = append(attrs, "sync_delay", st.SyncDelay())
	}
	w.log.Info("control: applied", attrs...)
	return true, nil
}

// refuse records and logs why the file was not applied.
func (w *Watcher) refuse(err error) {
	w.mu.Lock()
	w.st.LastError, w.st.LastErrorAt = err, time.Now()
	w.st.Rejected++
	version := w.st.Version
	w.mu.Unlock()
	var j interface{ Unwrap() []error }
	if errors.Is(err, ErrInvalid) && errors.As(err, &j) {
		problems := j.Unwrap()
		w.log.Error("control: invalid document, keeping the running version", "running", version, "problems", len(problems))
		for _, p := range problems {
			w.log.Error("control: " + p.Error())
		}
		return
	}
	w.log.Error("control: not applied, keeping the running version", "running", version, "error", err)
}
