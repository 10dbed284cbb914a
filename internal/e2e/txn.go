package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxnJob is a consume-transform-produce job with Kafka transactions, the
// kind of stream processor the embedded broker's transactions serve: it
// reads Source, writes each record (key kept, value prefixed with "b:") to
// Sink, and commits the group's Source offsets in the same transaction,
// through franz-go's GroupTransactSession. Each transaction holds a few
// records and stays open a moment, so that kills land inside one.
type TxnJob struct {
	Addr            string
	Source, Sink    string
	Group           string
	TransactionalID string
	// MaxRecords is the most records per transaction (default 20).
	MaxRecords int
	// SessionTimeout is the group session timeout (default 1.5 s; a
	// broker with Kafka's default minimum, such as `relay run`, needs 6 s).
	SessionTimeout time.Duration
	// Logf receives the job's errors (nil: dropped).
	Logf func(format string, args ...any)
}

// Run runs the job until ctx ends, starting a new session (a new producer
// epoch, which fences the old one) whenever one fails. It returns ctx's
// error.
func (j TxnJob) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := j.session(ctx); err != nil && ctx.Err() == nil {
			j.logf("transactional session ended: %v; starting a new one", err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	return ctx.Err()
}

func (j TxnJob) logf(format string, args ...any) {
	if j.Logf != nil {
		j.Logf(format, args...)
	}
}

func (j TxnJob) session(ctx context.Context) error {
	if j.MaxRecords <= 0 {
		j.MaxRecords = 20
	}
	session := j.SessionTimeout
	if session <= 0 {
		session = 1500 * time.Millisecond
	}
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(j.Addr),
		kgo.TransactionalID(j.TransactionalID),
		kgo.TransactionTimeout(5*time.Second),
		kgo.ConsumerGroup(j.Group),
		kgo.ConsumeTopics(j.Source),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(session/5),
		kgo.RebalanceTimeout(2*session),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer sess.Close()
	for {
		fs := sess.PollRecords(ctx, max(j.MaxRecords, 1))
		if fs.IsClientClosed() || ctx.Err() != nil {
			return ctx.Err()
		}
		fs.EachError(func(topic string, p int32, err error) { j.logf("fetch %s/%d: %v", topic, p, err) })
		if fs.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		var failed atomic.Bool
		fs.EachRecord(func(r *kgo.Record) {
			out := &kgo.Record{Topic: j.Sink, Key: r.Key, Value: append([]byte("b:"), r.Value...)}
			sess.Produce(ctx, out, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(true)
					j.logf("produce: %v", err)
				}
			})
		})
		time.Sleep(50 * time.Millisecond)
		if _, err := sess.End(ctx, kgo.TransactionEndTry(!failed.Load())); err != nil {
			return fmt.Errorf("end: %w", err)
		}
	}
}

// ReadIsolated reads every record of topic from the start, as a
// read_committed or a read_uncommitted consumer, until three polls in a
// row bring nothing, and returns the values.
func ReadIsolated(ctx context.Context, addr, topic string, committed bool) ([]string, error) {
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(iso), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []string
	for idle := 0; idle < 3; {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return out, err
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) {
			if pctx.Err() == nil || err != context.DeadlineExceeded {
				ferr = fmt.Errorf("fetch %s/%d: %w", topic, p, err)
			}
		})
		if ferr != nil {
			return out, ferr
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, string(r.Value))
			n++
		})
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	return out, nil
}

// CheckTransformed compares the job's output, as a read_committed reader
// of Sink saw it, with its input: each input value v must be there as
// "b:"+v exactly as often as it is in the input, and nothing else. It
// returns a description of the differences, empty when there are none.
func CheckTransformed(input, output []string) string {
	want := map[string]int{}
	for _, v := range input {
		want["b:"+v]++
	}
	got := map[string]int{}
	for _, v := range output {
		got[v]++
	}
	var missing, dup, extra int
	var example string
	for v, n := range want {
		switch g := got[v]; {
		case g < n:
			missing += n - g
			example = fmt.Sprintf("%s %d times, want %d", v, g, n)
		case g > n:
			dup += g - n
			example = fmt.Sprintf("%s %d times, want %d", v, g, n)
		}
	}
	for v, g := range got {
		if want[v] == 0 {
			extra += g
			example = fmt.Sprintf("unexpected %s", v)
		}
	}
	if missing == 0 && dup == 0 && extra == 0 {
		return ""
	}
	return fmt.Sprintf("%d input records, %d output: %d missing, %d duplicated, %d unexpected (e.g. %s)", len(input), len(output), missing, dup, extra, example)
}
