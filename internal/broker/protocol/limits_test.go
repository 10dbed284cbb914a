package protocol

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestConnectionLimits: past the per-address limit a connection is closed
// at once, while another address still gets in up to the total limit;
// each limit's refusals are counted and logged with the limit and the
// address, once per limit in the log interval.
func TestConnectionLimits(t *testing.T) {
	t.Parallel()
	var logged lockedBuffer
	f := setup(t, func(c *Config) {
		c.MaxConnections, c.MaxConnectionsPerAddress = 5, 3
		c.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	dialFrom := func(local string) *rawConn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		nc, err := d.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return &rawConn{t: t, c: nc}
	}
	works := func(rc *rawConn) {
		t.Helper()
		req := kmsg.NewPtrApiVersionsRequest()
		corr := rc.send(req)
		if got := rc.recv(req.ResponseKind()); got != corr {
			t.Fatalf("corr %d, want %d", got, corr)
		}
	}
	for range 3 {
		works(dialFrom("127.0.0.1"))
	}
	dialFrom("127.0.0.1").expectClosed()
	dialFrom("127.0.0.1").expectClosed()
	works(dialFrom("127.0.0.2"))
	works(dialFrom("127.0.0.2"))
	dialFrom("127.0.0.3").expectClosed()
	if a, b := f.srv.stats.refusedPerAddress.Load(), f.srv.stats.refusedTotal.Load(); a != 2 || b != 1 {
		t.Errorf("refused connections counted: %d per address, %d in all; want 2 and 1", a, b)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	want := []string{
		`limit=per_address max=3 open=3 remote=127.0.0.1`,
		`limit=total max=5 open=5 remote=127.0.0.3`,
	}
	if len(lines) != len(want) {
		t.Fatalf("log lines:\n%s\nwant one per limit (the second refusal from 127.0.0.1 within the interval unlogged)", logged.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], "kafka connection refused") || !strings.Contains(lines[i], w) {
			t.Errorf("log line %q, want it to say %q", lines[i], w)
		}
	}
}

// TestRefusalLogInterval: refusals over one limit are logged once per
// interval, the next line counting those left unlogged; each limit has
// its own interval.
func TestRefusalLogInterval(t *testing.T) {
	var r refusalLog
	t0 := time.Now()
	for i, c := range []struct {
		limit    string
		at       time.Duration
		log      bool
		unlogged int64
	}{
		{"per_address", 0, true, 0},
		{"per_address", time.Second, false, 0},
		{"per_address", 2 * time.Second, false, 0},
		{"total", 3 * time.Second, true, 0},
		{"per_address", refusalLogInterval, true, 2},
		{"per_address", refusalLogInterval + time.Second, false, 0},
	} {
		if log, unlogged := r.note(c.limit, t0.Add(c.at)); log != c.log || unlogged != c.unlogged {
			t.Errorf("refusal %d (%s at %v): log %v, %d unlogged; want %v, %d", i, c.limit, c.at, log, unlogged, c.log, c.unlogged)
		}
	}
}

// TestDefaultLimitsServe500FromOneAddress: with the limits a relay has by
// default (no per-address limit, the total at DefaultMaxConnections), 500
// connections from 127.0.0.1 at once are all served; 200 from one
// address were once the most a relay let in, which failed clients of
// several ecosystems run side by side on one host.
func TestDefaultLimitsServe500FromOneAddress(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config) { c.MaxConnections = DefaultMaxConnections })
	conns := make([]*rawConn, 500)
	for i := range conns {
		conns[i] = dialRaw(t, f.addr)
	}
	for i, rc := range conns {
		req := kmsg.NewPtrApiVersionsRequest()
		corr := rc.send(req)
		if got := rc.recv(req.ResponseKind()); got != corr {
			t.Fatalf("connection %d: corr %d, want %d", i, got, corr)
		}
	}
	if n := f.srv.stats.refusedPerAddress.Load() + f.srv.stats.refusedTotal.Load(); n != 0 {
		t.Errorf("%d connections refused", n)
	}
}

// TestIdleTimeout: a connection that sends nothing for the idle timeout is
// closed; one that keeps sending stays.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config) { c.IdleTimeout = time.Second })
	idle := dialRaw(t, f.addr)
	busy := dialRaw(t, f.addr)
	for range 10 {
		req := kmsg.NewPtrApiVersionsRequest()
		corr := busy.send(req)
		if got := busy.recv(req.ResponseKind()); got != corr {
			t.Fatalf("busy connection: corr %d, want %d", got, corr)
		}
		time.Sleep(200 * time.Millisecond) // deliberate pause: the busy connection stays busy past the idle timeout
	}
	idle.expectClosed()
}

