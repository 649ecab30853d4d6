package control

import "context"

// Source keeps a node on the newest valid version of its document, from
// wherever the fleet keeps it: a file (Watcher) or a store shared by the
// fleet (package fleet's etcd source). Every Source follows the same rules
// (see Watcher): apply is called with validated documents of increasing
// versions only, one at a time from Run's goroutine; a document that is
// invalid, not newer, or refused by apply keeps the running version and is
// recorded in Status; and the node's data path never waits for the Source
// — a node whose Source loses its store keeps running its last applied
// version.
type Source interface {
	// Run applies the first document, then every newer one, until ctx
	// is done (then it returns nil). It returns an error if the first
	// document cannot be applied: a node must not start without a valid
	// configuration. Run may be called only once.
	Run(ctx context.Context, apply func(*Document) error) error
	// Ready is closed once Run has applied the first document.
	Ready() <-chan struct{}
	// Reload asks Run to read the document again (SIGHUP); it does not
	// wait.
	Reload()
	// Status is the running version and what went wrong last.
	Status() Status
	// Document is the running document, nil before the first apply.
	Document() *Document
}

var _ Source = (*Watcher)(nil)
