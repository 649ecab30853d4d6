//go:build linux

package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Capabilities the nodes keep at run time (see DropCapabilities).
const (
	CapNetAdmin = unix.CAP_NET_ADMIN // netlink: neighbour resolution (NTF_USE), XDP attach and detach
	CapNetRaw   = unix.CAP_NET_RAW   // AF_XDP sockets (a Host Agent rebuild opens new ones)
	CapBPF      = unix.CAP_BPF       // BPF map updates (steering rules, XSKMAP), program loads on rebuild
	CapIPCLock  = unix.CAP_IPC_LOCK  // AF_XDP UMEM registration without RLIMIT_MEMLOCK accounting
	CapPerfmon  = unix.CAP_PERFMON   // the verifier allows the steering program's pointer arithmetic
	// CapNetBindService lets a Mux's BGP speaker listen on port 179
	// (bgp.listen_port's default, below 1024).
	CapNetBindService = unix.CAP_NET_BIND_SERVICE
)

// MuxCaps is what a Mux keeps once its data path runs: it opens no
// data-path socket and loads no program afterwards, but updates the
// steering program's maps on every reload, resolves next hops over
// netlink, detaches the program when it stops, and starts its BGP speaker
// (listening on port 179) when a later document is the first with a bgp
// section.
var MuxCaps = []uintptr{CapNetAdmin, CapNetRaw, CapBPF, CapNetBindService}

// HostAgentCaps is what a Host Agent keeps: a document that changes its
// data path's structure makes it load programs (the verifier refuses the
// steering program's pointer arithmetic without CAP_PERFMON), open
// AF_XDP sockets (whose UMEMs are locked memory) and attach them again.
var HostAgentCaps = []uintptr{CapNetAdmin, CapNetRaw, CapBPF, CapPerfmon, CapIPCLock}

// ErrCgo is returned by DropCapabilities in a binary built with cgo: Go
// can then not change the capabilities of every thread (capabilities
// belong to each thread; syscall.AllThreadsSyscall refuses to run with cgo).
var ErrCgo = errors.New("capabilities are per thread and Go cannot change every thread's in a cgo binary: build with CGO_ENABLED=0 (or -tags netgo)")

// DropCapabilities reduces the capabilities of every thread of the
// process to keep: the permitted and effective sets become keep, the
// inheritable and ambient sets empty, every other capability leaves the
// bounding set (so no execve can bring it back), and no_new_privs is set.
// It then reads
// /proc/self/task/*/status and fails unless every thread shows exactly
// keep as CapEff and CapPrm.
//
// Capabilities belong to threads, and the Go runtime runs many; the
// changes are made on all of them at once with syscall.AllThreadsSyscall,
// which a cgo binary cannot use (ErrCgo).
func DropCapabilities(keep ...uintptr) error {
	var want uint64
	for _, c := range keep {
		want |= 1 << c
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	all := func(trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			if e == syscall.ENOTSUP {
				return ErrCgo
			}
			return e
		}
		return nil
	}
	if err := all(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	for c := uintptr(0); c <= last; c++ {
		if want&(1<<c) != 0 {
			continue
		}
		if err := all(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	data[0].Permitted, data[0].Effective = uint32(want), uint32(want)
	data[1].Permitted, data[1].Effective = uint32(want>>32), uint32(want>>32)
	if err := all(unix.SYS_CAPSET, uintptr(unsafePointer(&hdr)), uintptr(unsafePointer(&data[0])), 0); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := all(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return checkThreads(os.Getpid(), want)
}

// checkThreads fails unless every thread of process pid has exactly want
// as its effective and permitted capabilities.
func checkThreads(pid int, want uint64) error {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("list the threads: %v", err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited
			}
			return err
		}
		caps, err := ParseCaps(b)
		if err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
		if caps["CapEff"] != want || caps["CapPrm"] != want {
			return fmt.Errorf("%s: CapEff %016x CapPrm %016x, want %016x", t, caps["CapEff"], caps["CapPrm"], want)
		}
	}
	return nil
}

// ParseCaps returns the Cap* lines (CapInh, CapPrm, CapEff, CapBnd,
// CapAmb) of a /proc/PID/status file.
func ParseCaps(status []byte) (map[string]uint64, error) {
	caps := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasPrefix(k, "Cap") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		caps[k] = n
	}
	if _, ok := caps["CapEff"]; !ok {
		return nil, errors.New("no CapEff line")
	}
	return caps, sc.Err()
}

func lastCap() (uintptr, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 8)
	if err != nil || n > 63 {
		return 0, fmt.Errorf("cap_last_cap %q", b)
	}
	return uintptr(n), nil
}

// CapNames names capabilities as capabilities(7) does, lower case and
// comma-separated ("cap_net_admin,cap_bpf").
func CapNames(caps []uintptr) string {
	names := map[uintptr]string{CapNetAdmin: "cap_net_admin", CapNetRaw: "cap_net_raw", CapBPF: "cap_bpf", CapIPCLock: "cap_ipc_lock", CapPerfmon: "cap_perfmon",
		CapNetBindService: "cap_net_bind_service"}
	var out []string
	for _, c := range caps {
		if n, ok := names[c]; ok {
			out = append(out, n)
		} else {
			out = append(out, "cap_"+strconv.Itoa(int(c)))
		}
	}
	return strings.Join(out, ",")
}
