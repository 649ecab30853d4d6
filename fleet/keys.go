package fleet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix is the etcd key prefix of a fleet when none is given.
const DefaultPrefix = "/xdplb/"

// Roles a node reports in its status key.
const (
	RoleMux       = "mux"
	RoleHostAgent = "hostagent"
)

// keys are a fleet's etcd keys under one prefix. The document's and the
// status keys are here, the health keys in health.go, the outbound port
// allocation's in allockeys.go: a range's claim (ports/claims/, under
// its holder's lease) and its guard (ports/guards/, without a lease while
// the claim lives, then under a cooling lease of TTL + the longest
// connection timeout once another host saw the claim gone), so that a
// dead Host Agent's ports go to no other DIP while its connections'
// packets may still come back; the package documentation says why that
// is safe.
type keys struct{ prefix string }

func newKeys(prefix string) keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return keys{prefix}
}

func (k keys) document() string { return k.prefix + "document" }
func (k keys) commit() string   { return k.prefix + "document.commit" }
func (k keys) statuses() string { return k.prefix + "status/" }

// The per-host views (view.go, apply.go): views/<host> is a host's view
// of the document, views.sums/<host> its sum (written with it, read by
// Apply only), views.vips every view's last key, vip_addresses (the same
// in every view: stored once), views.commit the commit record of the set
// (written last, with the document), apply.claim the claim of an apply
// writing views in several transactions (under the applier's lease).
func (k keys) views() string           { return k.prefix + "views/" }
func (k keys) view(host string) string { return k.views() + host }
func (k keys) sums() string            { return k.prefix + "views.sums/" }
func (k keys) sum(host string) string  { return k.sums() + host }
func (k keys) viewsCommit() string     { return k.prefix + "views.commit" }
func (k keys) viewsVIPs() string       { return k.prefix + "views.vips" }
func (k keys) claim() string           { return k.prefix + "apply.claim" }
func (k keys) status(role, name string) string {
	return k.statuses() + role + "/" + name
}

// Commit is what the writer of a document records beside it, in the same
// transaction.
type Commit struct {
	Version     uint64    `json:"version"`
	CommittedAt time.Time `json:"committed_at"`
	// By says who wrote it (user@host), for status.
	By string `json:"by,omitempty"`
	// Sum is the document's content sum (contentSum: its text without
	// its version line), "" when the text has no version line of its
	// own. A Mux whose running document has the same sum advances to
	// Version without a parse or an apply.
	Sum string `json:"sum,omitempty"`
}

// contentSum is a digest of a document's text with its top-level version
// line left out (and a seal's checksum line, which follows the version):
// two texts of the same sum say the same but for their versions. It is ""
// unless the text has exactly one line "version: N" (N being version, the
// parsed document's; spaces allowed around N): only the top level of a
// document has a version key, and a flow-style top level may keep its
// version elsewhere, when the text is summed not at all.
func contentSum(text []byte, version uint64) string {
	h := sha256.New()
	found := 0
	for rest := text; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte{'\n'})
		if v, ok := versionLine(line); ok {
			if v != version {
				return ""
			}
			found++
			continue
		}
		if bytes.HasPrefix(line, []byte("checksum:")) {
			continue
		}
		h.Write(line)
		h.Write([]byte{'\n'})
	}
	if found != 1 {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// versionLine parses a line "version: N" (spaces or tabs around N, a
// trailing CR).
func versionLine(line []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(line, []byte("version:"))
	if !ok {
		return 0, false
	}
	rest = bytes.Trim(rest, " \t\r")
	v, err := strconv.ParseUint(string(rest), 10, 64)
	return v, err == nil && len(rest) > 0 && rest[0] != '+'
}

func decodeCommit(b []byte) (Commit, bool) {
	var c Commit
	if err := json.Unmarshal(b, &c); err != nil {
		return Commit{}, false
	}
	return c, true
}
