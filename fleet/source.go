package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/xdplb/xdplb/control"
)

// DefaultRetry is how long a Source waits before it reads etcd again
// after an error (etcd unreachable, a watch cancelled, an apply refused).
const DefaultRetry = 2 * time.Second

// SourceConfig configures a Source.
type SourceConfig struct {
	// Client is the etcd client (required). The Source does not close it.
	Client *clientv3.Client
	// Prefix is the fleet's key prefix (default DefaultPrefix).
	Prefix string
	// Logger receives what the Source does (nil: slog.Default()).
	Logger *slog.Logger
	// Retry is how long to wait before reading again after an error (0:
	// DefaultRetry).
	Retry time.Duration
	// Parse parses the texts the Source reads (nil: package control's
	// parser). It is for a process simulating many nodes, whose Sources
	// share one parse of each text (control.Tracker.SetParse); a node
	// leaves it nil.
	Parse func(name string, text []byte) (*control.Document, error)
	// OnOffer, when set, is called after every document the Source
	// offers (applied or refused), from Run's goroutine: a node reports
	// its status then (the Reporter's Poke).
	OnOffer func()
	// Host, when set, makes the Source a Host Agent's: it follows the
	// view of the host of that name (a hosts[] name; HostView), which
	// Apply writes under views/<Host>, instead of the whole document.
	// It watches the views' commit record, and on each commit reads its
	// view at the commit's revision, so it never sees a half-written set
	// (or, when etcd compacted that revision, the view it makes from the
	// document committed with it);
	// a commit that left its view as it was advances its version without
	// a parse (control.Tracker.Advance).
	Host string
}

// Source is a control.Source that reads the fleet's document from etcd
// and watches it. See the package documentation for its rules.
type Source struct {
	c       *clientv3.Client
	k       keys
	log     *slog.Logger
	retry   time.Duration
	t       *control.Tracker
	reload  chan struct{}
	ready   chan struct{}
	running atomic.Bool
	onOffer func()
	host    string // a Host Agent's host: follow its view
	// viewRev and vipsRev are the ModRevisions of the view and of
	// views.vips (0: none) the Tracker runs; sum the content sum of the
	// document it runs, from its commit record, "" when unknown (Run's
	// goroutine only).
	viewRev, vipsRev int64
	sum              string
}

var _ control.Source = (*Source)(nil)

// NewSource returns a Source; nothing happens until Run.
func NewSource(cfg SourceConfig) (*Source, error) {
	if cfg.Client == nil {
		return nil, errors.New("fleet: SourceConfig.Client is nil")
	}
	k := newKeys(cfg.Prefix)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	key := k.document()
	if cfg.Host != "" {
		key = k.view(cfg.Host)
	}
	log = log.With("key", key)
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	t := control.NewTracker("etcd:"+key, "etcd", log)
	t.SetParse(cfg.Parse)
	return &Source{c: cfg.Client, k: k, log: log, retry: cfg.Retry, t: t, onOffer: cfg.OnOffer, host: cfg.Host,
		reload: make(chan struct{}, 1), ready: make(chan struct{})}, nil
}

// Status returns the running version and what went wrong last.
func (s *Source) Status() control.Status { return s.t.Status() }

// Document returns the running document, nil before the first apply.
func (s *Source) Document() *control.Document { return s.t.Document() }

// Ready is closed once Run has applied the first document.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// Reload asks Run to read the document again; it does not wait.
func (s *Source) Reload() {
	select {
	case s.reload <- struct{}{}:
	default:
	}
}

