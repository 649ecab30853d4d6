package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// fleet's document. It refuses a version that is not above the stored
// one (control.ErrStaleVersion), and writes with a compare-and-swap
// transaction on the stored revision, so a concurrent Apply makes one of
// them fail (ErrConcurrentWrite) rather than lose a change. by says who
// writes (user@host). It returns the revision written.
//
// While etcd cannot answer for a moment (a leader election), Apply tries
// again until ctx is done: it reads the document again and writes only if
// the document it read is still there; when the failed write took effect
// after all, it finds its own document stored and returns its revision.
func Apply(ctx context.Context, c *clientv3.Client, prefix string, text []byte, doc *control.Document, by string) (int64, error) {
	if doc == nil {
		return 0, errors.New("fleet: Apply without a parsed document")
	}
	if len(text) > control.MaxDocumentSize {
		return 0, fmt.Errorf("fleet: document of %d bytes, above the %d-byte limit", len(text), control.MaxDocumentSize)
	}
	cur, err := Get(ctx, c, prefix)
	if err != nil {
		return 0, err
	}
	for {
		rev, err := applyOn(ctx, c, prefix, cur, text, doc, by)
		if !unavailable(err) {
			return rev, err
		}
		// The write may or may not have taken effect.
		if serr := pause(ctx, err); serr != nil {
			return 0, serr
		}
		now, gerr := Get(ctx, c, prefix)
		if gerr != nil {
			return 0, gerr
		}
		if now.Revision != cur.Revision && bytes.Equal(now.Text, text) {
			return now.Revision, nil // it did
		}
		if now.Revision != cur.Revision {
			return 0, ErrConcurrentWrite
		}
	}
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

// applyOn writes text over cur, what Apply read.
func applyOn(ctx context.Context, c *clientv3.Client, prefix string, cur Stored, text []byte, doc *control.Document, by string) (int64, error) {
	k := newKeys(prefix)
	if cur.Doc != nil && doc.Version <= cur.Doc.Version {
		return 0, fmt.Errorf("%w: version %d is not above the fleet's version %d (revision %d); bump version",
			control.ErrStaleVersion, doc.Version, cur.Doc.Version, cur.Revision)
	}
	commit, _ := json.Marshal(Commit{Version: doc.Version, CommittedAt: time.Now().UTC(), By: by})
	cmp := clientv3.Compare(clientv3.ModRevision(k.document()), "=", cur.Revision)
	if cur.Revision == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(k.document()), "=", 0)
	}
	resp, err := c.Txn(ctx).If(cmp).
		Then(clientv3.OpPut(k.document(), string(text)), clientv3.OpPut(k.commit(), string(commit))).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("fleet: write %s: %w", k.document(), err)
	}
	if !resp.Succeeded {
		return 0, ErrConcurrentWrite
	}
	return resp.Header.Revision, nil
}
