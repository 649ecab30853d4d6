package fleetlab_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/fleetlab"
)

func TestParseSNMP(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]int64
		err      string
	}{
		{"pairs", "Ip: Forwarding DefaultTTL\nIp: 1 64\nIcmpMsg: InType3\nIcmpMsg: 5\n" +
			"Tcp: RtoAlgorithm MaxConn InCsumErrors\nTcp: 1 -1 3\nUdp: InDatagrams InCsumErrors\nUdp: 10 0\n",
			map[string]int64{"Ip.Forwarding": 1, "Ip.DefaultTTL": 64, "IcmpMsg.InType3": 5,
				"Tcp.RtoAlgorithm": 1, "Tcp.MaxConn": -1, "Tcp.InCsumErrors": 3, "Udp.InDatagrams": 10, "Udp.InCsumErrors": 0}, ""},
		{"empty", "", map[string]int64{}, ""},
		{"short values", "Tcp: A B\nTcp: 1\n", nil, "snmp: Tcp: 1 values for 2 names"},
		{"not a number", "Udp: A\nUdp: x\n", nil, "snmp: Udp.A: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fleetlab.ParseSNMP(strings.NewReader(tc.in))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
