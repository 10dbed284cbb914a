package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/relay"
)

// benchTopic is the topic every bench event is routed to.
const benchTopic = "bench"

// startKfake starts an in-process, in-memory Kafka-protocol cluster of one
// broker (franz-go's kfake) for a --sink kafka run given no brokers, and
// returns its address.
func startKfake() (*kfake.Cluster, string, error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, "", fmt.Errorf("starting the in-process Kafka cluster: %w", err)
	}
	return c, c.ListenAddrs()[0], nil
}

// brokersArg returns the value of --kafka-brokers in args.
func brokersArg(args []string) []string {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--kafka-brokers=")
		if !ok && a == "--kafka-brokers" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			return strings.Split(v, ",")
		}
	}
	return nil
}

// arrivals consumes the bench topic while a live run writes and notes when
// each event arrived in the cluster, by its number (the payload's digits).
type arrivals struct {
	cl   *kgo.Client
	done chan struct{}

	mu      sync.Mutex
	arrived map[int]time.Time
	created map[int]time.Time
	// records counts every record read, repeats included.
	records int
	cond    *sync.Cond
}

// consume creates the bench topics when missing and starts reading them
// from their current end, as a latency-minded consumer does: a fetch is
// answered as soon as a record arrives (or after 100 ms).
func consume(ctx context.Context, brokers, topics []string, partitions int32) (*arrivals, error) {
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, fmt.Errorf("the arrival consumer: %w", err)
	}
	defer admin.Close()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(admin)
	if partitions <= 0 {
		partitions = -1
	}
	created, err := adm.CreateTopics(actx, partitions, -1, nil, topics...)
	if err != nil {
		return nil, fmt.Errorf("the arrival consumer: creating the bench topics: %w", err)
	}
	for _, c := range created {
		if c.Err != nil && !errors.Is(c.Err, kerr.TopicAlreadyExists) {
			return nil, fmt.Errorf("the arrival consumer: creating topic %s: %w", c.Topic, c.Err)
		}
	}
	ends, err := adm.ListEndOffsets(actx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("the arrival consumer: the end of the bench topics: %w", err)
	}
	from := map[string]map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if from[o.Topic] == nil {
			from[o.Topic] = map[int32]kgo.Offset{}
		}
		from[o.Topic][o.Partition] = kgo.NewOffset().At(o.Offset)
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(from))
	if err != nil {
		return nil, fmt.Errorf("the arrival consumer: %w", err)
	}
	a := &arrivals{cl: cl, done: make(chan struct{}), arrived: map[int]time.Time{}, created: map[int]time.Time{}}
	a.cond = sync.NewCond(&a.mu)
	go a.run()
	return a, nil
}

func (a *arrivals) run() {
	defer close(a.done)
	for {
		fs := a.cl.PollFetches(context.Background())
		now := time.Now()
		if fs.IsClientClosed() {
			return
		}
		a.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			a.records++
			n, err := strconv.Atoi(strings.TrimLeft(string(r.Value), "x"))
			if err != nil {
				return
			}
			if _, seen := a.arrived[n]; seen {
				return
			}
			a.arrived[n] = now
			for _, h := range r.Headers {
				if h.Key == relay.HeaderCreatedAt {
					if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
						a.created[n] = t
					}
				}
			}
		})
		a.cond.Broadcast()
		a.mu.Unlock()
	}
}

