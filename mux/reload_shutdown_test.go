package mux

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/bgp"
	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/engine/steer"
)

// gateSteering is a Steering whose Syncs, once armed (entered and release
// set before the Sync), stop until release is closed; the first one closes
// entered. The controller syncs the steering rules in the middle of Apply,
// so an apply stopped there has started its speaker and not yet made it
// the Mux's announcer.
type gateSteering struct {
	entered, release chan struct{}
	once             sync.Once
}

func (g *gateSteering) Sync(steer.Config) error {
	if g.entered != nil {
		g.once.Do(func() { close(g.entered) })
		<-g.release
	}
	return nil
}

// TestReloadDuringShutdownLeavesNoSpeaker: a reload that brings the first
// bgp section while the Mux shuts down leaves no speaker running. Run's
// ordered shutdown stops the speaker (shutdownBGP) while the watcher still
// applies documents, until the data path has stopped; a speaker a reload
// started in that window was never stopped, since the binary exits right
// after — but a program that embeds the Mux goes on, with the speaker's
// sessions and listener. Now a reload after shutdownBGP starts no speaker
// (the version is refused, as every version with a bgp section is once a
// running speaker is shut down), and one under way when shutdownBGP ran
// stops the speaker it started (the controller runs the version already).
//
// The speaker's peers are passive, which it never dials, and it listens
// on a free port of 127.0.0.1 only, where nothing connects: the test sends
// no packet. (The peers were once link-local addresses without an
// interface, which the kernel refuses to dial; the document refuses those
// now.) What a speaker left running shows is its peers' goroutines.
func TestReloadDuringShutdownLeavesNoSpeaker(t *testing.T) {
	const peers = 8
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	var doc strings.Builder
	fmt.Fprintf(&doc, "version: 2\nbgp:\n  asn: 65010\n  router_id: 198.18.0.10\n  listen_port: %d\n  listen_addresses: [127.0.0.1]\n  peers:\n", port)
	for i := range peers {
		fmt.Fprintf(&doc, "    - {address: \"2001:db8::%d\", asn: 65000, passive: true}\n", i+1)
	}
	v2, err := control.Parse([]byte(doc.String()))
	require.NoError(t, err)

	// The ways out: Run's ordered shutdown (shutdownBGP), and the data
	// path's failure, which withdraws every VIP at once (withdrawAll) before
	// shutdownBGP: a reload in between started a speaker that announced,
	// and its shutdown then waited the grace period with nothing
	// forwarding.
	shutdown, failed := (*Mux).shutdownBGP, (*Mux).withdrawAll
	tests := []struct {
		name     string
		stop     func(*Mux)
		underWay bool  // the reload has started its speaker when stop runs
		wantErr  error // apply's
		version  uint64
	}{
		{"reload after shutdown began", shutdown, false, bgp.ErrClosed, 1},
		{"reload under way when shutdown began", shutdown, true, nil, 2},
		{"reload after the data path failed", failed, false, bgp.ErrClosed, 1},
		{"reload under way when the data path failed", failed, true, nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newIdleMux(t)
			ctx := context.Background()
			st := &gateSteering{}
			require.NoError(t, m.ctl.SetSteering(st))
			defer func() { // a speaker the test failed on stops anyway
				m.mu.Lock()
				a := m.announcer
				m.mu.Unlock()
				if a != nil {
					_ = a.Shutdown(context.Background())
				}
			}()

			before := runtime.NumGoroutine()
			if tt.underWay {
				st.entered, st.release = make(chan struct{}), make(chan struct{})
				done := make(chan error, 1)
				go func() { done <- m.apply(ctx, v2) }()
				select {
				case <-st.entered:
				case err := <-done:
					require.FailNow(t, "apply returned before it synced the steering rules", "err: %v", err)
				case <-time.After(30 * time.Second): // hang guard
					require.FailNow(t, "apply never synced the steering rules")
				}
				tt.stop(m) // the speaker is not the Mux's yet: nothing to stop here
				close(st.release)
				err = <-done
			} else {
				tt.stop(m)
				err = m.apply(ctx, v2)
			}
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.EqualValues(t, tt.version, m.ctl.Document().Version, "the version the controller runs")
			m.mu.Lock()
			a := m.announcer
			m.mu.Unlock()
			require.True(t, a == nil, "a speaker became the Mux's announcer after its shutdown")
			require.Nil(t, m.unstarted)
			// A running speaker keeps goroutines for each of its peers; a
			// stopped one only GoBGP's event loop, which GoBGP cannot end.
			require.Eventually(t, func() bool { return runtime.NumGoroutine()-before < peers },
				10*time.Second, 10*time.Millisecond, "goroutines left: %d more than before", runtime.NumGoroutine()-before)
		})
	}
}
