package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdplb/xdplb/control"
)

// ErrConcurrentWrite is returned by Apply when the document changed in
// etcd between Apply's read and its write: someone else applied first.
var ErrConcurrentWrite = errors.New("fleet: the document changed in etcd while applying; read it again (xdplbctl diff) and re-apply")

// Stored is the document etcd holds, as Get returns it.
type Stored struct {
	Doc      *control.Document // nil when etcd holds no document
	Text     []byte
	Revision int64 // the document's ModRevision
	Commit   Commit
	// Err is why the stored text does not parse (written by something
	// other than Apply); Doc is nil then.
	Err error
}

// Get reads the fleet's document and its commit record. While etcd
// cannot answer for a moment (a leader election after a member died: the
// etcd client does not retry the transaction this reads with), it tries
// again until ctx is done.
func Get(ctx context.Context, c *clientv3.Client, prefix string) (Stored, error) {
	k := newKeys(prefix)
	var docs, commits []*mvccpb.KeyValue
	err := retryUnavailable(ctx, func() (err error) {
		docs, commits, _, err = readDocument(ctx, c, k)
		return err
	})
	if err != nil {
		return Stored{}, fmt.Errorf("fleet: read %s: %w", k.document(), err)
	}
	var st Stored
	if len(docs) > 0 {
		st.Text, st.Revision = docs[0].Value, docs[0].ModRevision
		st.Doc, st.Err = control.Parse(st.Text)
	}
	if len(commits) > 0 {
		st.Commit, _ = decodeCommit(commits[0].Value)
	}
	return st, nil
}

// readDocument reads the document and its commit record at one revision
// (one transaction), and returns that revision.
func readDocument(ctx context.Context, c *clientv3.Client, k keys) (docs, commits []*mvccpb.KeyValue, rev int64, err error) {
	resp, err := c.Txn(ctx).Then(clientv3.OpGet(k.document()), clientv3.OpGet(k.commit())).Commit()
	if err != nil {
		return nil, nil, 0, err
	}
	return resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision, nil
}

// Apply writes text, a document that doc is the parse of (the caller
// parses it, e.g. with control.Load, so errors name its file), as the
// fleet's document, with every host's view of it (HostView). It refuses
// a version that is not above the stored one (control.ErrStaleVersion)
// and a document with vip_addresses (ErrViewApplied: a Host Agent's view,
// whose vips are one host's, not the fleet's), and writes with
// compare-and-swap transactions on the stored revision, so a concurrent
// Apply makes one of them fail (ErrConcurrentWrite, or
// ErrApplyInProgress while another one writes its views) rather than
// lose a change. by says who writes (user@host). It returns the revision
// written.
//
// A view that the new version leaves as it was (its sum, the version
// left out, is the stored one's) is not written again. The views that
// changed go in transactions of at most MaxTxnOps operations and
// maxTxnBytes bytes, under a claim (apply.claim, under a lease of this
// Apply); the document, its commit record and the views' commit record
// go last, in one transaction: a Host Agent reads its view at the
// commit's revision, so it never sees a half-written set. When the views
// that changed fit in the document's transaction, there is just that
// one.
//
// While etcd cannot answer for a moment (a leader election), Apply tries
// again until ctx is done: it reads the document again and writes only if
// the document it read is still there; when the failed write took effect
// after all, it finds its own document stored and returns its revision.
func Apply(ctx context.Context, c *clientv3.Client, prefix string, text []byte, doc *control.Document, by string) (int64, error) {
	return apply(ctx, c, prefix, text, doc, by, applyLimits{})
}

// MaxTxnOps is how many operations Apply puts in one transaction: etcd's
// default limit (--max-txn-ops).
const MaxTxnOps = 128

// maxTxnBytes bounds the views Apply puts in one transaction, well under
// etcd's default request limit (--max-request-bytes, 1.5 MiB).
const maxTxnBytes = 1 << 20

// ErrApplyInProgress is returned by Apply when another Apply is writing
// its views: try again once it is done (or its claim's lease expired).
var ErrApplyInProgress = errors.New("fleet: another apply is writing the fleet's views")

// claimTTL is the TTL of an Apply's claim lease, kept alive while it
// writes: a dead applier's claim is gone after it.
const claimTTL = 30 // seconds