// Run reads and applies the document, waiting for etcd and for a
// document to be there, then watches it until ctx is done (then it
// returns nil). A first document that does not apply (invalid, refused)
// is an error: a node must not start without a valid configuration. Once
// running, nothing etcd does stops Run: while etcd is unreachable the
// node keeps its version, and Run reads the document again when etcd
// answers.
func (s *Source) Run(ctx context.Context, apply func(*control.Document) error) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("fleet: Source.Run called twice")
	}
	var rev int64
	for waiting := ""; ; {
		r, found, err := s.read(ctx, apply)
		if err == nil && found {
			if s.t.Document() != nil {
				rev = r
				break
			}
			return fmt.Errorf("fleet: first load: %w", s.t.Status().LastError)
		}
		// Each kind of wait is logged once.
		switch {
		case errors.Is(err, ErrNoCommittedView):
			if waiting != "complete" {
				s.log.Error("fleet: waiting for a complete apply", "err", err)
				waiting = "complete"
			}
		case err != nil:
			if waiting != "etcd" {
				s.log.Warn("fleet: waiting for etcd", "err", err)
				waiting = "etcd"
			}
		case waiting != "document":
			s.log.Warn("fleet: waiting for a document (write one with xdplbctl apply)")
			waiting = "document"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: first load: %w", ctx.Err())
		case <-time.After(s.retry):
		}
	}
	close(s.ready)
	for ctx.Err() == nil {
		rev = s.watch(ctx, rev, apply)
	}
	return nil
}

// read gets the document and its commit record at one revision and
// offers the document. It returns the store's revision (to watch from),
// whether a document is there, and an error if etcd did not answer.
func (s *Source) read(ctx context.Context, apply func(*control.Document) error) (int64, bool, error) {
	return s.readAt(ctx, apply, 0)
}

// readAt is read; a Host Agent's Source reads serializably (from its
// member, without a round of the cluster) when the member has reached
// revision min (a watch event's), else linearizably.
func (s *Source) readAt(ctx context.Context, apply func(*control.Document) error, min int64) (int64, bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s.host != "" {
		return s.readView(rctx, apply, min)
	}
	docs, commits, rev, err := readDocument(rctx, s.c, s.k)
	if err != nil {
		return 0, false, err
	}
	if len(docs) == 0 {
		return rev, false, nil
	}
	s.offer(docs[0], commits, apply)
	return rev, true, nil
}

// offer hands a document's text to the Tracker, with its revision and,
// when the commit record was written with it, its commit time.
// A document whose commit record gives the running document's content
// sum says what runs but for its version: the Tracker advances to it
// without a parse or an apply.
func (s *Source) offer(doc *mvccpb.KeyValue, commits []*mvccpb.KeyValue, apply func(*control.Document) error) {
	o := control.Origin{Revision: doc.ModRevision}
	var cm Commit
	for _, c := range commits {
		if c.ModRevision == doc.ModRevision {
			if m, ok := decodeCommit(c.Value); ok {
				cm, o.Committed = m, m.CommittedAt
			}
		}
	}
	if cm.Sum != "" && cm.Sum == s.sum && s.t.Document() != nil {
		s.t.Advance(cm.Version, o)
	} else if _, err := s.t.Offer(doc.Value, o, apply); err == nil {
		s.sum = cm.Sum
	}
	if s.onOffer != nil {
		s.onOffer()
	}
}

