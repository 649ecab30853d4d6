package fleet

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"sync"

	"github.com/xdplb/xdplb/control"
)

// A view is stored gzip-compressed (packView), as is views.vips: when
// every view listed every VIP, a change every view showed (a VIP added)
// wrote ~24 MB to etcd at 100 VIPs, ~1.2 s of an apply on its own;
// compressed (BestSpeed) it was about a tenth. A Source reads a plain
// YAML text too.

var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed) // the level is valid
	return w
}}

// packView compresses a view's text.
func packView(text []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(text)/4 + 64)
	w := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(w)
	w.Reset(&buf)
	w.Write(text) // a bytes.Buffer's writes do not fail
	w.Close()
	return buf.Bytes()
}

var gzipReaders sync.Pool // *gzip.Reader

// unpackView returns the text of a stored view: decompressed when it
// starts with gzip's magic, else as it is (a plain YAML text never
// starts with byte 0x1f). A text over control.MaxDocumentSize is an
// error, as the parser's limit. The readers are pooled: a thousand Host
// Agents unpack their view and views.vips on every commit that changed
// them, and a new reader's tables were most of an unpack.
func unpackView(stored []byte) ([]byte, error) {
	if len(stored) < 2 || stored[0] != 0x1f || stored[1] != 0x8b {
		return stored, nil
	}
	var r *gzip.Reader
	var err error
	if pr, ok := gzipReaders.Get().(*gzip.Reader); ok {
		r, err = pr, pr.Reset(bytes.NewReader(stored))
	} else {
		r, err = gzip.NewReader(bytes.NewReader(stored))
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: view: %w", err)
	}
	defer gzipReaders.Put(r)
	var buf bytes.Buffer
	buf.Grow(8 * len(stored))
	if _, err := buf.ReadFrom(io.LimitReader(r, control.MaxDocumentSize+1)); err != nil {
		return nil, fmt.Errorf("fleet: view: %w", err)
	}
	if buf.Len() > control.MaxDocumentSize {
		return nil, fmt.Errorf("fleet: view: more than %d bytes once decompressed", control.MaxDocumentSize)
	}
	return buf.Bytes(), nil
}
