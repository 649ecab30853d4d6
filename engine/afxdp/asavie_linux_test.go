//go:build linux

package afxdp

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestAsavieSendtoErrno: kick recovers asavie's sendto panic only, with
// its errno; any other panic value goes on.
func TestAsavieSendtoErrno(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    any
		want unix.Errno
		ok   bool
	}{
		{"ENETDOWN", fmt.Errorf("sendto failed with rc=%d and errno=%d", uint64(1<<64-1), 100), unix.ENETDOWN, true},
		{"ENOBUFS", fmt.Errorf("sendto failed with rc=%d and errno=%d", uint64(1<<64-1), int(unix.ENOBUFS)), unix.ENOBUFS, true},
		{"another error", errors.New("mmap failed"), 0, false},
		{"no errno", errors.New("sendto failed with rc=1 and errno=x"), 0, false},
		{"not an error", "sendto failed with rc=1 and errno=100", 0, false},
		{"nil", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := asavieSendtoErrno(tc.r)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, e)
		})
	}
}
