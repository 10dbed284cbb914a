package protocol

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// conn is one client connection. Requests are decoded by a reader goroutine
// a few frames ahead and handled one at a time, in order, by the
// connection's own goroutine; a writer goroutine sends the responses in the
// same order (Kafka answers a connection's requests in the order they were
// sent). A produce response first waits for its batches to be durable, in
// the writer, so the handler already appends the next request's batches
// while the previous ones are fsynced.
type conn struct {
	s          *Server
	nc         net.Conn
	clientHost string
	// host is the client's IP address, for ACLs.
	host string
	// principal is who the connection acts for in ACL checks: User:<name>
	// after SASL, User:<common name> of a verified client certificate, or
	// User:ANONYMOUS.
	principal string
	out       []byte

	// authed is set, by the handler, once SASL authentication succeeded
	// (at once when the server requires none); the reader reads with the
	// small pre-authentication frame limit until then.
	authed atomic.Bool
	// sasl is the handler's authentication state.
	sasl saslState
	// rawTokens, the reader's own, counts the SASL tokens that follow a
	// SaslHandshake v0 unframed (without a Kafka request header).
	rawTokens int
	// closeAfterReply ends the connection once the current reply is
	// written (a failed authentication).
	closeAfterReply bool
	// fetching holds a token while a fetch response of this connection is
	// unwritten: the next fetch waits for it, so a client that stops
	// reading holds one response's bytes, as Kafka mutes a connection
	// until its response is sent.
	fetching chan struct{}
}

// anonymous is the principal of a connection that proved no identity.
const anonymous = "User:ANONYMOUS"

// reply is a response waiting its turn. wait, when set, runs first and
// blocks until the response may be sent (produced batches are durable); it
// runs even when the connection has failed, so that durability waits are
// never skipped. A nil resp sends nothing (acks=0).
type reply struct {
	corr int32
	resp kmsg.Response
	// raw, when set, is a SASL token answering a SaslHandshake v0
	// exchange, sent without a response header.
	raw  []byte
	wait func()
	// release, when set, runs once resp is written or dropped (it recycles
	// buffers resp refers to).
	release func()
}

// maxPendingReplies bounds the responses handled but not yet written.
const maxPendingReplies = 8

// request is a decoded frame, or the error that ended reading.
type request struct {
	key      int16
	version  int16
	corr     int32
	clientID string
	req      kmsg.Request
	// token, with raw set, is an unframed SASL token (after SaslHandshake
	// v0).
	token []byte
	raw   bool
	// resp, when set, is the answer prepared while decoding (ApiVersions
	// at an unsupported version).
	resp kmsg.Response
	err  error
	// frame, when set, is the pooled buffer req was decoded from, to go
	// back to framePool once req is handled.
	frame *[]byte
	// held is what the request holds of the server's budget until it is
	// handled.
	held int64
}

// framePool holds *[]byte frames of Produce requests, the only large
// requests whose decoded form is done with once handled (their batches are
// in the log by then); recycling them keeps produced bytes from feeding
// the garbage collector, which shares the cores with everything else.
var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// maxPooledFrame keeps a rare huge request from pinning memory.
const maxPooledFrame = 4 << 20

// errBadRequest marks input that ends the connection.
var errBadRequest = errors.New("protocol: bad request")

// readAhead is how many decoded requests may wait for their turn.
const readAhead = 8

