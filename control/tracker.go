package control

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Origin says where a document text came from, beyond its content: the
// store's revision and commit time when the store keeps them (etcd), zero
// for a file.
type Origin struct {
	// Revision is the store's revision of the text (etcd's ModRevision);
	// a Tracker refuses a text of a lower revision than the running
	// one's, whatever its version, so a node never goes backwards in the
	// store's history (say, a store restored from an old backup).
	Revision int64
	// Committed is when the text was committed to the store, as the
	// writer recorded it; zero if unknown.
	Committed time.Time
}

// A Tracker applies the document texts a Source reads by the rules every
// Source follows, and keeps the Source's Status: a text is parsed and
// validated, applied only if its version is above the running one's,
// and anything else — invalid, stale, the running version saying
// something else, refused by apply — keeps the running version, is
// logged with the reason and recorded in Status. A text that holds the
// running document (even reformatted) is not an error. Package fleet's
// etcd Source and the file Watcher use one.
//
// Offer and Refuse are called from the Source's goroutine only; Status
// and Document from any.
type Tracker struct {
	name string // the file, or the store's key, for messages
	what string // "the file", "etcd", ...: what holds the text, in messages
	log  *slog.Logger

	mu  sync.Mutex
	st  Status
	doc *Document

	// Owned by the Source's goroutine.
	parse func(name string, data []byte) (*Document, error)
	// applied is the SHA-256 of the running document's text, when it
	// came without a store revision (a file); a store's revision names a
	// text by itself (Status.Revision).
	applied       [sha256.Size]byte
	appliedHashed bool
	// appliedText is the running document marshalled, made when first
	// needed: only a text of the running version with other bytes is
	// compared with it, and marshalling a large document costs more than
	// parsing it.
	appliedText []byte
}

// NewTracker returns a Tracker of the document at name (a path or a key),
// which messages call what ("the file", "etcd").
func NewTracker(name, what string, log *slog.Logger) *Tracker {
	if log == nil {
		log = slog.Default()
	}
	return &Tracker{name: name, what: what, log: log, st: Status{Path: name}, parse: NewParser().Parse}
}

// SetParse replaces how Offer parses a text (nil: a Parser of its own,
// with name in its errors: a new version of a large document is decoded
// only where it differs from the last one; see Parser). It is for a process that simulates many nodes
// (package fleet's scale benchmark): its Trackers share one parse of each
// text, so the process spends one node's parse, not one per node, on a
// new version. Parsed documents are never modified, so sharing one among
// Trackers is safe. A node has no reason to call it. Call it before the
// first Offer.
func (t *Tracker) SetParse(p func(name string, data []byte) (*Document, error)) {
	if p == nil {
		p = NewParser().Parse
	}
	t.parse = p
}

// Status returns the current status.
func (t *Tracker) Status() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.st
}

// Document returns the running document, or nil before the first apply.
func (t *Tracker) Document() *Document {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.doc
}

// Offer parses data and applies it if it is a valid newer version. It
// reports whether it applied a document, and why not when it refused one.
func (t *Tracker) Offer(data []byte, o Origin, apply func(*Document) error) (bool, error) {
	// The running document's very text (read again after a watch broke,
	// say) needs no parse: a store's revision names it, else its hash.
	cur := t.Document()
	if cur != nil && o.Revision != 0 && o.Revision == t.Status().Revision {
		t.holdsRunning(cur.Version, o)
		return false, nil
	}
	var sum [sha256.Size]byte
	hashed := o.Revision == 0
	if hashed {
		sum = sha256.Sum256(data)
		if cur != nil && t.appliedHashed && sum == t.applied {
			t.holdsRunning(cur.Version, o)
			return false, nil
		}
	}
	doc, err := t.parse(t.name, data)
	if err != nil {
		t.Refuse(err, ReasonInvalid)
		return false, err
	}
	if cur != nil {
		st := t.Status()
		if o.Revision != 0 && o.Revision < st.Revision {
			err := fmt.Errorf("%w: %s holds revision %d (version %d), older than the running revision %d (version %d): "+
				"the store went back in its history; keeping what runs",
				ErrStaleVersion, t.what, o.Revision, doc.Version, st.Revision, cur.Version)
			t.Refuse(err, ReasonStale)
			return false, err
		}
	}
	if cur != nil && doc.Version <= cur.Version {
		if doc.Version == cur.Version && ((hashed && t.appliedHashed && sum == t.applied) || t.sameAsRunning(doc, cur)) {
			// What runs (say, a bad edit reverted, or only comments
			// changed): nothing to do, and nothing wrong any more.
			t.holdsRunning(cur.Version, o)
			return false, nil
		}
		if doc.Version == cur.Version {
			err := fmt.Errorf("%w: %s has version %d, the version this node runs, but says something else; "+
				"keeping what runs: write the change with a higher version",
				ErrVersionConflict, t.what, doc.Version)
			t.Refuse(err, ReasonConflict)
			return false, err
		}
		err := fmt.Errorf("%w: %s has version %d and the node runs %d; bump version to apply the change",
			ErrStaleVersion, t.what, doc.Version, cur.Version)
		t.Refuse(err, ReasonStale)
		return false, err
	}
	if err := apply(doc); err != nil {
		err = fmt.Errorf("control: apply version %d: %w", doc.Version, err)
		t.Refuse(err, ReasonApply)
		return false, err
	}
	t.applied, t.appliedHashed, t.appliedText = sum, hashed, nil
	t.run(doc, o, "vips", len(doc.VIPs))
	return true, nil
}