// watch watches the document from revision rev+1 until ctx is done, the
// watch fails, or a reload or retry is due; it returns the revision seen.
func (s *Source) watch(ctx context.Context, rev int64, apply func(*control.Document) error) int64 {
	// WithRequireLeader: a member cut off from its cluster cancels the
	// watch instead of going quiet, so the client moves to another one.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var wch clientv3.WatchChan
	if s.host != "" {
		// Only the commit record: a Host Agent must not be sent the
		// document.
		wch = s.c.Watch(wctx, s.k.viewsCommit(), clientv3.WithRev(rev+1))
	} else {
		wch = s.c.Watch(wctx, s.k.document(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	}
	var retry <-chan time.Time
	if s.t.Status().Reason == control.ReasonApply {
		retry = time.After(s.retry) // a refused apply is tried again
	}
	reread := func() int64 {
		r, _, err := s.read(ctx, apply)
		if err != nil {
			s.readFailed(err)
			s.pause(ctx)
			return rev
		}
		return r
	}
	for {
		select {
		case <-ctx.Done():
			return rev
		case <-s.reload:
			s.log.Info("fleet: reload requested")
			return reread()
		case <-retry:
			return reread()
		case resp, ok := <-wch:
			if !ok {
				s.pause(ctx)
				return rev
			}
			if err := resp.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) || resp.CompactRevision > 0 {
					s.log.Info("fleet: watch behind a compaction; reading the document again")
					return reread()
				}
				s.log.Warn("fleet: watch interrupted; keeping the running version", "err", err)
				s.pause(ctx)
				return rev
			}
			if s.host != "" {
				if len(resp.Events) > 0 {
					r, _, err := s.readAt(ctx, apply, resp.Header.Revision)
					if err != nil {
						// The next watch starts before this commit and
						// reads again on its event.
						s.readFailed(err)
						s.pause(ctx)
						return rev
					}
					if r > rev {
						rev = r
					}
				}
			} else {
				s.events(resp.Events, apply)
			}
			if resp.Header.Revision > rev {
				rev = resp.Header.Revision
			}
			if retry == nil && s.t.Status().Reason == control.ReasonApply {
				retry = time.After(s.retry)
			}
		}
	}
}

// readView reads the views' commit record, the host's view and views.vips
// (every view's last key, stored once), and offers the view followed by
// it as they were at the commit's revision (or advances the
// running one to the commit's version when its view did not change; or,
// when they were written since and etcd compacted that revision, offers
// the view of the committed document: committedView). It
// returns the store's revision, whether a commit is there, and an error if
// etcd did not answer.
//
// With min > 0 (a watch event of that revision came), it reads
// serializably: the member answers from what it has applied, without the
// round of the cluster a linearizable read costs (a thousand hosts read
// on every commit). A member behind min (the client may ask another
// member than its watch's) is read again linearizably.
func (s *Source) readView(ctx context.Context, apply func(*control.Document) error, min int64) (int64, bool, error) {
	view, vips := s.k.view(s.host), s.k.viewsVIPs()
	var opts []clientv3.OpOption
	if min > 0 {
		opts = append(opts, clientv3.WithSerializable())
	}
	// When the running view and VIP addresses are still there, only the
	// commit record comes back.
	resp, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(view), "=", s.viewRev),
		clientv3.Compare(clientv3.ModRevision(vips), "=", s.vipsRev)).
		Then(clientv3.OpGet(s.k.viewsCommit(), opts...)).
		Else(clientv3.OpGet(s.k.viewsCommit(), opts...), clientv3.OpGet(view, opts...), clientv3.OpGet(vips, opts...)).Commit()
	if err != nil {
		return 0, false, err
	}
	rev := resp.Header.Revision
	if rev < min {
		return s.readView(ctx, apply, 0)
	}
	commits := resp.Responses[0].GetResponseRange().Kvs
	if len(commits) == 0 {
		return rev, false, nil
	}
	cm, _ := decodeCommit(commits[0].Value)
	o := control.Origin{Revision: commits[0].ModRevision, Committed: cm.CommittedAt}
	defer func() {
		if s.onOffer != nil {
			s.onOffer()
		}
	}()
	var kv, vkv *mvccpb.KeyValue // the view, views.vips
	if !resp.Succeeded {
		kv, vkv = firstKV(resp.Responses[1]), firstKV(resp.Responses[2])
		if kv != nil && kv.ModRevision > o.Revision || vkv != nil && vkv.ModRevision > o.Revision {
			// Written since the commit: an apply under way (or one
			// that failed).
			if s.t.Document() != nil && s.t.Status().Revision == o.Revision {
				// The commit runs already: nothing to read.
				s.t.Advance(cm.Version, o)
				return rev, true, nil
			}
			// Both as committed:
			at, err := s.c.Txn(ctx).Then(clientv3.OpGet(view, append(opts, clientv3.WithRev(o.Revision))...),
				clientv3.OpGet(vips, append(opts, clientv3.WithRev(o.Revision))...)).Commit()
			if errors.Is(err, rpctypes.ErrCompacted) {
				// etcd compacted its history past the commit: make
				// the view from the document committed with it.
				return s.committedView(ctx, apply, o, cm.Version, opts)
			}
			if err != nil {
				return 0, false, err
			}
			kv, vkv = firstKV(at.Responses[0]), firstKV(at.Responses[1])
		}
	}
	switch {
	case resp.Succeeded && s.viewRev == 0, !resp.Succeeded && kv == nil:
		s.t.Refuse(fmt.Errorf("%w: version %d has no view under %s: is %q this host's name in hosts[]?",
			ErrNoView, cm.Version, view, s.host), control.ReasonInvalid)
		return rev, true, nil
	case resp.Succeeded, kv.ModRevision == s.viewRev && modRevOf(vkv) == s.vipsRev:
		// The running view is the committed one.
		s.t.Advance(cm.Version, o)
		return rev, true, nil
	case kv.ModRevision == s.viewRev && vkv != nil && s.amend(vkv, cm.Version, o, apply):
		return rev, true, nil
	}
	text, err := unpackView(kv.Value)
	if err == nil && vkv != nil {
		// The view's last key, the same in every view, stored once.
		var addrs []byte
		if addrs, err = unpackView(vkv.Value); err == nil {
			if len(text) > 0 && text[len(text)-1] != '\n' {
				text = append(text, '\n')
			}
			text = append(text, addrs...)
		}
	}
	if err != nil {
		s.t.Refuse(fmt.Errorf("version %d: %s: %w", cm.Version, view, err), control.ReasonInvalid)
		return rev, true, nil
	}
	// A view written by an earlier version than the commit's, read with
	// addresses the commit changed, is the commit's version of the view.
	text = withVersion(text, cm.Version)
	if _, err := s.t.Offer(text, o, apply); err != nil {
		return rev, true, nil // refused, recorded: the next commit tries again
	}
	s.viewRev, s.vipsRev = kv.ModRevision, modRevOf(vkv)
	if s.t.Status().Version < cm.Version {
		// The view was written by an earlier version than the commit's.
		s.t.Advance(cm.Version, o)
	}
	return rev, true, nil
}