func (s *Server) serveConn(ctx context.Context, nc net.Conn) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	defer nc.Close()

	c := &conn{s: s, nc: nc, principal: anonymous, fetching: make(chan struct{}, 1)}
	if h, _, err := net.SplitHostPort(nc.RemoteAddr().String()); err == nil {
		c.clientHost, c.host = "/"+h, h
	}
	if s.cfg.TLS != nil {
		tc := tls.Server(nc, s.cfg.TLS)
		if err := handshake(ctx, tc, s.cfg.HandshakeTimeout); err != nil {
			if ctx.Err() == nil {
				s.log.Debug("kafka TLS handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
			}
			return
		}
		if certs := tc.ConnectionState().VerifiedChains; len(certs) > 0 && len(certs[0]) > 0 && certs[0][0].Subject.CommonName != "" {
			c.principal = "User:" + certs[0][0].Subject.CommonName
		}
		c.nc = tc
	}
	if s.users == nil {
		c.authed.Store(true)
	} else {
		// A connection that has not authenticated within the timeout is
		// closed, however slowly it sends its handshake.
		t := time.AfterFunc(s.cfg.HandshakeTimeout, func() {
			if !c.authed.Load() {
				s.log.Debug("kafka connection did not authenticate in time; closing", "remote", nc.RemoteAddr().String())
				_ = nc.Close()
			}
		})
		defer t.Stop()
	}
	reqs := make(chan request, readAhead)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(reqs)
		c.readLoop(ctx, reqs)
	}()
	defer func() {
		// Requests read ahead but never handled give their bytes back.
		for r := range reqs {
			s.budget.release(r.held)
		}
		<-readerDone
	}()
	defer cancel()
	replies := make(chan reply, maxPendingReplies)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop(replies, cancel)
	}()
	// Answer (or at least finish the waits of) everything handled before
	// the connection closes.
	defer func() { <-writerDone }()
	defer close(replies)
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("kafka connection handler panicked; closing connection", "remote", nc.RemoteAddr().String(), "panic", r, "stack", string(debug.Stack()))
		}
	}()
	for r := range reqs {
		if r.err != nil {
			if !errors.Is(r.err, io.EOF) && ctx.Err() == nil && !errors.Is(r.err, net.ErrClosed) {
				s.log.Debug("closing kafka connection", "remote", nc.RemoteAddr().String(), "err", r.err)
			}
			return
		}
		if !c.authed.Load() && !r.raw && !preAuthKeys[r.key] {
			s.budget.release(r.held)
			s.log.Debug("closing kafka connection: request before SASL authentication", "remote", nc.RemoteAddr().String(), "api", kmsg.NameForKey(r.key))
			return
		}
		if r.raw {
			s.budget.release(r.held)
			tok, err := s.saslStep(c, r.token)
			if err != nil {
				s.saslFailed(c, err)
				return
			}
			replies <- reply{raw: tok}
			continue
		}
		resp := r.resp
		var wait, release func()
		if resp != nil {
			s.budget.release(r.held)
		}
		if resp == nil {
			var err error
			resp, wait, release, err = s.handle(ctx, c, r)
			if r.frame != nil {
				framePool.Put(r.frame)
			}
			s.budget.release(r.held)
			r.held = 0
			if err != nil {
				if ctx.Err() == nil {
					s.log.Debug("closing kafka connection", "remote", nc.RemoteAddr().String(), "api", kmsg.NameForKey(r.key), "err", err)
				}
				return
			}
		}
		if resp == nil && wait == nil {
			continue
		}
		replies <- reply{corr: r.corr, resp: resp, wait: wait, release: release}
		if c.closeAfterReply {
			return
		}
	}
}

// handshake runs the TLS handshake within timeout.
func handshake(ctx context.Context, tc *tls.Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return tc.HandshakeContext(ctx)
}

// writeLoop writes replies in order until replies is closed. After a write
// fails it cancels the connection and only runs the remaining waits.
func (c *conn) writeLoop(replies <-chan reply, cancel context.CancelFunc) {
	var failed bool
	for r := range replies {
		if r.wait != nil {
			r.wait()
		}
		if r.raw != nil && !failed {
			if err := c.writeRaw(r.raw); err != nil {
				failed = true
				cancel()
			}
		}
		if r.resp != nil && !failed {
			if err := c.write(r.corr, r.resp); err != nil {
				failed = true
				cancel()
			}
		}
		if r.release != nil {
			r.release()
		}
	}
}

