package fleetlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// AttachKernelVXLAN makes k's host: a namespace called k.Name joined to
// the router (Attach, interface rif on the router, subnet subnet), set up
// by k's own recipe, the `ip` commands (Commands, run with iproute2's ip
// in the namespace) and the sysctls (Sysctls). k.Addr must be the node's
// address on that subnet (SubnetAddr(subnet, 2)) and k.Uplink "up".
func (s *Star) AttachKernelVXLAN(k KernelVXLAN, rif string, subnet int) (*netlab.NS, error) {
	if k.Addr != SubnetAddr(subnet, 2) || k.Uplink != "up" {
		return nil, fmt.Errorf("%s: a star node is %v on \"up\", not %v on %q", k.Name, SubnetAddr(subnet, 2), k.Addr, k.Uplink)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("%s: the kernel VXLAN host needs iproute2's ip: %w", k.Name, err)
	}
	n, err := s.Attach(k.Name, rif, subnet)
	if err != nil {
		return nil, err
	}
	for _, args := range k.Commands() {
		if out, err := n.Command(context.Background(), "ip", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: ip %s: %w\n%s", k.Name, strings.Join(args, " "), err, out)
		}
	}
	for _, kv := range k.Sysctls() {
		if err := n.SetSysctl(kv[0], kv[1]); err != nil {
			return nil, fmt.Errorf("%s: %w", k.Name, err)
		}
	}
	return n, nil
}

// KernelVXLANServer is a kernel VXLAN host's servers (ServeKernelVXLAN).
type KernelVXLANServer struct {
	servers []*VMServer
}

// ServeKernelVXLAN starts, in k's namespace n, the servers of the backend
// called name (ServeVM's: HTTP answering the name, UDP echo answering
// "name: payload"): on every VIP, HTTP on httpPort and the echo on
// echoPort (0: none), the VIP's own ports, since nothing translates them;
// and on the host's address HTTP on httpPort, for the Muxes' probes.
func ServeKernelVXLAN(n *netlab.NS, k KernelVXLAN, name string, httpPort, echoPort uint16) (*KernelVXLANServer, error) {
	s := &KernelVXLANServer{}
	addrs := append([]netip.Addr{}, k.VIPs...)
	for i, a := range append(addrs, k.Addr) {
		echo := echoPort
		if i == len(k.VIPs) {
			echo = 0 // the probe listener
		}
		v, err := ServeVM(n, name, a, httpPort, echo)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.servers = append(s.servers, v)
	}
	return s, nil
}

// Close stops the servers.
func (s *KernelVXLANServer) Close() error {
	var errs []error
	for _, v := range s.servers {
		errs = append(errs, v.Close())
	}
	return errors.Join(errs...)
}
