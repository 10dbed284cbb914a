package protocol

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestConnectionLimits: past the per-address limit a connection is closed
// at once, while another address still gets in up to the total limit.
func TestConnectionLimits(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config) { c.MaxConnections, c.MaxConnectionsPerAddress = 5, 3 })
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
	works(dialFrom("127.0.0.2"))
	works(dialFrom("127.0.0.2"))
	dialFrom("127.0.0.3").expectClosed()
	if n := f.srv.stats.refusedPerAddress.Load() + f.srv.stats.refusedTotal.Load(); n != 2 {
		t.Errorf("%d refused connections counted, want 2", n)
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
		time.Sleep(200 * time.Millisecond)
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
	time.Sleep(300 * time.Millisecond)
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
	time.Sleep(100 * time.Millisecond)

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