// readLoop reads and decodes frames until an error, which it sends last.
func (c *conn) readLoop(ctx context.Context, reqs chan<- request) {
	defer func() {
		if r := recover(); r != nil {
			c.s.log.Error("kafka request decoder panicked; closing connection", "remote", c.nc.RemoteAddr().String(), "panic", r, "stack", string(debug.Stack()))
			_ = c.nc.Close()
		}
	}()
	br := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		r := c.readRequest(ctx, br)
		select {
		case reqs <- r:
		case <-ctx.Done():
			c.s.budget.release(r.held)
			return
		}
		if r.err != nil {
			return
		}
	}
}

func (c *conn) readRequest(ctx context.Context, br *bufio.Reader) request {
	var deadline time.Time
	if idle := c.s.cfg.IdleTimeout; idle > 0 {
		deadline = time.Now().Add(idle)
	}
	_ = c.nc.SetReadDeadline(deadline)
	var size [4]byte
	if _, err := io.ReadFull(br, size[:]); err != nil {
		return request{err: err}
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	limit := c.s.cfg.MaxFrameBytes
	if !c.authed.Load() {
		limit = min(limit, maxPreAuthFrame)
	}
	if c.rawTokens > 0 {
		c.rawTokens--
		if n < 0 || int(n) > limit {
			return request{err: fmt.Errorf("%w: SASL token of %d bytes (limit %d)", errBadRequest, n, limit)}
		}
		tok := make([]byte, n)
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.IOTimeout))
		if _, err := io.ReadFull(br, tok); err != nil {
			return request{err: err}
		}
		return request{raw: true, token: tok}
	}
	if n < 8 || int(n) > limit {
		return request{err: fmt.Errorf("%w: frame of %d bytes (limit %d)", errBadRequest, n, limit)}
	}
	// A key or version this server does not answer is refused from the
	// header, before the body is waited for or allocated.
	_ = c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.IOTimeout))
	hdr, err := br.Peek(4)
	if err != nil {
		return request{err: err}
	}
	key, version := int16(binary.BigEndian.Uint16(hdr)), int16(binary.BigEndian.Uint16(hdr[2:]))
	if vr, ok := supportedVersions[key]; key != kmsg.ApiVersions.Int16() && (!ok || version < vr.min || version > vr.max) {
		return request{key: key, version: version, err: fmt.Errorf("%w: api key %d version %d is not supported", errBadRequest, key, version)}
	}
	// The frame waits for its bytes of the budget before it is read: a
	// client over budget is slowed (it stops being read) rather than
	// allowed to grow the heap.
	if err := c.s.budget.acquire(ctx, int64(n)); err != nil {
		return request{err: err}
	}
	held := int64(n)
	_ = c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.IOTimeout))
	var pooled *[]byte
	var frame []byte
	if key, err := br.Peek(2); err == nil && int16(binary.BigEndian.Uint16(key)) == kmsg.Produce.Int16() && n <= maxPooledFrame {
		pooled = framePool.Get().(*[]byte)
		if cap(*pooled) < int(n) {
			*pooled = make([]byte, n)
		}
		frame = (*pooled)[:n]
	} else {
		frame = make([]byte, n)
	}
	if _, err := io.ReadFull(br, frame); err != nil {
		c.s.budget.release(held)
		return request{err: err}
	}
	r := decodeRequest(frame)
	if r.req != nil {
		r.frame = pooled
	}
	if r.err != nil {
		c.s.budget.release(held)
		if pooled != nil {
			framePool.Put(pooled)
		}
	} else {
		r.held = held
	}
	if hs, ok := r.req.(*kmsg.SASLHandshakeRequest); ok && hs.Version == 0 && !c.authed.Load() {
		c.rawTokens = c.s.rawTokensAfterHandshake(hs.Mechanism)
	}
	return r
}

// writeRaw sends an unframed SASL token: its size, then its bytes.
func (c *conn) writeRaw(tok []byte) error {
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(tok)), uint32(len(tok)))
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.IOTimeout))
	_, err := c.nc.Write(append(buf, tok...))
	return err
}

