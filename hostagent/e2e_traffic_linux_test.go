package hostagent_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/fleetlab"
	"github.com/xdplb/xdplb/internal/netlab"
)

// flBig is the size of the large transfers: far above the MTU, so that a
// sender with TSO on hands its veth segments of up to 64 KiB.
const flBig = 256 << 10

// TestFleetRealTraffic runs the fleet as the kernel sets it up — clients
// and VMs with checksum offload and TSO on, VMs resolving their gateway by
// ARP — and as the lab used to shape it (checksum offload off), and sends
// through the VIP, to every VM: a 256 KiB response (the VM's segments go
// through the Host Agent's return path), a 256 KiB POST (the client's
// segments go through a Mux and the Host Agent's inbound path), and small
// requests on new connections. Every byte must arrive intact, no namespace
// may count a TCP or UDP checksum error, and the data paths must have
// completed partial checksums exactly when offloads are on.
func TestFleetRealTraffic(t *testing.T) {
	for _, tc := range []struct {
		name        string
		offloadsOff bool
	}{
		{"default-offloads", false},
		{"offloads-off", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newFleetLab(t)
			if tc.offloadsOff {
				require.NoError(t, l.fleet.DisableOffloads())
			}
			partialBefore := l.partialCompleted()
			o := l.oracle()
			want := sha256.Sum256(fleetlab.Pattern(flBig))
			for _, vm := range l.pool {
				port := l.nextPort()
				for o.pick(port) != vm.Name {
					port = l.nextPort()
				}
				name, body, err := l.request(port, "GET", fmt.Sprintf("/bytes/%d", flBig), nil)
				require.NoError(t, err, "GET %d bytes from %s", flBig, vm.Name)
				require.Equal(t, vm.Name, name)
				require.True(t, bytes.Equal(fleetlab.Pattern(flBig), body), "%s: the %d-byte response arrived changed (%d bytes)", vm.Name, flBig, len(body))

				port = l.nextPort()
				for o.pick(port) != vm.Name {
					port = l.nextPort()
				}
				_, body, err = l.request(port, "POST", "/", fleetlab.Pattern(flBig))
				require.NoError(t, err, "POST %d bytes to %s", flBig, vm.Name)
				require.Equal(t, vm.Name+" "+hex.EncodeToString(want[:]), string(body), "%s: the server saw another body", vm.Name)
			}
			for i := range 64 {
				_, err := l.oneShot(l.nextPort(), fmt.Sprintf("small%d", i), 5*time.Second)
				require.NoError(t, err, "small request %d", i)
			}

			// No receiver saw a bad checksum.
			nss := []*netlab.NS{l.client}
			for _, vm := range l.pool {
				nss = append(nss, l.fleet.VMs[vm.Name])
			}
			for _, n := range nss {
				snmp, err := fleetlab.SNMP(n)
				require.NoError(t, err)
				for _, k := range []string{"Tcp.InCsumErrors", "Udp.InCsumErrors"} {
					require.Zero(t, snmp[k], "%s in %s", k, n.Name())
				}
			}
			// The partial-checksum path ran exactly when senders offload.
			partial := l.partialCompleted()
			for node, n := range partial {
				d := n - partialBefore[node]
				if tc.offloadsOff {
					require.Zero(t, d, "%s completed partial checksums with offloads off", node)
				} else {
					require.Positive(t, d, "%s completed no partial checksum with offloads on", node)
				}
			}
		})
	}
}

// request sends one HTTP request with a body on a new connection from
// port to the VIP and returns the name of the VM that answered (X-VM, or
// the answer's first word) and the response body.
func (l *fleetLab) request(port uint16, method, path string, body []byte) (string, []byte, error) {
	c, err := l.dial(port, 5*time.Second)
	if err != nil {
		return "", nil, err
	}
	defer c.close()
	if err := c.c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return "", nil, err
	}
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", method, path, flVIP, len(body))
	if _, err := io.WriteString(c.c, req); err != nil {
		return "", nil, err
	}
	if _, err := c.c.Write(body); err != nil {
		return "", nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", nil, fmt.Errorf("after %d bytes: %w", len(got), err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	name := resp.Header.Get("X-VM")
	if name == "" {
		name, _, _ = strings.Cut(string(got), " ")
	}
	return name, got, nil
}

// partialCompleted returns, per node, the frames whose partial checksum
// its data path completed (xdplb_partial_checksums_total, all inputs).
func (l *fleetLab) partialCompleted() map[string]float64 {
	l.t.Helper()
	out := map[string]float64{}
	sum := func(node string, m map[string]float64, err error) {
		require.NoError(l.t, err, node)
		for k, v := range m {
			if strings.HasPrefix(k, "xdplb_partial_checksums_total") {
				out[node] += v
			}
		}
	}
	for i := range l.muxes {
		m, err := l.muxMetrics(i)
		sum(fmt.Sprintf("mux%d", i+1), m, err)
	}
	for j := range l.agents {
		m, err := l.agentMetrics(j)
		sum(fmt.Sprintf("host%d", j+1), m, err)
	}
	return out
}
