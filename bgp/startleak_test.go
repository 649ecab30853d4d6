package bgp

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAnnouncerStartRetriesLeaveNoServers: Start tried again after it
// failed (its doc says it may be) runs one GoBGP server, not one per try.
// Before, every Start made a new server and its event loop, which GoBGP
// cannot end: a caller retrying a Start that keeps failing (its port in
// use) left a goroutine and a server behind on every try.
func TestAnnouncerStartRetriesLeaveNoServers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	a, err := New(Config{
		ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), Logger: testLogger(t),
		ListenPort: int32(l.Addr().(*net.TCPAddr).Port), ListenAddresses: []netip.Addr{loopback},
	})
	require.NoError(t, err)
	require.Error(t, a.Start(context.Background()), "the port is in use")
	before := runtime.NumGoroutine()
	const tries = 20
	for range tries {
		require.Error(t, a.Start(context.Background()))
	}
	require.Less(t, runtime.NumGoroutine()-before, tries/2, "goroutines left by %d failed Starts", tries)
	require.NoError(t, l.Close())
	require.NoError(t, a.Start(context.Background()))
	require.NoError(t, a.Shutdown(context.Background()))
}

// TestAnnouncerListenFailureLeavesNoServer: a Start whose listener cannot
// be opened fails before it makes a GoBGP server, so a caller that makes
// a new Announcer for each try (the Mux, on every retry of a version whose
// first speaker cannot start) leaves nothing behind. Before, every such
// Announcer left a server and its event loop, which GoBGP cannot end.
func TestAnnouncerListenFailureLeavesNoServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	cfg := Config{ASN: muxASN, RouterID: netip.MustParseAddr("198.18.0.10"), Logger: testLogger(t),
		ListenPort: int32(l.Addr().(*net.TCPAddr).Port), ListenAddresses: []netip.Addr{loopback}}
	before := runtime.NumGoroutine()
	const tries = 20
	for range tries {
		a, err := New(cfg)
		require.NoError(t, err)
		require.Error(t, a.Start(context.Background()), "the port is in use")
		require.NoError(t, a.Shutdown(context.Background()))
	}
	require.Less(t, runtime.NumGoroutine()-before, tries/2, "goroutines left by %d Announcers that failed to start", tries)
}
