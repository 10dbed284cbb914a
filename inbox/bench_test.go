package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/inbox"
)

// BenchmarkInbox drains 5,000 records of 4 partitions through the inbox
// (id insert and handler in one transaction per record or per batch,
// offsets committed after) and through the bare handler (the same insert,
// one transaction per record, one partition after another, offsets
// committed after each poll, no deduplication), each time in a new group:
// records/s for each, in the same process. The like-for-like ratio is
// inbox/batch=1/partitions-side-by-side=1 over bare.
//
//	go test -run '^$' -bench BenchmarkInbox -benchtime 3x ./inbox/
func BenchmarkInbox(b *testing.B) {
	f := setup(b)
	const n = 5000
	f.createTopic("bench", 4)
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Topic: "bench", Partition: int32(i % 4), Key: []byte(fmt.Sprint(i % 100)), Value: []byte("v"),
			Headers: []kgo.RecordHeader{{Key: inbox.EventIDHeader, Value: []byte(fmt.Sprint("e", i))}}})
	}
	if err := f.cl.ProduceSync(f.ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (key, value) VALUES ($1, $2)`, string(r.Key), string(r.Value))
		return err
	}
	run := 0
	b.Run("bare", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			run++
			start := time.Now()
			f.bare(fmt.Sprint("bare-", run), n, handler)
			b.ReportMetric(n/time.Since(start).Seconds(), "records/s")
		}
	})
	for _, shape := range []struct{ batch, concurrency int }{{1, 1}, {1, 8}, {20, 8}} {
		batch := shape.batch
		b.Run(fmt.Sprintf("inbox/batch=%d/partitions-side-by-side=%d", batch, shape.concurrency), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				run++
				group := fmt.Sprint("inbox-", run)
				c, err := inbox.New(inbox.Config{DB: f.db, Group: group, Topics: []string{"bench"}, Handler: handler, BatchSize: batch, Concurrency: shape.concurrency,
					PruneInterval: -1, Kafka: []kgo.Opt{kgo.SeedBrokers(f.brokers), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				ctx, cancel := context.WithCancel(f.ctx)
				done := make(chan error, 1)
				go func() { done <- c.Run(ctx) }()
				for f.processed(group) < n {
					time.Sleep(5 * time.Millisecond) // a condition poll
				}
				elapsed := time.Since(start)
				cancel()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(n/elapsed.Seconds(), "records/s")
			}
		})
	}
}
