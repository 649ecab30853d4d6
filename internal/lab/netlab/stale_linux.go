package netlab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Leftovers lists what exists with the given prefix: every namespace under
// NetnsDir named prefix-* ("netns NAME") and every interface in the caller's
// namespace whose name starts with prefix ("link NAME"). A Lab never creates
// interfaces outside its namespaces, so after Close the list should be empty
// for its prefix, unless another live run uses the same prefix.
func Leftovers(prefix string) []string {
	var out []string
	for _, name := range netnsNames(prefix) {
		out = append(out, "netns "+name)
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if n := l.Attrs().Name; strings.HasPrefix(n, prefix) {
			out = append(out, "link "+n)
		}
	}
	sort.Strings(out)
	return out
}

// netnsNames returns the names under NetnsDir that start with prefix-.
func netnsNames(prefix string) []string {
	ents, err := os.ReadDir(NetnsDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// CleanupStale removes namespaces named prefix-* whose creating process
// (encoded in the name) no longer exists: what a crashed or killed run left
// behind. It kills processes still inside them first. Namespaces of live
// processes, including this one, are left alone, so it is safe to call while
// other test binaries run. (A recycled pid makes a stale namespace look
// live; it is then removed on a later call.)
func CleanupStale(prefix string) error {
	var errs []error
	for _, name := range netnsNames(prefix) {
		run, _, ok := strings.Cut(strings.TrimPrefix(name, prefix+"-"), "-")
		if !ok {
			continue
		}
		pid, ok := ownerPID(run)
		if !ok || processAlive(pid) {
			continue
		}
		path := filepath.Join(NetnsDir, name)
		if ino, err := nsInode(path); err == nil {
			errs = append(errs, killInNetns(ino))
		}
		errs = append(errs, unmountRemove(path))
	}
	return errors.Join(errs...)
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// nsInode returns the nsfs inode number of the namespace mounted at path.
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// killInNetns sends SIGKILL to every other process whose network namespace
// has inode ino.
func killInNetns(ino uint64) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	want := fmt.Sprintf("net:[%d]", ino)
	self := os.Getpid()
	var errs []error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		l, err := os.Readlink("/proc/" + e.Name() + "/ns/net")
		if err != nil || l != want {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}
