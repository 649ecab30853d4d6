package fleet

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// txnHook is etcd's KV whose transactions, built as usual, commit through
// commit, which is given the transaction and its Then operations and may
// commit it, fail it, or both: the one wrapper under the tests' scripted,
// failing, counting and racing KVs.
type txnHook struct {
	clientv3.KV
	commit func(txn clientv3.Txn, then []clientv3.Op) (*clientv3.TxnResponse, error)
}

func (h txnHook) Txn(ctx context.Context) clientv3.Txn {
	return &hookedTxn{Txn: h.KV.Txn(ctx), commit: h.commit}
}

type hookedTxn struct {
	clientv3.Txn
	then   []clientv3.Op
	commit func(clientv3.Txn, []clientv3.Op) (*clientv3.TxnResponse, error)
}

func (t *hookedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *hookedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *hookedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *hookedTxn) Commit() (*clientv3.TxnResponse, error) { return t.commit(t.Txn, t.then) }