// decodeRequest parses one frame (without its size prefix). It never
// panics on any input; bad input yields a request with err set, or, for
// ApiVersions at a version above ours, a ready v0 error response.
func decodeRequest(frame []byte) request {
	rd := kbin.Reader{Src: frame}
	r := request{key: rd.Int16(), version: rd.Int16(), corr: rd.Int32()}
	if cid := rd.NullableString(); cid != nil {
		r.clientID = *cid
	}
	if !rd.Ok() {
		return request{err: fmt.Errorf("%w: short request header", errBadRequest)}
	}
	vr, supported := supportedVersions[r.key]
	if r.key == kmsg.ApiVersions.Int16() && r.version > vr.max {
		resp := kmsg.NewPtrApiVersionsResponse()
		resp.Version = 0
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		resp.ApiKeys = apiVersionKeys()
		r.resp = resp
		return r
	}
	if !supported || r.version < vr.min || r.version > vr.max {
		return request{key: r.key, version: r.version, corr: r.corr, err: fmt.Errorf("%w: api key %d version %d is not supported", errBadRequest, r.key, r.version)}
	}
	req := kmsg.RequestForKey(r.key)
	req.SetVersion(r.version)
	if req.IsFlexible() {
		kmsg.SkipTags(&rd)
		if !rd.Ok() {
			return request{err: fmt.Errorf("%w: bad header tags", errBadRequest)}
		}
	}
	if err := req.ReadFrom(rd.Src); err != nil {
		return request{key: r.key, version: r.version, corr: r.corr, err: fmt.Errorf("%w: decode %s v%d: %w", errBadRequest, kmsg.NameForKey(r.key), r.version, err)}
	}
	r.req = req
	return r
}

// write sends one response frame: size, correlation id, an empty tag
// section for flexible responses other than ApiVersions, then the body. A
// fetch response's record batches go out by one vectored write straight
// from the buffers they were read into, without another copy.
func (c *conn) write(corr int32, resp kmsg.Response) error {
	buf := append(c.out[:0], 0, 0, 0, 0, 0, 0, 0, 0)
	if resp.IsFlexible() && resp.Key() != kmsg.ApiVersions.Int16() {
		buf = append(buf, 0)
	}
	var (
		pieces []fetchPiece
		ok     bool
	)
	if fr, isFetch := resp.(*kmsg.FetchResponse); isFetch {
		buf, pieces, ok = appendFetchResponse(buf, fr)
	}
	if !ok {
		buf = resp.AppendTo(buf)
	}
	size := len(buf) - 4
	for _, p := range pieces {
		size += len(p.batches)
	}
	binary.BigEndian.PutUint32(buf[0:4], uint32(size))
	binary.BigEndian.PutUint32(buf[4:8], uint32(corr))
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.IOTimeout))
	var err error
	if len(pieces) == 0 {
		_, err = c.nc.Write(buf)
	} else {
		vec := make(net.Buffers, 0, 2*len(pieces)+1)
		at := 0
		for _, p := range pieces {
			vec = append(vec, buf[at:p.end], p.batches)
			at = p.end
		}
		if at < len(buf) {
			vec = append(vec, buf[at:])
		}
		_, err = vec.WriteTo(c.nc)
	}
	if cap(buf) <= 4<<20 {
		c.out = buf
	} else {
		c.out = nil
	}
	return err
}

