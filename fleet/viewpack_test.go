package fleet

import (
	"bytes"
	"compress/gzip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xdplb/xdplb/control"
)

func TestViewPack(t *testing.T) {
	text := []byte("version: 3\nvips:\n" + strings.Repeat("- name: a\n  address: 198.18.0.1\n  protocol: tcp\n  port: 80\n", 50))
	packed := packView(text)
	assert.Less(t, len(packed), len(text)/4, "compressed")
	got, err := unpackView(packed)
	require.NoError(t, err)
	assert.Equal(t, text, got)

	got, err = unpackView(text)
	require.NoError(t, err)
	assert.Equal(t, text, got, "a plain text is read as it is")

	_, err = unpackView(append([]byte{0x1f, 0x8b}, "not gzip"...))
	assert.Error(t, err, "a damaged view")
	_, err = unpackView(packed[:len(packed)-6])
	assert.Error(t, err, "a truncated view")

	var bomb bytes.Buffer
	w := gzip.NewWriter(&bomb)
	w.Write(bytes.Repeat([]byte("#"), control.MaxDocumentSize+1))
	w.Close()
	_, err = unpackView(bomb.Bytes())
	assert.ErrorContains(t, err, "decompressed", "a view larger than a document may be")

	// The readers are pooled: one that failed, or read another text,
	// reads the next one whole.
	other := []byte("vip_addresses:\n  - 198.18.0.1\n")
	for range 3 {
		for _, want := range [][]byte{text, other} {
			_, err = unpackView(packed[:len(packed)-6])
			assert.Error(t, err)
			got, err := unpackView(packView(want))
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got))
		}
	}
}