// applyLimits are the transaction limits of an apply, and a hook for
// tests; zero values are the defaults.
type applyLimits struct {
	ops, bytes int
	// afterViews, if set, is called after each transaction of views
	// (numbered from 0); an error stops the apply there.
	afterViews func(n int) error
}

// ErrViewApplied is returned by Apply for a document with vip_addresses:
// a Host Agent's view (HostView, or a file written from one), not a
// fleet's document; every Mux would refuse it.
var ErrViewApplied = errors.New("fleet: the document has vip_addresses: it is a Host Agent's view, not the fleet's document")

func apply(ctx context.Context, c *clientv3.Client, prefix string, text []byte, doc *control.Document, by string, lim applyLimits) (int64, error) {
	if doc == nil {
		return 0, errors.New("fleet: Apply without a parsed document")
	}
	if len(doc.VIPAddresses) > 0 {
		return 0, fmt.Errorf("%w (its vips are only one host's; apply the fleet's document, which Apply writes the views from)", ErrViewApplied)
	}
	if len(text) > control.MaxDocumentSize {
		return 0, fmt.Errorf("fleet: document of %d bytes, above the %d-byte limit", len(text), control.MaxDocumentSize)
	}
	a := newApplier(c, prefix, text, doc, by, lim)
	defer a.release()
	cur, err := a.read(ctx)
	if err != nil {
		return 0, err
	}
	for {
		rev, err := a.write(ctx, cur)
		if !unavailable(err) {
			return rev, err
		}
		// The write may or may not have taken effect.
		if serr := pause(ctx, err); serr != nil {
			return 0, serr
		}
		now, gerr := a.read(ctx)
		if gerr != nil {
			return 0, gerr
		}
		if now.docRev != cur.docRev && bytes.Equal(now.docText, text) {
			return now.docRev, nil // it did
		}
		if now.docRev != cur.docRev {
			return 0, ErrConcurrentWrite
		}
		cur = now
	}
}

// applier is one Apply.
type applier struct {
	c     *clientv3.Client
	k     keys
	lim   applyLimits
	text  []byte
	doc   *control.Document
	by    string
	views *views

	// The claim, once taken: its lease and revision, and the nonce that
	// tells this Apply's claim from another's.
	lease    clientv3.LeaseID
	claimRev int64
	nonce    string
	stopKeep context.CancelFunc
}

func newApplier(c *clientv3.Client, prefix string, text []byte, doc *control.Document, by string, lim applyLimits) *applier {
	if lim.ops <= 0 {
		lim.ops = MaxTxnOps
	}
	if lim.bytes <= 0 {
		lim.bytes = maxTxnBytes
	}
	return &applier{c: c, k: newKeys(prefix), lim: lim, text: text, doc: doc, by: by, views: newViews(doc)}
}

// applyState is what an Apply reads, at one revision.
type applyState struct {
	docRev     int64
	docText    []byte
	version    uint64 // the stored document's, 0 when none
	commitRev  int64  // views.commit's ModRevision, 0 when none
	viewRevs   map[string]int64
	sums       map[string]*mvccpb.KeyValue
	vips       *mvccpb.KeyValue // views.vips, nil when none
	claimed    bool
	claimValue []byte
}

