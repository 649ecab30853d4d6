package etcdlab

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// MemberEnv is the environment variable that tells RunMember which member
// to run: "DIR,N,I" is member I (from 0) of NewCluster(DIR, N).
const MemberEnv = "XDPLB_ETCDLAB_MEMBER"

// MemberEnv returns the MemberEnv=... setting that has RunMember run
// member i of c, for a process of its own (a test binary re-executed,
// say).
func (c Cluster) MemberEnv(i int) string {
	return fmt.Sprintf("%s=%s,%d,%d", MemberEnv, c.Dir(), len(c), i)
}

// RunMember runs the member MemberEnv names in this process, working in
// its cluster's directory, and calls ready (if not nil) once it serves.
// It stops the member and returns nil when ctx is done or when the
// process that started this one is gone (a member never outlives the
// test that started it); it returns an error if the member does not
// start within timeout or fails.
func RunMember(ctx context.Context, timeout time.Duration, ready func()) error {
	spec := os.Getenv(MemberEnv)
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		return fmt.Errorf("etcdlab: %s=%q: want DIR,N,I", MemberEnv, spec)
	}
	n, err1 := strconv.Atoi(f[1])
	i, err2 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return fmt.Errorf("etcdlab: %s=%q: want DIR,N,I with 0 ≤ I < N", MemberEnv, spec)
	}
	parent := os.Getppid()
	c := NewCluster(f[0], n)
	if err := os.Chdir(c.Dir()); err != nil {
		return err
	}
	e, err := c.Start(i, timeout)
	if err != nil {
		return err
	}
	defer e.Close()
	if ready != nil {
		ready()
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-e.Err():
			return fmt.Errorf("etcdlab: %s: %w", c[i].Name, err)
		case <-tick.C:
			if os.Getppid() != parent {
				return nil
			}
		}
	}
}