// ErrNoCommittedView is returned (wrapped) by a Host Agent's Source that
// finds no complete version to run: an apply wrote views after the last
// commit and did not commit them (it failed half way, or is still under
// way), etcd compacted its history past that commit, so the views as
// committed are gone, and the document is not the one committed with
// them (it was written around Apply). It runs nothing new until an apply
// completes.
var ErrNoCommittedView = errors.New("fleet: no complete version of the host's view in etcd")

// committedView offers the host's view of the committed document, at
// the commit o of version v: what a Host Agent runs when its view or the
// VIP addresses were written since the commit by an apply that did not
// commit them, and etcd no longer holds them as committed (compacted).
// Apply writes the document with the commit record, in one transaction,
// so the document of the commit's revision is that version whole; it is
// read (the whole document, once, instead of a view) and the view made
// from it (HostView). It returns what readView returns.
func (s *Source) committedView(ctx context.Context, apply func(*control.Document) error, o control.Origin, v uint64, opts []clientv3.OpOption) (int64, bool, error) {
	doc := s.k.document()
	resp, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(doc), "=", o.Revision),
		clientv3.Compare(clientv3.ModRevision(s.k.viewsCommit()), "=", o.Revision)).
		Then(clientv3.OpGet(doc, opts...)).
		Else(clientv3.OpGet(s.k.viewsCommit(), append(opts, clientv3.WithKeysOnly())...)).Commit()
	if err != nil {
		return 0, false, err
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		if c := firstKV(resp.Responses[0]); c == nil || c.ModRevision != o.Revision {
			return 0, false, fmt.Errorf("fleet: %s: committed again while reading; reading again", s.k.viewsCommit())
		}
		return 0, false, fmt.Errorf("%w: version %d (revision %d): %s was written since by an apply that did not commit, "+
			"etcd compacted the revision it was committed at, and %s is not the document committed with it; "+
			"waiting for an apply to complete (xdplbctl apply)", ErrNoCommittedView, v, o.Revision, s.k.view(s.host), doc)
	}
	kv := firstKV(resp.Responses[0])
	d, err := control.Parse(kv.Value)
	if err == nil && d.Version != v {
		err = fmt.Errorf("version %d, not the commit's %d", d.Version, v)
	}
	var text []byte
	if err == nil {
		var hv *control.Document
		if hv, err = HostView(d, s.host); err == nil {
			text, err = hv.Marshal()
		}
	}
	if err != nil {
		s.t.Refuse(fmt.Errorf("version %d: the view made from %s: %w", v, doc, err), control.ReasonInvalid)
		return rev, true, nil
	}
	s.log.Warn("fleet: the view as committed is no longer in etcd's history and was written since by an apply that did not commit; "+
		"running the view made from the committed document", "version", v, "revision", o.Revision)
	if _, err := s.t.Offer(text, o, apply); err == nil {
		s.viewRev, s.vipsRev = 0, 0 // none stored: the next commit reads both
	}
	return rev, true, nil
}

