package pktrate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
)

func TestMuxDocumentIsValid(t *testing.T) {
	doc, err := control.Parse([]byte(MuxDocument()))
	require.NoError(t, err)
	assert.Nil(t, doc.BGP)
	require.Len(t, doc.VIPs, 1)
	v := doc.VIPs[0]
	assert.Equal(t, VIPAddr, v.Address)
	assert.Equal(t, uint16(DstPort), v.Port)
	assert.EqualValues(t, flow.ProtoUDP, v.Protocol)
	assert.Equal(t, uint32(TunnelVNI), v.VNI)
	assert.Nil(t, v.Probe, "no probe: every backend counts as healthy")
	require.Len(t, v.Backends, len(MuxBackends))
	for i, b := range v.Backends {
		assert.Equal(t, MuxBackends[i].Addr, b.Address)
		assert.Equal(t, MuxBackends[i].Host, b.Host)
		assert.Equal(t, [6]byte(MuxBackends[i].MAC), b.MAC)
		assert.Equal(t, flow.BackendActive, b.State)
	}
	// Every backend is in the published rule, so Maglev spreads over all.
	rules := doc.Rules(nil)
	require.Len(t, rules, 1)
	assert.Len(t, rules[0].Backends, len(MuxBackends))
}