// handle answers one request; a nil response means none is sent (acks=0
// Produce). A non-nil wait must run before the response is sent (see
// handleProduce); a non-nil release runs after it was written (see
// handleFetch). An error closes the connection.
func (s *Server) handle(ctx context.Context, c *conn, r request) (resp kmsg.Response, wait, release func(), err error) {
	switch req := r.req.(type) {
	case *kmsg.ProduceRequest:
		fix := s.authorizeProduce(c, req)
		resp, wait = s.handleProduce(ctx, req)
		if fix != nil && resp != nil {
			fix(resp)
		}
		return resp, wait, nil, nil
	case *kmsg.FetchRequest:
		select {
		case c.fetching <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		}
		resp, buffers := s.handleFetch(ctx, c, req)
		return resp, nil, func() {
			if buffers != nil {
				buffers()
			}
			<-c.fetching
		}, nil
	}
	refused, fix, err := s.authorizeSync(ctx, c, r)
	if err != nil {
		s.log.Error("refusing a request no authorization rule covers; closing the connection", "api", kmsg.NameForKey(r.key), "err", err)
		return nil, nil, nil, err
	}
	if refused != nil {
		return refused, nil, nil, nil
	}
	resp, err = s.handleSync(ctx, c, r)
	if fix != nil && err == nil {
		fix(resp)
	}
	return resp, nil, nil, err
}