// read reads what the Apply needs, retrying while etcd cannot answer.
func (a *applier) read(ctx context.Context) (applyState, error) {
	k := a.k
	var st applyState
	err := retryUnavailable(ctx, func() error {
		resp, err := a.c.Txn(ctx).Then(clientv3.OpGet(k.document()), clientv3.OpGet(k.commit()),
			clientv3.OpGet(k.viewsCommit()), clientv3.OpGet(k.views(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(k.sums(), clientv3.WithPrefix()), clientv3.OpGet(k.claim()), clientv3.OpGet(k.viewsVIPs())).Commit()
		if err != nil {
			return err
		}
		r := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
		st = applyState{viewRevs: map[string]int64{}, sums: map[string]*mvccpb.KeyValue{}}
		var commit *mvccpb.KeyValue
		if kvs := r(0); len(kvs) > 0 {
			st.docRev, st.docText = kvs[0].ModRevision, kvs[0].Value
		}
		if kvs := r(1); len(kvs) > 0 {
			commit = kvs[0]
		}
		if kvs := r(2); len(kvs) > 0 {
			st.commitRev = kvs[0].ModRevision
		}
		for _, kv := range r(3) {
			st.viewRevs[strings.TrimPrefix(string(kv.Key), k.views())] = kv.ModRevision
		}
		for _, kv := range r(4) {
			st.sums[strings.TrimPrefix(string(kv.Key), k.sums())] = kv
		}
		if kvs := r(5); len(kvs) > 0 {
			st.claimed, st.claimValue = true, kvs[0].Value
		}
		if kvs := r(6); len(kvs) > 0 {
			st.vips = kvs[0]
		}
		// The stored version: its commit record's, written with it by
		// Apply, which spares parsing a large document; else the parse.
		if st.docText != nil {
			if cm, ok := decodeCommitKV(commit); ok && commit.ModRevision == st.docRev {
				st.version = cm.Version
			} else if d, err := control.Parse(st.docText); err == nil {
				st.version = d.Version
			}
		}
		return nil
	})
	if err != nil {
		return applyState{}, fmt.Errorf("fleet: read %s: %w", k.document(), err)
	}
	return st, nil
}

func decodeCommitKV(kv *mvccpb.KeyValue) (Commit, bool) {
	if kv == nil {
		return Commit{}, false
	}
	return decodeCommit(kv.Value)
}

// viewOps are the puts and deletes that bring the stored views to the
// new document's: a view is kept when it was committed with the stored
// document (views.commit written with it, the view not written since)
// and its stored sum is the new view's.
func (a *applier) viewOps(cur applyState) (ops [][]clientv3.Op, sizes []int, err error) {
	k := a.k
	trusted := cur.commitRev != 0 && cur.commitRev == cur.docRev
	names := make(map[string]bool, len(a.doc.Hosts))
	type changed struct {
		hi   int
		sum  string
		text []byte
		err  error
	}
	// Every view's sum, on every core (a thousand: ~35 ms on one).
	sums := make([][sha256.Size]byte, len(a.doc.Hosts))
	parallel(len(sums), func(hi int) { sums[hi] = a.views.sum(hi) })
	var todo []changed
	for hi := range a.doc.Hosts {
		h := a.doc.Hosts[hi].Name
		names[h] = true
		sum := hex.EncodeToString(sums[hi][:16])
		rev, stored := cur.viewRevs[h]
		if s := cur.sums[h]; trusted && stored && rev <= cur.commitRev && s != nil && s.ModRevision == rev && string(s.Value) == sum {
			continue
		}
		todo = append(todo, changed{hi: hi, sum: sum})
	}
	// Marshalling is most of an apply that changes every view (a
	// thousand views of a hundred VIPs: seconds on one core): on every
	// core.
	parallel(len(todo), func(i int) {
		if todo[i].text, todo[i].err = a.views.text(todo[i].hi); todo[i].err == nil {
			todo[i].text = packView(todo[i].text)
		}
	})
	for _, c := range todo {
		h := a.doc.Hosts[c.hi].Name
		if c.err != nil {
			return nil, nil, fmt.Errorf("fleet: view of host %q: %w", h, c.err)
		}
		ops = append(ops, []clientv3.Op{clientv3.OpPut(k.view(h), string(c.text)), clientv3.OpPut(k.sum(h), c.sum)})
		sizes = append(sizes, len(c.text)+len(c.sum)+2*len(k.view(h)))
	}
	// Every view's last key, vip_addresses, stored once: written when it
	// changed (or was written since the last commit), deleted when the
	// document has no VIP.
	addrs, err := a.views.addrsText()
	if err != nil {
		return nil, nil, fmt.Errorf("fleet: views' VIP addresses: %w", err)
	}
	switch old := cur.vips; {
	case addrs == nil && old != nil:
		ops = append(ops, []clientv3.Op{clientv3.OpDelete(k.viewsVIPs())})
		sizes = append(sizes, len(k.viewsVIPs()))
	case addrs != nil:
		if old != nil && trusted && old.ModRevision <= cur.commitRev {
			if text, err := unpackView(old.Value); err == nil && bytes.Equal(text, addrs) {
				break
			}
		}
		packed := packView(addrs)
		ops = append(ops, []clientv3.Op{clientv3.OpPut(k.viewsVIPs(), string(packed))})
		sizes = append(sizes, len(packed)+len(k.viewsVIPs()))
	}
	// Views (and sums) of hosts the document no longer lists, and those
	// a failed apply left.
	gone := map[string]bool{}
	for h := range cur.viewRevs {
		if !names[h] {
			gone[h] = true
		}
	}
	for h := range cur.sums {
		if !names[h] {
			gone[h] = true
		}
	}
	for _, h := range slices.Sorted(maps.Keys(gone)) {
		ops = append(ops, []clientv3.Op{clientv3.OpDelete(k.view(h)), clientv3.OpDelete(k.sum(h))})
		sizes = append(sizes, 2*len(k.view(h)))
	}
	return ops, sizes, nil
}

// parallel calls fn(i) for every i in [0, n), on every core.
func parallel(n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				fn(i)
			}
		})
	}
	wg.Wait()
}

