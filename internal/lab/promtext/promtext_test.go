package promtext_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/internal/lab/promtext"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]float64
		err      bool
	}{
		{"empty", "", map[string]float64{}, false},
		{"samples and comments", "# HELP x y\n# TYPE x counter\n" +
			`xdplb_packets_total{direction="rx"} 12` + "\n" +
			"xdplb_datapath_up 1\n\nxdplb_nat_table_entries 3.5e+06\n",
			map[string]float64{`xdplb_packets_total{direction="rx"}`: 12, "xdplb_datapath_up": 1, "xdplb_nat_table_entries": 3.5e6}, false},
		{"label value with a blank", `m{l="a b"} 2` + "\n", map[string]float64{`m{l="a b"}`: 2}, false},
		{"no value", "lonely\n", nil, true},
		{"bad value", "m x\n", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := promtext.Parse(strings.NewReader(tc.in))
			if tc.err {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