// TestInFlightBudget: frames that announce more than the budget's free
// bytes are not read until bytes come free: the bytes held never pass the
// budget while many connections send large frames, a client that
// trickles its frame is closed after the I/O timeout and its share freed,
// and ordinary clients are served once the flood ends.
func TestInFlightBudget(t *testing.T) {
	t.Parallel()
	const budgetBytes = 8 << 20
	f := setup(t, func(c *Config) { c.MaxInFlightBytes, c.IOTimeout = budgetBytes, time.Second })
	if f.srv.cfg.MaxFrameBytes != budgetBytes/4 {
		t.Fatalf("frame limit %d, want a quarter of the budget", f.srv.cfg.MaxFrameBytes)
	}
	frame := func(n int) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(n))
		b = binary.BigEndian.AppendUint16(b, uint16(kmsg.Produce))
		b = binary.BigEndian.AppendUint16(b, 9)
		return append(b, bytes.Repeat([]byte{0xff}, n-4)...) // read whole, then fails to decode
	}
	// Trickling senders: each announces a 1.5 MiB frame and sends a part.
	var trickle []*rawConn
	for range 6 {
		rc := dialRaw(t, f.addr)
		rc.writeRaw(frame(3 << 19)[:1<<19])
		trickle = append(trickle, rc)
	}
	var peak int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				peak = max(peak, f.srv.budget.used.Load())
			}
		}
	})
	time.Sleep(300 * time.Millisecond) // deliberate pause: the waiting frames must stay waiting (a negative check)
	if used := f.srv.budget.used.Load(); used != 3<<20 {
		t.Errorf("with six 1.5 MiB frames announced, %d bytes held, want two frames' (3 MiB of the requests' 4 MiB): the rest wait", used)
	}
	// Whole large frames from more connections are read one budget's
	// worth at a time once the tricklers time out.
	for range 8 {
		wg.Go(func() {
			rc := dialRaw(t, f.addr)
			rc.writeRaw(frame(2 << 20))
			rc.expectClosed() // it does not decode
		})
	}
	for _, rc := range trickle {
		rc.expectClosed()
	}
	close(stop)
	wg.Wait()
	if peak > budgetBytes/2 {
		t.Errorf("peak %d bytes held for requests, over their half of the %d budget", peak, budgetBytes)
	}
	if used := f.srv.budget.used.Load(); used != 0 {
		t.Errorf("%d bytes still held after every connection closed", used)
	}
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "after-flood", 1)
	cl := newKgo(t, f.addr, kgo.ConsumeTopics("after-flood"))
	defer cl.Close()
	produceKeyed(t, ctx, cl, "after-flood", 10)
	consumeAll(t, ctx, cl, 10)
}

// TestFetchAnsweredWhileRequestsHoldBudget: while clients that trickle
// large frames hold most of the bytes requests may have and a large frame
// waits for the rest, a small fetch request still gets in (a waiter does
// not block those behind it that fit) and is answered: responses draw on
// their own half of the budget, so requests waiting to be handled (a
// connection's read-ahead behind its own fetch, or other clients' frames)
// cannot keep a fetch from its bytes.
func TestFetchAnsweredWhileRequestsHoldBudget(t *testing.T) {
	t.Parallel()
	const budgetBytes = 8 << 20
	f := setup(t, func(c *Config) { c.MaxInFlightBytes, c.IOTimeout = budgetBytes, time.Minute })
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "poll", 1)
	if _, err := f.b.Append(ctx, "poll", 0, broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("v"), Timestamp: time.Now()}})); err != nil {
		t.Fatal(err)
	}
	// Frames whose rest never comes hold 3.5 of the requests' 4 MiB, and
	// a frame of the largest size (2 MiB) waits for room.
	announce := func(n int) {
		b := binary.BigEndian.AppendUint32(nil, uint32(n))
		b = binary.BigEndian.AppendUint16(b, uint16(kmsg.Metadata))
		dialRaw(t, f.addr).writeRaw(binary.BigEndian.AppendUint16(b, 9))
	}
	announce(budgetBytes / 4)
	announce(3 << 19)
	waitFor(t, ctx, "trickled frames to hold 3.5 MiB", func() bool { return f.srv.budget.used.Load() == 7<<19 })
	announce(budgetBytes / 4)
	time.Sleep(100 * time.Millisecond) // deliberate pause: the last announced frame must stay waiting (a negative check)

	rc := dialRaw(t, f.addr)
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.ReplicaID, req.MaxBytes = 11, -1, 50<<20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = "poll"
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes, rp.LogStartOffset = 50<<20, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	corr := rc.send(req)
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	if got := rc.recv(resp); got != corr || len(resp.Topics[0].Partitions[0].RecordBatches) == 0 {
		t.Fatalf("fetch: corr %d (want %d), %d bytes of batches", got, corr, len(resp.Topics[0].Partitions[0].RecordBatches))
	}
	if used := f.srv.budget.used.Load(); used != 7<<19 {
		t.Errorf("the fetch was answered only after the trickled frames let go (%d bytes held)", used)
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