// write writes the document and the views that changed over cur.
func (a *applier) write(ctx context.Context, cur applyState) (int64, error) {
	k := a.k
	if cur.docText != nil && a.doc.Version <= cur.version {
		return 0, fmt.Errorf("%w: version %d is not above the fleet's version %d (revision %d); bump version",
			control.ErrStaleVersion, a.doc.Version, cur.version, cur.docRev)
	}
	if cur.claimed && a.claimRev == 0 {
		return 0, a.inProgress(cur.claimValue)
	}
	groups, sizes, err := a.viewOps(cur)
	if err != nil {
		return 0, err
	}
	docCmp := clientv3.Compare(clientv3.ModRevision(k.document()), "=", cur.docRev)
	if cur.docRev == 0 {
		docCmp = clientv3.Compare(clientv3.CreateRevision(k.document()), "=", 0)
	}
	total, nops := len(a.text), 3
	for i := range groups {
		total += sizes[i]
		nops += len(groups[i])
	}
	var cmps []clientv3.Cmp
	var final []clientv3.Op
	if a.claimRev == 0 && total <= a.lim.bytes && nops <= a.lim.ops {
		// One transaction: no claim, but none of another Apply either.
		cmps = []clientv3.Cmp{docCmp, clientv3.Compare(clientv3.CreateRevision(k.claim()), "=", 0)}
		for _, g := range groups {
			final = append(final, g...)
		}
	} else {
		if err := a.takeClaim(ctx, cur, docCmp); err != nil {
			return 0, err
		}
		if err := a.writeViews(ctx, groups, sizes); err != nil {
			return 0, err
		}
		cmps = []clientv3.Cmp{docCmp, clientv3.Compare(clientv3.ModRevision(k.claim()), "=", a.claimRev)}
		final = append(final, clientv3.OpDelete(k.claim()))
	}
	cm := Commit{Version: a.doc.Version, CommittedAt: time.Now().UTC(), By: a.by}
	viewsCommit, _ := json.Marshal(cm)
	cm.Sum = contentSum(a.text, a.doc.Version)
	commit, _ := json.Marshal(cm)
	final = append(final, clientv3.OpPut(k.document(), string(a.text)), clientv3.OpPut(k.commit(), string(commit)),
		clientv3.OpPut(k.viewsCommit(), string(viewsCommit)))
	resp, err := a.c.Txn(ctx).If(cmps...).Then(final...).Commit()
	if err != nil {
		return 0, fmt.Errorf("fleet: write %s: %w", k.document(), err)
	}
	if !resp.Succeeded {
		if a.claimRev != 0 {
			return 0, fmt.Errorf("%w (or this apply's claim expired)", ErrConcurrentWrite)
		}
		return 0, ErrConcurrentWrite
	}
	a.claimRev = 0 // deleted with the commit
	return resp.Header.Revision, nil
}

// claim is what apply.claim holds.
type claim struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
	Nonce string    `json:"nonce"`
}

