package httptool

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// privateAddrError refuses a connection to a non-public address reached
// through a host name.
type privateAddrError struct {
	host string
	ip   netip.Addr
}

func (e *privateAddrError) Error() string {
	return fmt.Sprintf("%s resolves to %s, which is not a public address", e.host, e.ip)
}

// dialPublic connects to addr. A host given by name must resolve to public
// addresses only: a granted name pointing into this host or a private
// network (DNS rebinding, a cloud metadata service, the NATS port) is
// refused, unless allowPrivate. The checked address is the one dialled, so
// a second lookup cannot swap it. A host given as an IP literal was granted
// as that address and is dialled as it is.
func dialPublic(d *net.Dialer, allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if _, err := netip.ParseAddr(host); err == nil || allowPrivate {
			return d.DialContext(ctx, network, addr)
		}
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if !public(ip) {
				return nil, &privateAddrError{host: host, ip: ip}
			}
		}
		var firstErr error
		for _, ip := range ips {
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
			if err == nil {
				return c, nil
			}
			if firstErr == nil {
				firstErr = err
			}
		}
		return nil, firstErr
	}
}

// sharedAddressSpace is carrier-grade NAT (RFC 6598), private in practice.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

func public(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsGlobalUnicast() && !ip.IsPrivate() && !sharedAddressSpace.Contains(ip)
}
