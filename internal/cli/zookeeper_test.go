package cli_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// zkStandIn serves the few ZooKeeper requests Burrow 1.x makes of the
// ensemble it keeps its own metadata in (it refuses to start without one;
// the relay has no part in it): the session handshake, pings, exists,
// create (with sequential names), children, data and delete, over an
// in-memory set of paths. Any other request is answered ZUNIMPLEMENTED.
// It stands in for Burrow's coordination store only; what the test asserts
// comes from the relay.
type zkStandIn struct {
	ln    net.Listener
	mu    sync.Mutex
	nodes map[string]bool
	seq   int
}

// ZooKeeper opcodes and error codes (jute protocol).
const (
	zkOpCreate      = 1
	zkOpDelete      = 2
	zkOpExists      = 3
	zkOpGetData     = 4
	zkOpGetChildren = 8
	zkOpPing        = 11
	zkOpChildren2   = 12
	zkOpClose       = -11
	zkNoNode        = -101
	zkNodeExists    = -110
	zkUnimplemented = -6
	zkStatSize      = 68
)

func startZKStandIn(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z := &zkStandIn{ln: ln, nodes: map[string]bool{"/": true}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { z.serve(c) })
		}
	})
	go func() {
		<-t.Context().Done()
		ln.Close()
	}()
	return ln.Addr().String()
}

// serve answers one client connection until it closes.
func (z *zkStandIn) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := zkFrame(r); err != nil { // ConnectRequest
		return
	}
	resp := binary.BigEndian.AppendUint32(nil, 0)    // protocol version
	resp = binary.BigEndian.AppendUint32(resp, 6000) // session timeout
	resp = binary.BigEndian.AppendUint64(resp, 1)    // session id
	resp = zkAppendBytes(resp, make([]byte, 16))     // password
	if _, err := c.Write(zkFramed(resp)); err != nil {
		return
	}
	for {
		req, err := zkFrame(r)
		if err != nil || len(req) < 8 {
			return
		}
		xid, op, body := req[:4], int32(binary.BigEndian.Uint32(req[4:8])), req[8:]
		code, out := z.handle(op, body)
		hdr := append([]byte(nil), xid...)
		hdr = binary.BigEndian.AppendUint64(hdr, 1)
		hdr = binary.BigEndian.AppendUint32(hdr, uint32(code))
		if _, err := c.Write(zkFramed(append(hdr, out...))); err != nil || op == zkOpClose {
			return
		}
	}
}

// handle answers one request: its error code and response body.
func (z *zkStandIn) handle(op int32, body []byte) (int32, []byte) {
	stat := make([]byte, zkStatSize)
	path, _ := zkString(body)
	z.mu.Lock()
	defer z.mu.Unlock()
	switch op {
	case zkOpPing, zkOpClose:
		return 0, nil
	case zkOpExists, zkOpGetData:
		if !z.nodes[path] {
			return zkNoNode, nil
		}
		if op == zkOpGetData {
			return 0, append(zkAppendBytes(nil, nil), stat...)
		}
		return 0, stat
	case zkOpCreate:
		// path, data, ACL vector, then flags; bit 2 asks for a sequence
		// suffix.
		flags := int32(binary.BigEndian.Uint32(body[len(body)-4:]))
		if flags&2 != 0 {
			z.seq++
			path = fmt.Sprintf("%s%010d", path, z.seq)
		}
		if z.nodes[path] {
			return zkNodeExists, nil
		}
		z.nodes[path] = true
		return 0, zkAppendString(nil, path)
	case zkOpDelete:
		delete(z.nodes, path)
		return 0, nil
	case zkOpGetChildren, zkOpChildren2:
		prefix := strings.TrimSuffix(path, "/") + "/"
		var kids []string
		for n := range z.nodes {
			if rest, ok := strings.CutPrefix(n, prefix); ok && rest != "" && !strings.Contains(rest, "/") {
				kids = append(kids, rest)
			}
		}
		out := binary.BigEndian.AppendUint32(nil, uint32(len(kids)))
		for _, k := range kids {
			out = zkAppendString(out, k)
		}
		if op == zkOpChildren2 {
			out = append(out, stat...)
		}
		return 0, out
	}
	return zkUnimplemented, nil
}

func zkFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > 1<<20 {
		return nil, errors.New("zookeeper stand-in: frame too large")
	}
	b := make([]byte, size)
	_, err := io.ReadFull(r, b)
	return b, err
}

func zkFramed(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func zkString(b []byte) (string, bool) {
	if len(b) < 4 {
		return "", false
	}
	n := int(int32(binary.BigEndian.Uint32(b)))
	if n < 0 || 4+n > len(b) {
		return "", false
	}
	return string(b[4 : 4+n]), true
}

func zkAppendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}

func zkAppendBytes(b, v []byte) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(v))), v...)
}
