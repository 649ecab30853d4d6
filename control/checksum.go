package control

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// checksumKey starts a checksum line; the value is "sha256:" and 64 hex
// digits.
const (
	checksumKey  = "checksum:"
	checksumAlgo = "sha256:"
)

// Seal returns the document data with a checksum line before its first
// key: "checksum: sha256:<hex>", the SHA-256 of every other byte of the
// result. A checksum line data already has is replaced; nothing else
// changes. A sealed document is never applied torn: Parse refuses any
// other content under that checksum, and so every prefix of the file, which
// is what a node may read while the file is written in place.
//
// Seal does not validate the document; Parse does. It suits a document
// that is a block mapping ("key: value" lines, as Marshal writes and every
// example is); one that starts with "---", a directive or a flow mapping
// ("{...}") no longer parses once sealed.
func Seal(data []byte) []byte {
	if c, ok := findChecksum(data); ok {
		data = append(append([]byte(nil), data[:c.start]...), data[c.end:]...)
	}
	at := firstKeyOffset(data)
	sum := sha256.Sum256(data)
	line := checksumKey + " " + checksumAlgo + hex.EncodeToString(sum[:]) + "\n"
	out := make([]byte, 0, len(data)+len(line))
	out = append(out, data[:at]...)
	out = append(out, line...)
	return append(out, data[at:]...)
}

// checksumLine is where a document's checksum line is.
type checksumLine struct {
	line       int // 1-based
	start, end int // byte range of the line, its newline included
	value      string
	valueCol   int // 1-based column of value
}

// firstKeyOffset returns the offset of the first line of data that is not
// blank or a comment (len(data) if there is none).
func firstKeyOffset(data []byte) int {
	at := 0
	for at < len(data) {
		end := bytes.IndexByte(data[at:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += at + 1
		}
		t := bytes.TrimLeft(data[at:end], " \t\r\n")
		if len(t) > 0 && t[0] != '#' {
			return at
		}
		at = end
	}
	return at
}

// findChecksum returns the checksum line if the first line of data that
// is not blank or a comment starts with "checksum:".
func findChecksum(data []byte) (checksumLine, bool) {
	at := firstKeyOffset(data)
	if !bytes.HasPrefix(data[at:], []byte(checksumKey)) {
		return checksumLine{}, false
	}
	end := bytes.IndexByte(data[at:], '\n')
	if end < 0 {
		end = len(data)
	} else {
		end += at + 1
	}
	raw := bytes.TrimRight(data[at+len(checksumKey):end], "\r\n")
	lead := len(raw) - len(bytes.TrimLeft(raw, " \t"))
	return checksumLine{
		line:     1 + bytes.Count(data[:at], []byte{'\n'}),
		start:    at,
		end:      end,
		value:    string(bytes.TrimSpace(raw)),
		valueCol: len(checksumKey) + lead + 1,
	}, true
}

// verifyChecksum checks a checksum line, when data has one, against the
// rest of data. It returns the line of the checksum (0 for none).
func verifyChecksum(name string, data []byte) (int, error) {
	c, ok := findChecksum(data)
	if !ok {
		return 0, nil
	}
	fail := func(format string, args ...any) (int, error) {
		return c.line, &FieldError{File: name, Line: c.line, Column: c.valueCol, Path: "checksum", Msg: fmt.Sprintf(format, args...)}
	}
	hexSum, ok := bytes.CutPrefix([]byte(c.value), []byte(checksumAlgo))
	want := make([]byte, sha256.Size)
	if !ok || len(hexSum) != hex.EncodedLen(sha256.Size) {
		return fail("%q is not a checksum (want sha256: and 64 hex digits, as control.Seal writes it)", c.value)
	}
	if _, err := hex.Decode(want, hexSum); err != nil {
		return fail("%q is not a checksum (want sha256: and 64 hex digits, as control.Seal writes it)", c.value)
	}
	h := sha256.New()
	h.Write(data[:c.start])
	h.Write(data[c.end:])
	if !bytes.Equal(h.Sum(nil), want) {
		return fail("the document does not match its checksum: the file is incomplete (still being written?) " +
			"or was edited without resealing it (control.Seal; or remove the checksum line)")
	}
	return c.line, nil
}