// waitFor waits until n distinct events arrived or timeout passed.
func (a *arrivals) waitFor(n int, timeout time.Duration) int {
	t := time.AfterFunc(timeout, func() {
		a.mu.Lock()
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	defer t.Stop()
	deadline := time.Now().Add(timeout)
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.arrived) < n && time.Now().Before(deadline) {
		a.cond.Wait()
	}
	return len(a.arrived)
}

func (a *arrivals) close() {
	a.cl.Close()
	<-a.done
}

// latencies returns each arrived event's latency from its commit when
// commits holds its transaction's commit time, else from its created_at
// (the INSERT).
func (a *arrivals) latencies(commits map[int]time.Time) (from string, lat []time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	from = "insert"
	if len(commits) > 0 {
		from = "commit"
	}
	for n, at := range a.arrived {
		start, ok := commits[n]
		if from == "insert" {
			start, ok = a.created[n]
		}
		if ok {
			lat = append(lat, at.Sub(start))
		}
	}
	slices.Sort(lat)
	return from, lat
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// commitTimes maps events to their transaction's commit time, read from
// PostgreSQL's commit timestamps (track_commit_timestamp); nil when the
// server does not keep them.
func (e *env) commitTimes(ctx context.Context, xids map[int]string) (map[int]time.Time, error) {
	var on string
	if err := e.pool.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&on); err != nil {
		return nil, err
	}
	if on != "on" || len(xids) == 0 {
		return nil, nil
	}
	distinct := map[string]struct{}{}
	for _, x := range xids {
		distinct[x] = struct{}{}
	}
	list := make([]string, 0, len(distinct))
	for x := range distinct {
		list = append(list, x)
	}
	rows, err := e.pool.Query(ctx, `SELECT x, pg_xact_commit_timestamp((x::xid8::text::bigint % 4294967296)::text::xid) FROM unnest($1::text[]) AS x`, list)
	if err != nil {
		return nil, fmt.Errorf("reading commit timestamps: %w", err)
	}
	at := map[string]time.Time{}
	for rows.Next() {
		var x string
		var t *time.Time
		if err := rows.Scan(&x, &t); err != nil {
			rows.Close()
			return nil, err
		}
		if t != nil {
			at[x] = *t
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make(map[int]time.Time, len(xids))
	for n, x := range xids {
		if t, ok := at[x]; ok {
			out[n] = t
		}
	}
	return out, nil
}

// measureArrival fills in the latencies to arrival in the cluster.
func (r *Result) measureArrival(from string, lat []time.Duration) {
	r.ArrivalFrom = from
	r.Arrived = len(lat)
	if len(lat) == 0 {
		return
	}
	r.ArrivalP50 = percentile(lat, 0.5)
	r.ArrivalP90 = percentile(lat, 0.9)
	r.ArrivalP99 = percentile(lat, 0.99)
	r.ArrivalMax = lat[len(lat)-1]
}

// readBack reads n records from topics through the Kafka listener at
// addr, from their start: with consumers 1 one client assigned every
// partition, with more a consumer group of that many members, all in
// this process. The rate runs from the consumers' start to the nth
// record, so it includes the time to the first record (metadata, the
// group's join), which FirstRecordSeconds reports.
//
// connected, when not nil, runs after the last record while the consumers
// are still connected and polling (a group stays joined), before they
// close.
func readBack(ctx context.Context, addr string, topics []string, n, consumers int, connected func()) (*ConsumeResult, error) {
	res := &ConsumeResult{Consumers: consumers, Group: consumers > 1}
	opts := []kgo.Opt{kgo.SeedBrokers(addr), kgo.ConsumeTopics(topics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if consumers > 1 {
		opts = append(opts, kgo.ConsumerGroup(fmt.Sprintf("relay-bench-%d", time.Now().UnixNano())), kgo.DisableAutoCommit())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		first time.Time
		last  time.Time
		wg    sync.WaitGroup
		errs  []error
	)
	start := time.Now()
	done := make(chan struct{})
	var once sync.Once
	for i := 0; i < consumers; i++ {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("the read-back consumer: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for {
				fs := cl.PollFetches(ctx)
				if ctx.Err() != nil {
					return
				}
				now := time.Now()
				fs.EachError(func(t string, p int32, err error) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s/%d: %w", t, p, err))
					mu.Unlock()
				})
				mu.Lock()
				fs.EachRecord(func(r *kgo.Record) {
					if first.IsZero() {
						first = now
					}
					res.Records++
					res.Bytes += int64(len(r.Key) + len(r.Value))
				})
				if res.Records >= n {
					last = now
					once.Do(func() { close(done) })
				}
				bad := len(errs) > 0
				mu.Unlock()
				if bad {
					once.Do(func() { close(done) })
					return
				}
			}
		}()
	}
	select {
	case <-done:
		mu.Lock()
		ok := len(errs) == 0
		mu.Unlock()
		if ok && connected != nil {
			connected()
		}
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	if len(errs) > 0 {
		return res, fmt.Errorf("reading back: %w", errors.Join(errs...))
	}
	if res.Records < n {
		return res, fmt.Errorf("read back %d of %d records", res.Records, n)
	}
	res.Seconds = last.Sub(start).Seconds()
	res.FirstRecordSeconds = first.Sub(start).Seconds()
	res.Rate = float64(res.Records) / res.Seconds
	res.MiBPerSec = float64(res.Bytes) / (1 << 20) / res.Seconds
	return res, nil
}
