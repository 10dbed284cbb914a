package protocol

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/procstat"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// envFetchSessionSlots sets the broker process's FetchSessionCacheSlots
// (runBrokerProcess); -1 turns sessions off.
const envFetchSessionSlots = "RELAY_PROTOCOL_TEST_FETCH_SESSION_SLOTS"

// fetchCounter counts the bytes of Fetch requests and responses a client
// writes and reads (kgo hooks).
type fetchCounter struct{ wrote, read, requests atomic.Int64 }

func (c *fetchCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, n int, _, _ time.Duration, _ error) {
	if key == 1 {
		c.wrote.Add(int64(n))
		c.requests.Add(1)
	}
}

func (c *fetchCounter) OnBrokerRead(_ kgo.BrokerMetadata, key int16, n int, _, _ time.Duration, _ error) {
	if key == 1 {
		c.read.Add(int64(n))
	}
}

// BenchmarkIdleConsumerFetchSessions measures what an idle franz-go
// consumer of 1,000 partitions costs, with fetch sessions off (every fetch
// lists and answers every partition) and on (incremental fetches): fetch
// request and response bytes per second on the client, and the broker
// process's CPU seconds per second (a child process, the test binary in
// its broker role, so the client's CPU is not counted). The two modes
// alternate, rounds times, each from a fresh broker; run with
//
//	go test -run '^$' -bench IdleConsumerFetchSessions -benchtime 1x ./internal/broker/protocol/
//
// RELAY_BENCH_WINDOW (default 30s) is each measurement's length;
// RELAY_BENCH_FETCH_MAX_WAIT the consumer's fetch max wait (default
// franz-go's, 5 s; shorter means more idle fetches per second).
func BenchmarkIdleConsumerFetchSessions(b *testing.B) {
	window := envDuration(b, "RELAY_BENCH_WINDOW", 30*time.Second)
	maxWait := envDuration(b, "RELAY_BENCH_FETCH_MAX_WAIT", 5*time.Second)
	const rounds, partitions = 2, 1000
	type result struct{ reqBps, respBps, cpu, fetches float64 }
	sum := map[string]*result{"off": {}, "on": {}}
	for round := range rounds {
		for _, mode := range []string{"off", "on"} {
			r := measureIdleConsumer(b, mode == "on", partitions, window, maxWait)
			b.Logf("round %d sessions %s: fetch requests %.0f B/s, responses %.0f B/s, %.2f fetches/s, broker CPU %.4f s/s", round+1, mode, r.reqBps, r.respBps, r.fetches, r.cpu)
			s := sum[mode]
			s.reqBps, s.respBps, s.cpu, s.fetches = s.reqBps+r.reqBps/rounds, s.respBps+r.respBps/rounds, s.cpu+r.cpu/rounds, s.fetches+r.fetches/rounds
		}
	}
	off, on := sum["off"], sum["on"]
	b.ReportMetric(off.reqBps, "off-req-B/s")
	b.ReportMetric(on.reqBps, "on-req-B/s")
	b.ReportMetric(off.respBps, "off-resp-B/s")
	b.ReportMetric(on.respBps, "on-resp-B/s")
	b.ReportMetric(off.cpu, "off-cpu-s/s")
	b.ReportMetric(on.cpu, "on-cpu-s/s")
	b.ReportMetric(on.reqBps/off.reqBps, "req-bytes-on/off")
	b.ReportMetric(on.cpu/off.cpu, "cpu-on/off")
}

func measureIdleConsumer(b *testing.B, sessions bool, partitions int32, window, maxWait time.Duration) (r struct{ reqBps, respBps, cpu, fetches float64 }) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), window+2*time.Minute)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	slots := "-1"
	if sessions {
		slots = "1000"
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envTxnRole+"=broker", envTxnAddr+"="+addr, envTxnDir+"="+b.TempDir(), envFetchSessionSlots+"="+slots)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	admin := newKgo(b, addr)
	defer admin.Close()
	for admin.Ping(ctx) != nil {
		if ctx.Err() != nil {
			b.Fatal("the broker process did not come up")
		}
		time.Sleep(50 * time.Millisecond) // condition poll: the broker is another process
	}
	if _, err := kadm.NewClient(admin).CreateTopic(ctx, partitions, 1, nil, "idle"); err != nil {
		b.Fatalf("create topic: %v", err)
	}
	counter := &fetchCounter{}
	cons := newKgo(b, addr, kgo.ConsumeTopics("idle"), kgo.FetchMaxWait(maxWait), kgo.WithHooks(counter))
	defer cons.Close()
	pollCtx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pollCtx.Err() == nil {
			cons.PollFetches(pollCtx)
		}
	}()
	// Warm up: the first fetches (full ones) and metadata are not counted.
	time.Sleep(maxWait + 6*time.Second) // benchmark: warm-up
	pid := cmd.Process.Pid
	cpu0, err := procstat.CPUSeconds(pid)
	if err != nil {
		b.Fatal(err)
	}
	w0, r0, n0, t0 := counter.wrote.Load(), counter.read.Load(), counter.requests.Load(), time.Now()
	time.Sleep(window) // benchmark: the measurement window
	cpu1, err := procstat.CPUSeconds(pid)
	if err != nil {
		b.Fatal(err)
	}
	secs := time.Since(t0).Seconds()
	r.reqBps = float64(counter.wrote.Load()-w0) / secs
	r.respBps = float64(counter.read.Load()-r0) / secs
	r.fetches = float64(counter.requests.Load()-n0) / secs
	r.cpu = (cpu1 - cpu0) / secs
	stopPoll()
	<-polled
	return r
}

// envDuration is the duration the environment variable name holds (as
// time.ParseDuration reads it), def when it is unset or empty; b fails on
// one that does not parse.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// fetchSessionSlotsFromEnv is the broker process's FetchSessionCacheSlots.
func fetchSessionSlotsFromEnv() int {
	n, err := strconv.Atoi(os.Getenv(envFetchSessionSlots))
	if err != nil {
		return 0
	}
	return n
}