// takeClaim puts apply.claim under a new lease kept alive until release,
// on condition that none is there and the document is cur's.
func (a *applier) takeClaim(ctx context.Context, cur applyState, docCmp clientv3.Cmp) error {
	if a.claimRev != 0 {
		return nil // a write tried again
	}
	k := a.k
	if cur.claimed {
		return a.inProgress(cur.claimValue)
	}
	lease, err := a.c.Grant(ctx, claimTTL)
	if err != nil {
		return fmt.Errorf("fleet: claim %s: %w", k.claim(), err)
	}
	a.lease = lease.ID
	kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	a.stopKeep = stop
	if ch, err := a.c.KeepAlive(kctx, lease.ID); err == nil {
		go func() {
			for range ch {
			}
		}()
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	a.nonce = hex.EncodeToString(nonce[:])
	value, _ := json.Marshal(claim{By: a.by, Since: time.Now().UTC(), Nonce: a.nonce})
	return retryUnavailable(ctx, func() error {
		resp, err := a.c.Txn(ctx).If(docCmp, clientv3.Compare(clientv3.CreateRevision(k.claim()), "=", 0)).
			Then(clientv3.OpPut(k.claim(), string(value), clientv3.WithLease(lease.ID))).
			Else(clientv3.OpGet(k.claim())).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			a.claimRev = resp.Header.Revision
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return ErrConcurrentWrite // the document changed
		}
		var cl claim
		if json.Unmarshal(kvs[0].Value, &cl) == nil && cl.Nonce == a.nonce {
			a.claimRev = kvs[0].ModRevision // an earlier try took it
			return nil
		}
		return a.inProgress(kvs[0].Value)
	})
}

func (a *applier) inProgress(value []byte) error {
	var cl claim
	if json.Unmarshal(value, &cl) == nil {
		return fmt.Errorf("%w (by %s since %s)", ErrApplyInProgress, cl.By, cl.Since.Format(time.RFC3339))
	}
	return ErrApplyInProgress
}

// writeViews writes the groups of view operations (a group's operations
// go together) in transactions within the limits, each on condition that
// the claim is still this Apply's.
func (a *applier) writeViews(ctx context.Context, groups [][]clientv3.Op, sizes []int) error {
	held := clientv3.Compare(clientv3.ModRevision(a.k.claim()), "=", a.claimRev)
	n := 0
	flush := func(ops []clientv3.Op) error {
		err := retryUnavailable(ctx, func() error {
			resp, err := a.c.Txn(ctx).If(held).Then(ops...).Commit()
			if err == nil && !resp.Succeeded {
				err = fmt.Errorf("fleet: this apply's claim on %s was lost (its lease expired)", a.k.claim())
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("fleet: write views: %w", err)
		}
		if a.lim.afterViews != nil {
			if err := a.lim.afterViews(n); err != nil {
				return err
			}
		}
		n++
		return nil
	}
	var ops []clientv3.Op
	size := 0
	for i, g := range groups {
		if len(ops) > 0 && (len(ops)+len(g) > a.lim.ops || size+sizes[i] > a.lim.bytes) {
			if err := flush(ops); err != nil {
				return err
			}
			ops, size = nil, 0
		}
		ops = append(ops, g...)
		size += sizes[i]
	}
	if len(ops) > 0 {
		return flush(ops)
	}
	return nil
}

// release gives up the claim, if this Apply holds it still (it failed
// between its views and its commit), and its lease.
func (a *applier) release() {
	if a.lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if a.claimRev != 0 {
		_, _ = a.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(a.k.claim()), "=", a.claimRev)).
			Then(clientv3.OpDelete(a.k.claim())).Commit()
	}
	a.stopKeep()
	_, _ = a.c.Revoke(ctx, a.lease)
}

// unavailableRetry is how long Get and Apply wait before trying again
// when etcd could not answer.
const unavailableRetry = 100 * time.Millisecond

// unavailable reports whether err says etcd could not serve the request
// for now (gRPC's Unavailable: leader changed, no leader, no member
// reachable) rather than refused it.
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(rpctypes.Error(err), &ee) {
		return ee.Code() == codes.Unavailable
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable
}

// retryUnavailable calls fn until it returns anything but an unavailable
// error, or ctx is done (then it returns fn's last error).
func retryUnavailable(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if !unavailable(err) {
			return err
		}
		if serr := pause(ctx, err); serr != nil {
			return serr
		}
	}
}

// pause waits unavailableRetry; when ctx is done first it returns err.
func pause(ctx context.Context, err error) error {
	select {
	case <-ctx.Done():
		return err
	case <-time.After(unavailableRetry):
		return nil
	}
}