// amend applies version v as the running view with the VIP addresses of
// vkv, without a parse (control.Tracker.Amend): what a VIP added or
// removed elsewhere in the fleet is to a host whose view it left as it
// was — a thousand of them on every such commit. It reports false, having
// done nothing, when the addresses are not in the form Apply writes
// (control.ReadVIPAddresses): the caller parses the view with them, which
// says what is wrong.
func (s *Source) amend(vkv *mvccpb.KeyValue, v uint64, o control.Origin, apply func(*control.Document) error) bool {
	text, err := unpackView(vkv.Value)
	if err != nil {
		return false
	}
	addrs, ok := control.ReadVIPAddresses(text)
	if !ok {
		return false
	}
	if ok, _ := s.t.Amend(v, o, func(d *control.Document) { d.VIPAddresses = addrs }, apply); ok {
		s.vipsRev = vkv.ModRevision
	}
	return true // applied, or refused and recorded as Offer would
}

// withVersion returns text with its first line, when it is a version
// line (Marshal writes it first) of a version below v, saying v.
func withVersion(text []byte, v uint64) []byte {
	line, rest, _ := bytes.Cut(text, []byte{'\n'})
	if old, ok := versionLine(line); !ok || old >= v {
		return text
	}
	out := make([]byte, 0, len(text)+8)
	out = fmt.Appendf(out, "version: %d\n", v)
	return append(out, rest...)
}

// firstKV is a range response's first key, nil when none.
func firstKV(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	if kvs := r.GetResponseRange().Kvs; len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}

// modRevOf is kv's ModRevision, 0 for none (what a Compare of a missing
// key's ModRevision sees).
func modRevOf(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// events offers the newest document put among evs (one transaction's
// events share a revision: the commit record goes with its document).
func (s *Source) events(evs []*clientv3.Event, apply func(*control.Document) error) {
	var doc *mvccpb.KeyValue
	var commits []*mvccpb.KeyValue
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		switch {
		case key == s.k.document() && ev.Type == clientv3.EventTypeDelete:
			s.log.Warn("fleet: the document was deleted from etcd; keeping the running version")
		case key == s.k.document():
			doc = ev.Kv
		case key == s.k.commit() && ev.Type == clientv3.EventTypePut:
			commits = append(commits, ev.Kv)
		}
	}
	if doc != nil {
		s.offer(doc, commits, apply)
	}
}

// readFailed logs why a running Source's read failed: it keeps the
// running version.
func (s *Source) readFailed(err error) {
	if errors.Is(err, ErrNoCommittedView) {
		s.log.Error("fleet: no complete version to read; keeping the running version", "err", err)
		return
	}
	s.log.Warn("fleet: etcd read failed; keeping the running version", "err", err)
}

func (s *Source) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(s.retry):
	}
}
