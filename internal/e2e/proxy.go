package e2e

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target (a
// PostgreSQL server), so that a test can break the network between a relay
// and its database: Cut closes every connection at once (a reset, as a NAT
// or a failover would), Blackhole stops forwarding without closing anything
// (a silent partition: bytes sent are neither delivered nor refused, new
// connections are accepted and then hang), and Heal forwards again, bytes
// held during the partition included.
type Proxy struct {
	t      testing.TB
	target string
	l      net.Listener
	// Addr is the proxy's listening address.
	Addr string

	mu    sync.Mutex
	conns map[*proxied]struct{}
	// open is closed while traffic flows and replaced by an open channel
	// while blackholed.
	open       chan struct{}
	blackholed bool
	closed     bool
	wg         sync.WaitGroup
}

// proxied is one client connection and its upstream.
type proxied struct {
	client, upstream net.Conn
	// port is the upstream connection's local port: the server sees it as
	// the client's port (pg_stat_activity.client_port).
	port int
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). It is closed when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{t: t, target: target, l: l, Addr: l.Addr().String(), conns: map[*proxied]struct{}{}, open: open}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// ProxyURL returns a proxy in front of the server of the PostgreSQL URL
// dbURL, and dbURL rewritten to go through it.
func ProxyURL(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Host == "" {
		t.Fatalf("e2e: proxy: the URL %q names no TCP host", dbURL)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr
	return p, u.String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target once traffic flows (a connection made during a
// partition hangs until it heals or is cut) and copies both ways.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	pc := &proxied{client: client}
	if !p.track(pc) {
		client.Close()
		return
	}
	defer p.untrack(pc)
	if !p.wait(pc) {
		client.Close()
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	up, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	pc.upstream = up
	pc.port = up.LocalAddr().(*net.TCPAddr).Port
	_, live := p.conns[pc]
	p.mu.Unlock()
	if !live { // cut while dialling
		up.Close()
		client.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.copy(pc, up, client); done <- struct{}{} }()
	go func() { p.copy(pc, client, up); done <- struct{}{} }()
	<-done
	client.Close()
	up.Close()
	<-done
}

// copy forwards src to dst, holding each chunk while the proxy is
// blackholed.
func (p *Proxy) copy(pc *proxied, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(pc) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}

// wait blocks while the proxy is blackholed; false means pc was cut
// meanwhile.
func (p *Proxy) wait(pc *proxied) bool {
	for {
		p.mu.Lock()
		open := p.open
		_, live := p.conns[pc]
		p.mu.Unlock()
		if !live {
			return false
		}
		select {
		case <-open:
			return true
		case <-time.After(50 * time.Millisecond):
			// Look again: pc may have been cut.
		}
	}
}

func (p *Proxy) track(pc *proxied) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[pc] = struct{}{}
	return true
}

func (p *Proxy) untrack(pc *proxied) {
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// Cut closes every connection through the proxy now; new connections are
// forwarded as before (or held, while blackholed). It returns how many it
// cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	var cut []net.Conn
	n := len(p.conns)
	for pc := range p.conns {
		cut = append(cut, pc.client)
		if pc.upstream != nil {
			cut = append(cut, pc.upstream)
		}
		delete(p.conns, pc)
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
	return n
}

// Retarget forwards the connections made from now on to target (a
// promoted standby, say); connections already made stay with the old
// target until they end or are cut.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Blackhole stops forwarding in both directions without closing anything:
// a silent network partition. Connections stay open; what is sent waits
// in the proxy until Heal, or is dropped by Cut.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackholed {
		p.blackholed = true
		p.open = make(chan struct{})
	}
}

// Heal ends a Blackhole: held bytes and connections go through.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackholed {
		p.blackholed = false
		close(p.open)
	}
}

// Ports returns the local ports of the proxy's open upstream connections:
// the server sees them as the clients' ports (pg_stat_activity.client_port),
// which tells the sessions of the process behind this proxy from others.
func (p *Proxy) Ports() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ports []int32
	for pc := range p.conns {
		if pc.port != 0 {
			ports = append(ports, int32(pc.port))
		}
	}
	return ports
}

// Close stops listening and cuts every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.l.Close()
	p.Heal()
	p.Cut()
	p.wg.Wait()
}
