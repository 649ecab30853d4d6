package control

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel errors. Every problem Parse finds is a *FieldError, which wraps
// ErrInvalid; Parse joins them (errors.Join), so errors.Is(err, ErrInvalid)
// holds for the whole and errors.As finds the first *FieldError.
var (
	// ErrInvalid marks a document that does not parse or validate.
	ErrInvalid = errors.New("control: invalid document")
	// ErrStaleVersion marks a valid document a Watcher did not apply
	// because its version is not above the running one.
	ErrStaleVersion = errors.New("control: version is not above the running version")
	// ErrVersionConflict marks a valid document a Watcher did not apply
	// because it has the running version but says something else: the
	// change was written without a version bump (or the running version
	// came from elsewhere). It also matches ErrStaleVersion.
	ErrVersionConflict error = versionConflict{}
)

type versionConflict struct{}

func (versionConflict) Error() string { return "control: same version, different content" }

// Is makes a conflict match ErrStaleVersion as well.
func (versionConflict) Is(target error) bool { return target == ErrStaleVersion }

// FieldError is one problem in a document, located by file position and
// field path, e.g.
//
//	web.yaml:14:7: vips[0].backends[2].mac: "02:00:00:00:01" is not a MAC address (want six hex pairs, e.g. 02:00:00:00:01:01)
type FieldError struct {
	File   string // file name, "" for Parse
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	Path   string // field path, e.g. "vips[0].backends[2].mac"; "" for the document
	Msg    string // what is wrong and what is wanted
}

// Error formats e as "file:line:col: path: msg", leaving out what is
// unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	pos := e.File
	if e.Line > 0 {
		if pos != "" {
			pos += ":"
		}
		pos += strconv.Itoa(e.Line)
		if e.Column > 0 {
			pos += ":" + strconv.Itoa(e.Column)
		}
	}
	if pos != "" {
		b.WriteString(pos)
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// suggest returns the known key closest to key, or "" when none is close:
// a typo (edit distance within a third of the length, at least 1) or an
// abbreviation (a prefix of at least three letters).
func suggest(key string, known []string) string {
	k := strings.ToLower(key)
	best, bestD := "", len(k)/3+1
	if bestD < 2 {
		bestD = 2
	}
	for _, c := range known {
		if d := editDistance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best != "" {
		return best
	}
	if len(k) >= 3 {
		for _, c := range known {
			if strings.HasPrefix(c, k) || strings.HasPrefix(k, c) {
				return c
			}
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b (bytes), with
// an adjacent transposition counted as one edit.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 20 // not a typo of a short key
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
