package doctor

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
)

// KafkaListener checks that the embedded broker's Kafka listener address
// can be bound.
func (d *Doctor) KafkaListener(context.Context) Result {
	return checkListen(d.cfg.KafkaAddr, "--kafka-addr")
}

// HTTPListener checks that the metrics and health address can be bound.
func (d *Doctor) HTTPListener(context.Context) Result {
	return checkListen(d.cfg.HTTPAddr, "--http-addr")
}

// checkListen binds addr and closes it at once.
func checkListen(addr, flag string) Result {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		return pass("%s can be bound", addr)
	}
	fix := "stop what listens there, or choose another " + flag
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		holder := ""
		if _, port, perr := net.SplitHostPort(addr); perr == nil {
			if p, perr := strconv.Atoi(port); perr == nil {
				if pid := listenerPID(p); pid > 0 {
					holder = ": held by " + describePID(pid)
				}
			}
		}
		return fail(fix, "%s: address in use%s", addr, holder)
	case errors.Is(err, syscall.EACCES):
		return fail("choose a port above 1023 for "+flag+", or grant the relay CAP_NET_BIND_SERVICE", "%s: permission denied", addr)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fail("choose an address of this machine for "+flag+" (0.0.0.0 for all)", "%s: no interface of this machine has that address", addr)
	}
	return fail("check "+flag, "%s cannot be bound: %v", addr, err)
}