// handleSync answers requests whose response is complete when built.
func (s *Server) handleSync(ctx context.Context, c *conn, r request) (kmsg.Response, error) {
	switch req := r.req.(type) {
	case *kmsg.ApiVersionsRequest:
		return respond(req, s.handleApiVersions), nil
	case *kmsg.MetadataRequest:
		return respondConn(c, req, s.handleMetadata), nil
	case *kmsg.ListOffsetsRequest:
		return respond(req, s.handleListOffsets), nil
	case *kmsg.InitProducerIDRequest:
		return respondCtx(ctx, req, s.handleInitProducerID), nil
	case *kmsg.AddPartitionsToTxnRequest:
		return respondCtx(ctx, req, s.handleAddPartitionsToTxn), nil
	case *kmsg.AddOffsetsToTxnRequest:
		return respondCtx(ctx, req, s.handleAddOffsetsToTxn), nil
	case *kmsg.EndTxnRequest:
		return respondCtx(ctx, req, s.handleEndTxn), nil
	case *kmsg.TxnOffsetCommitRequest:
		return respondCtx(ctx, req, s.handleTxnOffsetCommit), nil
	case *kmsg.DescribeTransactionsRequest:
		return respond(req, s.handleDescribeTransactions), nil
	case *kmsg.ListTransactionsRequest:
		return respond(req, s.handleListTransactions), nil
	case *kmsg.FindCoordinatorRequest:
		return respondConn(c, req, s.handleFindCoordinator), nil
	case *kmsg.JoinGroupRequest:
		return respond(req, func(req *kmsg.JoinGroupRequest, resp *kmsg.JoinGroupResponse) {
			s.groups.handleJoin(ctx, c, r.clientID, req, resp)
		}), nil
	case *kmsg.SyncGroupRequest:
		return respondCtx(ctx, req, s.groups.handleSync), nil
	case *kmsg.HeartbeatRequest:
		return respond(req, s.groups.handleHeartbeat), nil
	case *kmsg.LeaveGroupRequest:
		return respond(req, s.groups.handleLeave), nil
	case *kmsg.OffsetCommitRequest:
		return respondCtx(ctx, req, s.handleOffsetCommit), nil
	case *kmsg.OffsetFetchRequest:
		return respond(req, s.handleOffsetFetch), nil
	case *kmsg.DescribeGroupsRequest:
		return respondConn(c, req, s.handleDescribeGroups), nil
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return respond(req, func(req *kmsg.ConsumerGroupHeartbeatRequest, resp *kmsg.ConsumerGroupHeartbeatResponse) {
			s.groups.handleConsumerGroupHeartbeat(c, r.clientID, req, resp)
		}), nil
	case *kmsg.ConsumerGroupDescribeRequest:
		return respond(req, s.groups.handleConsumerGroupDescribe), nil
	case *kmsg.ListGroupsRequest:
		return respond(req, s.groups.handleList), nil
	case *kmsg.ShareGroupHeartbeatRequest:
		return respond(req, func(req *kmsg.ShareGroupHeartbeatRequest, resp *kmsg.ShareGroupHeartbeatResponse) {
			s.share.handleShareGroupHeartbeat(c, r.clientID, req, resp)
		}), nil
	case *kmsg.ShareGroupDescribeRequest:
		return respond(req, s.share.handleShareGroupDescribe), nil
	case *kmsg.ShareFetchRequest:
		return respond(req, func(req *kmsg.ShareFetchRequest, resp *kmsg.ShareFetchResponse) {
			s.handleShareFetch(ctx, c, req, resp)
		}), nil
	case *kmsg.ShareAcknowledgeRequest:
		return respondConn(c, req, s.handleShareAcknowledge), nil
	case *kmsg.DescribeShareGroupOffsetsRequest:
		return respond(req, s.share.handleDescribeShareGroupOffsets), nil
	case *kmsg.AlterShareGroupOffsetsRequest:
		return respond(req, s.share.handleAlterShareGroupOffsets), nil
	case *kmsg.DeleteShareGroupOffsetsRequest:
		return respond(req, s.share.handleDeleteShareGroupOffsets), nil
	case *kmsg.CreateTopicsRequest:
		return respond(req, s.handleCreateTopics), nil
	case *kmsg.DescribeConfigsRequest:
		return respond(req, s.handleDescribeConfigs), nil
	case *kmsg.AlterConfigsRequest:
		return respond(req, s.handleAlterConfigs), nil
	case *kmsg.IncrementalAlterConfigsRequest:
		return respond(req, s.handleIncrementalAlterConfigs), nil
	case *kmsg.SASLHandshakeRequest:
		return respondConn(c, req, s.handleSASLHandshake), nil
	case *kmsg.SASLAuthenticateRequest:
		return respondConn(c, req, s.handleSASLAuthenticate), nil
	case *kmsg.CreatePartitionsRequest:
		return respondCtx(ctx, req, s.handleCreatePartitions), nil
	case *kmsg.DeleteTopicsRequest:
		return respond(req, s.handleDeleteTopics), nil
	case *kmsg.DeleteRecordsRequest:
		return respond(req, s.handleDeleteRecords), nil
	case *kmsg.DescribeLogDirsRequest:
		return respond(req, s.handleDescribeLogDirs), nil
	case *kmsg.DescribeClusterRequest:
		return respondConn(c, req, s.handleDescribeCluster), nil
	case *kmsg.DeleteGroupsRequest:
		return respond(req, s.groups.handleDeleteGroups), nil
	case *kmsg.OffsetDeleteRequest:
		return respond(req, s.groups.handleOffsetDelete), nil
	case *kmsg.DescribeACLsRequest:
		return respondConn(c, req, s.handleDescribeACLs), nil
	case *kmsg.CreateACLsRequest:
		return respondConn(c, req, s.handleCreateACLs), nil
	case *kmsg.DeleteACLsRequest:
		return respondConn(c, req, s.handleDeleteACLs), nil
	default:
		return nil, fmt.Errorf("%w: no handler for api key %d", errBadRequest, r.key)
	}
}

// respond runs h on req and a response of req's kind (its version set from
// req), and returns that response.
func respond[Req kmsg.Request, Resp kmsg.Response](req Req, h func(Req, Resp)) kmsg.Response {
	resp := req.ResponseKind().(Resp)
	h(req, resp)
	return resp
}

// respondCtx is respond for a handler that takes the request's context.
func respondCtx[Req kmsg.Request, Resp kmsg.Response](ctx context.Context, req Req, h func(context.Context, Req, Resp)) kmsg.Response {
	return respond(req, func(req Req, resp Resp) { h(ctx, req, resp) })
}

// respondConn is respond for a handler that takes the connection.
func respondConn[Req kmsg.Request, Resp kmsg.Response](c *conn, req Req, h func(*conn, Req, Resp)) kmsg.Response {
	return respond(req, func(req Req, resp Resp) { h(c, req, resp) })
}
