package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// fenceCheckInterval is how often the fence is checked while records are
// in flight, and the longest slice of a blocked write to a producer
// connection (see the package documentation's fault model).
const fenceCheckInterval = 5 * time.Millisecond

// fencedDialer dials the producing client's connections and holds them, so
// that nothing is written to a broker once the session's fence failed: it
// refuses to dial, every write checks the fence first, and abort resets
// every connection.
type fencedDialer struct {
	fence   func() error
	timeout time.Duration
	tls     *tls.Config

	mu    sync.Mutex
	conns map[*fencedConn]struct{}
	// failed is the fence's first failure; set, it refuses everything.
	failed error
}

func newFencedDialer(fence func() error, timeout time.Duration, tc *tls.Config) *fencedDialer {
	return &fencedDialer{fence: fence, timeout: timeout, tls: tc, conns: map[*fencedConn]struct{}{}}
}

// check returns the fence's error, remembering the first one and aborting
// every connection when it fails.
func (d *fencedDialer) check() error {
	d.mu.Lock()
	failed := d.failed
	d.mu.Unlock()
	if failed != nil {
		return failed
	}
	if err := d.fence(); err != nil {
		d.abort(err)
		return err
	}
	return nil
}

// abort resets every connection (SO_LINGER 0: the kernel drops what it
// has not sent, and the broker never completes a request cut short) and
// refuses every later dial and write with err.
func (d *fencedDialer) abort(err error) {
	d.mu.Lock()
	if d.failed == nil {
		d.failed = err
	}
	conns := d.conns
	d.conns = map[*fencedConn]struct{}{}
	d.mu.Unlock()
	for c := range conns {
		c.reset()
	}
}

// dial is the client's kgo.Dialer.
func (d *fencedDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if err := d.check(); err != nil {
		return nil, fmt.Errorf("kafka sink: not connecting to %s: %w", host, err)
	}
	raw, err := (&net.Dialer{Timeout: d.timeout}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	c := &fencedConn{Conn: raw, d: d}
	d.mu.Lock()
	failed := d.failed
	if failed == nil {
		d.conns[c] = struct{}{}
	}
	d.mu.Unlock()
	if failed != nil {
		c.reset()
		return nil, fmt.Errorf("kafka sink: not connecting to %s: %w", host, failed)
	}
	if d.tls == nil {
		return c, nil
	}
	tc := d.tls.Clone()
	if tc.ServerName == "" {
		server, _, err := net.SplitHostPort(host)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("kafka sink: broker address %q: %w", host, err)
		}
		tc.ServerName = server
	}
	tlsConn := tls.Client(c, tc)
	hctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if err := tlsConn.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("kafka sink: TLS handshake with %s: %w", host, err)
	}
	return tlsConn, nil
}

func (d *fencedDialer) forget(c *fencedConn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// fencedConn is one producer connection: each write checks the fence, and
// a write the kernel cannot take at once goes in slices of at most
// fenceCheckInterval, each after a fresh check. The deadline the client
// sets is kept: a write past it fails as it would on the bare connection.
type fencedConn struct {
	net.Conn
	d *fencedDialer

	mu sync.Mutex
	// deadline is the client's write deadline; writing says a Write is
	// under way with the slice deadline slice.
	deadline time.Time
	writing  bool
	slice    time.Time
}

func (c *fencedConn) Write(b []byte) (int, error) {
	written := 0
	defer func() {
		c.mu.Lock()
		c.writing = false
		c.Conn.SetWriteDeadline(c.deadline)
		c.mu.Unlock()
	}()
	for {
		if err := c.d.check(); err != nil {
			return written, fmt.Errorf("kafka sink: not writing to the broker: %w", err)
		}
		c.mu.Lock()
		user := c.deadline
		if !user.IsZero() && !time.Now().Before(user) {
			c.mu.Unlock()
			return written, &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		slice := time.Now().Add(fenceCheckInterval)
		if !user.IsZero() && user.Before(slice) {
			slice = user
		}
		c.writing, c.slice = true, slice
		c.Conn.SetWriteDeadline(slice)
		c.mu.Unlock()
		n, err := c.Conn.Write(b[written:])
		written += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return written, err
		}
	}
}

// SetWriteDeadline keeps the client's deadline; during a write it takes
// effect at once only when it is earlier than the current slice (the next
// slice honours it anyway).
func (c *fencedConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	if c.writing && (t.IsZero() || t.After(c.slice)) {
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *fencedConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *fencedConn) Close() error {
	c.d.forget(c)
	return c.Conn.Close()
}

// reset closes the connection with a TCP reset, dropping unsent data.
func (c *fencedConn) reset() {
	if l, ok := c.Conn.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	c.Conn.Close()
}