// run makes doc the running document, applied now at o, and logs it
// with attrs.
func (t *Tracker) run(doc *Document, o Origin, attrs ...any) {
	t.mu.Lock()
	t.doc = doc
	t.st.Version, t.st.Written, t.st.AppliedAt = doc.Version, doc.Written, time.Now()
	t.st.Revision, t.st.Committed = o.Revision, o.Committed
	t.st.LastError, t.st.Reason, t.st.LastErrorAt = nil, "", time.Time{}
	t.st.Applied++
	st := t.st
	t.mu.Unlock()
	attrs = append([]any{"version", doc.Version}, attrs...)
	if o.Revision != 0 {
		attrs = append(attrs, "revision", o.Revision)
	}
	if d := st.SyncDelay(); d != 0 {
		attrs = append(attrs, "sync_delay", d)
	}
	t.log.Info("control: applied", attrs...)
}

// Advance makes the running document version v without a parse or an
// apply: the store's writer knows that version v says, for this node,
// what the running version says (package fleet: a Host Agent's view that
// the new version left unchanged, a document of which only the version
// changed). The running document is kept with Version v (Document
// returns a copy of it with that version; the rest is shared), and
// Status reports version v applied now, at o. It refuses, like a stale
// text, a version below the running one or an origin older than the
// running revision; the running version itself is nothing to do. Before
// the first apply there is nothing to advance: it returns an error
// without recording it. It reports whether the version advanced.
func (t *Tracker) Advance(v uint64, o Origin) (bool, error) {
	return t.step(v, o, nil, nil, "unchanged")
}

// Amend applies version v without a parse: the running document with
// Version v and change made to it (to a copy: change may set fields, not
// modify what they hold). It is Advance for a store whose writer knows
// that version v says, for this node, what the running version says but
// for what change sets (package fleet: a Host Agent's view that the new
// version left as it was, but for the VIP addresses every view shares).
// It refuses what Advance refuses, and records apply's error as Offer
// does. It reports whether it applied version v.
func (t *Tracker) Amend(v uint64, o Origin, change func(*Document), apply func(*Document) error) (bool, error) {
	return t.step(v, o, change, apply, "amended")
}

// step makes version v at o the running document without a parse: the
// running one with Version v, changed by change and applied by apply
// when they are not nil (Advance, Amend); how says which in the log.
func (t *Tracker) step(v uint64, o Origin, change func(*Document), apply func(*Document) error, how string) (bool, error) {
	cur, err := t.above(v, o)
	if cur == nil {
		return false, err
	}
	doc := *cur
	doc.Version = v
	if change != nil {
		change(&doc)
	}
	if apply != nil {
		if err := apply(&doc); err != nil {
			err = fmt.Errorf("control: apply version %d: %w", doc.Version, err)
			t.Refuse(err, ReasonApply)
			return false, err
		}
	}
	// The running text's hash and canonical text were version cur's.
	t.appliedHashed, t.appliedText = false, nil
	t.run(&doc, o, "from", cur.Version, how, true)
	return true, nil
}

// above returns the running document when version v at o may follow it;
// else nil, having recorded a refusal (a version below the running one,
// an origin older than the running revision: the error) or that the store
// holds the running version (no error). Before the first apply it
// returns an error without recording it.
func (t *Tracker) above(v uint64, o Origin) (*Document, error) {
	cur := t.Document()
	if cur == nil {
		return nil, fmt.Errorf("control: %s: no running document to advance to version %d", t.what, v)
	}
	st := t.Status()
	if o.Revision != 0 && o.Revision < st.Revision {
		err := fmt.Errorf("%w: %s holds revision %d (version %d), older than the running revision %d (version %d): "+
			"the store went back in its history; keeping what runs",
			ErrStaleVersion, t.what, o.Revision, v, st.Revision, cur.Version)
		t.Refuse(err, ReasonStale)
		return nil, err
	}
	if v == cur.Version {
		t.holdsRunning(v, o)
		return nil, nil
	}
	if v < cur.Version {
		err := fmt.Errorf("%w: %s has version %d and the node runs %d; bump version to apply the change",
			ErrStaleVersion, t.what, v, cur.Version)
		t.Refuse(err, ReasonStale)
		return nil, err
	}
	return cur, nil
}

// holdsRunning records that the store holds the running document, of
// version v, at o: nothing to apply, and nothing wrong any more.
func (t *Tracker) holdsRunning(v uint64, o Origin) {
	t.log.Info("control: "+t.what+" holds the running version", "version", v)
	t.mu.Lock()
	t.st.LastError, t.st.Reason, t.st.LastErrorAt = nil, "", time.Time{}
	if o.Revision > t.st.Revision {
		t.st.Revision = o.Revision
	}
	t.mu.Unlock()
}

// sameAsRunning reports whether doc, of the running version but another
// text, says what the running document cur says (reformatted, comments
// changed): their canonical texts are equal.
func (t *Tracker) sameAsRunning(doc, cur *Document) bool {
	if t.appliedText == nil {
		t.appliedText, _ = cur.Marshal()
	}
	text, err := doc.Marshal()
	return err == nil && t.appliedText != nil && bytes.Equal(text, t.appliedText)
}

// Refuse records and logs why what the Source read was not applied
// (reason is one of Reasons).
func (t *Tracker) Refuse(err error, reason string) {
	t.mu.Lock()
	t.st.LastError, t.st.Reason, t.st.LastErrorAt = err, reason, time.Now()
	t.st.Rejected++
	version := t.st.Version
	t.mu.Unlock()
	var j interface{ Unwrap() []error }
	if errors.Is(err, ErrInvalid) && errors.As(err, &j) {
		problems := j.Unwrap()
		t.log.Error("control: invalid document, keeping the running version", "running", version, "problems", len(problems))
		for _, p := range problems {
			t.log.Error("control: " + p.Error())
		}
		return
	}
	t.log.Error("control: not applied, keeping the running version", "running", version, "reason", reason, "error", err)
}
