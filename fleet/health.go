package fleet

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// HealthKey names one probed DIP: its host, its tenant (VNI), its
// address and the port probed. Two tenants' DIPs with one address are two
// keys.
type HealthKey struct {
	Host string
	VNI  uint32
	Addr netip.Addr
	Port uint16
}

// HealthRecord is a host's verdict on one of its DIPs, as published.
type HealthRecord struct {
	Up     bool      `json:"up"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
}

func (k keys) healths() string { return k.prefix + "health/" }

func (k keys) hostHealth(host string) string { return k.healths() + host + "/" }

func (k keys) health(h HealthKey) string {
	return fmt.Sprintf("%s%d/%s/%d", k.hostHealth(h.Host), h.VNI, h.Addr, h.Port)
}

// parseHealthKey reads a key written by keys.health.
func (k keys) parseHealthKey(key string) (HealthKey, bool) {
	rest, ok := strings.CutPrefix(key, k.healths())
	if !ok {
		return HealthKey{}, false
	}
	f := strings.Split(rest, "/")
	if len(f) != 4 {
		return HealthKey{}, false
	}
	vni, err1 := strconv.ParseUint(f[1], 10, 32)
	addr, err2 := netip.ParseAddr(f[2])
	port, err3 := strconv.ParseUint(f[3], 10, 16)
	if f[0] == "" || err1 != nil || err2 != nil || err3 != nil {
		return HealthKey{}, false
	}
	return HealthKey{Host: f[0], VNI: uint32(vni), Addr: addr, Port: uint16(port)}, true
}

func decodeHealth(b []byte) (HealthRecord, bool) {
	var h HealthRecord
	return h, json.Unmarshal(b, &h) == nil
}
