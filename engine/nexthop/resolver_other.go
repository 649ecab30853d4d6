//go:build !linux

package nexthop

import "context"

// sysState is empty off Linux.
type sysState struct{}

func (s *sysState) close() error { return nil }

// NewResolver returns ErrNotSupported: next-hop resolution reads the Linux
// FIB and neighbour tables over netlink.
func NewResolver(cfg Config) (*Resolver, error) { return nil, ErrNotSupported }

// Run returns ErrNotSupported.
func (r *Resolver) Run(ctx context.Context) error { return ErrNotSupported }
