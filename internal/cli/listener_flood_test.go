package cli_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// kafkaFrame encodes req as a request frame.
func kafkaFrame(corr int32, req kmsg.Request) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 5)
	b = append(b, "flood"...)
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// TestListenerFlood: while the Kafka listener is flooded over loopback
// (150 idle connections, senders of 4 MiB frames back to back, and slow
// readers that ask for 50 MiB fetches and never read), the relay's
// in-flight bytes stay within --listener-max-inflight-bytes, its peak RSS
// within the process's 192 MiB soft memory limit (and its softness), and
// it keeps relaying
// outbox events, which a consumer keeps reading through the same
// listener: events are counted before, during and after the flood.
func TestListenerFlood(t *testing.T) {
	url := pgtest.NewDatabase(t)
	if r := relay(t, nil, "migrate", "up", "--database-url", url); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	conn := pgtest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// 12 MiB for the slow readers to ask for.
	big := strings.Repeat("x", 256<<10)
	for i := range 48 {
		if _, err := conn.Exec(ctx, `SELECT outbox.emit('bulk', $1, $2::text, '{}'::jsonb)`, fmt.Sprint(i), big); err != nil {
			t.Fatal(err)
		}
	}
	const budget = 16 << 20
	kafkaAddr, httpAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, testbin.Relay(t), nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", httpAddr,
		"--kafka-addr", kafkaAddr, "--partitions", "1", "--poll-interval", "100ms", "--listener-max-inflight-bytes", fmt.Sprint(budget))
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	// A steady trickle of events, and a consumer of them.
	var inserted atomic.Int64
	writerCtx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	var writerErr error
	stopWriting := func() error { stopWriter(); <-writerDone; return writerErr }
	defer stopWriting()
	go func() {
		defer close(writerDone)
		for writerCtx.Err() == nil {
			if _, err := conn.Exec(writerCtx, `SELECT outbox.emit('ticks', $1, 'tick', '{}'::jsonb)`, fmt.Sprint(inserted.Load())); err != nil {
				if writerCtx.Err() == nil {
					writerErr = err
				}
				return
			}
			inserted.Add(1)
			time.Sleep(20 * time.Millisecond) // load pacing: one insert every 20 ms
		}
	}()
	var consumed atomic.Int64
	cl := kafkaClient(t, kafkaAddr, kgo.ConsumeTopics("ticks"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	go func() {
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			consumed.Add(int64(fs.NumRecords()))
		}
	}()

	type counts struct{ inserted, published, consumed int64 }
	snap := func() counts {
		return counts{inserted.Load(), int64(e2e.Metric(t, httpAddr, `relay_events_published_total{topic="ticks"}`)), consumed.Load()}
	}
	var peakInflight float64
	var sampling sync.WaitGroup
	stopSampling := make(chan struct{})
	defer func() {
		select {
		case <-stopSampling:
		default:
			close(stopSampling)
		}
		sampling.Wait()
	}()
	sampling.Go(func() {
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(100 * time.Millisecond):
				peakInflight = max(peakInflight, e2e.Metric(t, httpAddr, "relay_listener_inflight_bytes"))
			}
		}
	})

	time.Sleep(4 * time.Second) // deliberate pause: 4 s of the baseline before the flood
	before := snap()
	rssBefore, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}

	floodCtx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	var flood sync.WaitGroup
	var conns []net.Conn
	var connsMu sync.Mutex
	dial := func() net.Conn {
		nc, err := net.Dial("tcp", kafkaAddr)
		if err != nil {
			return nil
		}
		connsMu.Lock()
		conns = append(conns, nc)
		connsMu.Unlock()
		return nc
	}
	for range 150 {
		dial()
	}
	var framesSent atomic.Int64
	frame := binary.BigEndian.AppendUint32(nil, 4<<20)
	frame = binary.BigEndian.AppendUint16(frame, uint16(kmsg.Produce))
	frame = binary.BigEndian.AppendUint16(frame, 9)
	frame = append(frame, bytes.Repeat([]byte{0xff}, 4<<20-4)...) // read whole, then fails to decode
	for range 6 {
		flood.Go(func() {
			for floodCtx.Err() == nil {
				nc := dial()
				if nc == nil {
					continue
				}
				if _, err := nc.Write(frame); err == nil {
					framesSent.Add(1)
				}
				io.Copy(io.Discard, nc)
				nc.Close()
			}
		})
	}
	for range 8 {
		nc := dial()
		if nc == nil {
			continue
		}
		for i := range 8 {
			req := kmsg.NewPtrFetchRequest()
			req.Version, req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = 11, -1, 0, 50<<20
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = "bulk"
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.FetchOffset, rp.PartitionMaxBytes, rp.LogStartOffset = 0, 50<<20, -1
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			nc.Write(kafkaFrame(int32(i+1), req))
		}
	}
	time.Sleep(10 * time.Second) // deliberate pause: 10 s of the flood
	during := snap()
	stopFlood()
	connsMu.Lock()
	for _, nc := range conns {
		nc.Close()
	}
	connsMu.Unlock()
	flood.Wait()
	rssPeak, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}

	time.Sleep(4 * time.Second) // deliberate pause: 4 s after the flood
	after := snap()
	if err := stopWriting(); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	close(stopSampling)
	sampling.Wait()

	phase := func(name string, from, to counts) {
		ins, pub, con := to.inserted-from.inserted, to.published-from.published, to.consumed-from.consumed
		t.Logf("%s: %d events inserted, %d published, %d consumed through the listener", name, ins, pub, con)
		if pub == 0 {
			t.Errorf("%s: the relay published no events", name)
		}
	}
	// The consumer shares the budget with the flood and may wait out
	// the slow readers; it must have everything soon after.
	for deadline := time.Now().Add(time.Minute); consumed.Load() < inserted.Load() && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // condition poll
	}
	if c, i := consumed.Load(), inserted.Load(); c < i {
		t.Errorf("the consumer read %d of %d events a minute after the flood", c, i)
	}
	phase("before the flood (4s)", counts{}, before)
	phase("during the flood (10s)", before, during)
	phase("after the flood (4s)", during, after)
	t.Logf("flood: %d frames of 4 MiB sent; peak in-flight %.0f bytes of a %d budget; peak RSS %d MiB before the flood, %d MiB after it",
		framesSent.Load(), peakInflight, budget, rssBefore>>20, rssPeak>>20)
	if framesSent.Load() < 4 {
		t.Errorf("only %d large frames went out: the flood did not happen", framesSent.Load())
	}
	if peakInflight > budget {
		t.Errorf("peak in-flight bytes %.0f over the %d budget", peakInflight, budget)
	}
	// The collector (GOGC=400) lets the frames' garbage grow the heap up
	// to the soft limit and then holds it there; the limit is soft, so
	// allow it a tenth.
	if rssPeak > 192<<20*11/10 {
		t.Errorf("peak RSS %d MiB over the 192 MiB soft memory limit and a tenth", rssPeak>>20)
	}
}
