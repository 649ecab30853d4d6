//go:build linux

package pktrate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// taskCPU returns thread tid's (of process pid) time on a CPU, from the
// first field of /proc/<pid>/task/<tid>/schedstat (nanoseconds, exact, as
// opposed to the tick-sampled utime/stime of /proc/<pid>/stat).
func taskCPU(pid, tid int) (time.Duration, error) {
	return readSchedstat(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
}

// procCPU sums the CPU time of every live thread of process pid.
func procCPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		d, err := readSchedstat(filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name(), "schedstat"))
		if err == nil { // a thread may exit while we look
			sum += d
		}
	}
	return sum, nil
}

func readSchedstat(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) == 0 {
		return 0, fmt.Errorf("pktrate: %s: empty", path)
	}
	ns, err := strconv.ParseUint(string(f[0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pktrate: %s: %w", path, err)
	}
	return time.Duration(ns), nil
}

// napiThreads returns the pids of the threaded-NAPI kernel threads of an
// interface: they are named napi/<ifname>-<napi id>. Interface names are
// per namespace, so the harness gives its interfaces names unique to the
// run. Kernel threads live in the initial pid namespace; from another pid
// namespace none are found.
func napiThreads(ifname string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	want := "napi/" + ifname + "-"
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if rest, ok := strings.CutPrefix(name, want); ok {
			if _, err := strconv.Atoi(rest); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out, nil
}

// processFIFO sets every thread of process pid SCHED_FIFO at prio (threads
// it starts later inherit the policy from the thread that starts them).
func processFIFO(pid, prio int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && err != unix.ESRCH {
			return fmt.Errorf("SCHED_FIFO for thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// threadsCPU sums the CPU time of kernel threads (or single-threaded
// processes) by pid.
func threadsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if d, err := readSchedstat(fmt.Sprintf("/proc/%d/schedstat", p)); err == nil {
			sum += d
		}
	}
	return sum
}

// softirqTime returns the machine's total softirq time from /proc/stat
// (tick-sampled, all CPUs). Used for the DUT's CPU when NAPI is not
// threaded, and then it also counts the generator's and the sink's softirq
// work: an upper bound, not the DUT's alone.
func softirqTime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	// cpu user nice system idle iowait irq softirq ...
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("pktrate: /proc/stat: unexpected first line %q", line)
	}
	ticks, err := strconv.ParseUint(f[7], 10, 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux ABI.
const clockTicks = 100
